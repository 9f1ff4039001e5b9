"""Coil's model suite: public model definitions (timm, torchvision, transformers) built with
random weights and no downloads (:mod:`models.zoo`), and the checks that run one through a
``torch.compile`` backend against eager (:mod:`models.check`).

Used by ``tests/test_models.py`` at small sizes on the CPU and by ``bench/models.py`` at real
sizes; :mod:`models.imports` makes ``torchvision`` (and so ``timm``) importable on a CPU-only
torch wheel.
"""
