"""The build budget of a graph's first call: which of its kernels are tuned.

Tuning a kernel builds every candidate configuration (:mod:`.configs`) and times each on the
first launch; on a cold cache each build is a ``triton.compile`` of 0.1-0.5 s. A graph of a
few kernels builds all their candidates in one round of the compile pool, so tuning them
costs no wall time. A model's graph has tens to hundreds of distinct kernels, and building
two to four candidates of each was most of its first call on the H200 (98-275 builds, 5-6.6
s of the build phase). So a graph tunes its largest kernels only, within :data:`EXTRA_ROUNDS`
rounds of the builders beyond one build per kernel; each of the others builds its first
candidate, the one that wins most often for its shape, and launches it untuned.

A kernel with a tuned winner in the cache needs one build and is not counted. The choice
depends only on the graph and the cache, never on timing, so a second process with the same
cache makes the same one. ``tuning="all"`` (``COIL_CUDA_TRITON_TUNING=all``) tunes every
kernel, as before the budget."""
from __future__ import annotations

from typing import Protocol, Sequence

import sympy

#: Rounds of the builders (compile workers and the compiling thread) that the candidates
#: beyond each kernel's first may take, per graph.
EXTRA_ROUNDS = 2


class Tunable(Protocol):
    """What the budget reads of a launcher (:class:`.launch.Launcher`)."""

    src: object

    def to_build(self) -> list: ...


def work(launcher: Tunable) -> int:
    """Elements a launch touches (kept points times reduced ones): the larger, the more its
    configuration matters."""
    src = launcher.src
    total = sympy.sympify(getattr(src, "xnumel", 1)) * sympy.sympify(getattr(src, "rnumel", 1))
    return int(total) if total.is_number else 0


def tuned(launchers: Sequence[Tunable], builders: int, mode: str = "auto") -> list[Tunable]:
    """The launchers of ``launchers`` that build and time all their candidates: those with a
    choice to make (more than one build ahead of them; templates always, since their
    measurement against the library is what decides the kernel), the largest first while the
    extra builds fit in ``EXTRA_ROUNDS * builders``; every one with ``mode="all"``."""
    open_ = [la for la in launchers if len(la.to_build()) > 1]
    if mode == "all":
        return open_
    allowance = EXTRA_ROUNDS * max(1, builders)
    chosen = [la for la in open_ if getattr(la.src, "shape", None) == "template"]
    templates = {id(la) for la in chosen}
    for la in sorted((la for la in open_ if id(la) not in templates), key=work, reverse=True):
        extra = len(la.to_build()) - 1
        if extra <= allowance:
            chosen.append(la)
            allowance -= extra
    return chosen
