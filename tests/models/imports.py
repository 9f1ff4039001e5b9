"""Importing the optional model libraries (torchvision, timm, transformers) without surprises.

The torchvision wheel on PyPI is a CUDA build. Next to a CPU-only torch its C++ extension does
not load, and ``import torchvision`` then fails at import time with "operator torchvision::nms
does not exist" (its Python registers fake kernels for ops whose schemas the extension would
have defined). The models need none of those ops, so :func:`import_torchvision` defines the two
schemas the import touches and imports again. Nothing is defined where the plain import works
(a matching torch/torchvision pair, e.g. on the GPU machine).
"""
from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType

import torch

log = logging.getLogger(__name__)

#: The ``torch.library.Library`` holding the schemas; it must stay alive (dropping the last
#: reference removes the definitions).
_SHIM_LIBRARY: torch.library.Library | None = None

_SHIM_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def import_torchvision() -> ModuleType | None:
    """``torchvision``, or None when it is not installed.

    Defines the ``torchvision::nms``/``qnms`` schemas first only when the plain import fails
    for want of them; any other import error propagates.
    """
    global _SHIM_LIBRARY
    try:
        return importlib.import_module("torchvision")
    except ModuleNotFoundError as exc:
        if exc.name == "torchvision":
            return None
        raise
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc) or _SHIM_LIBRARY is not None:
            raise
    # The failed import left half-initialised modules behind; they must go before the retry.
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    log.info("torchvision's C++ ops did not load (CPU torch with a CUDA torchvision wheel?); "
             "defining the nms/qnms schemas so that the models import")
    lib = torch.library.Library("torchvision", "DEF")
    for schema in _SHIM_SCHEMAS:
        lib.define(schema)
    _SHIM_LIBRARY = lib
    return importlib.import_module("torchvision")


def import_optional(package: str) -> ModuleType | None:
    """``package`` (``torchvision``, ``timm``, ``transformers``), or None when not installed.

    ``timm`` and ``transformers`` import torchvision when it is installed, so the torchvision
    shim is applied before importing any of them.
    """
    torchvision = import_torchvision()
    if package == "torchvision":
        return torchvision
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name == package:
            return None
        raise
