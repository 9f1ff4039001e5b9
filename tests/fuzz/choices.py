"""Drawing helpers shared by the fuzzer's op families (`tests/fuzz/ops_compute.py`,
`tests/fuzz/ops_data.py`): pick a value of the program under construction, a dim, a scalar
literal, a broadcast partner."""
from __future__ import annotations

import math
from typing import Callable

import torch
from hypothesis import strategies as st

from .programs import Scope

DrawFn = Callable[[st.SearchStrategy], object]
Pred = Callable[[torch.Tensor], bool]


def pick(draw: DrawFn, scope: Scope, pred: Pred | None = None, include_inputs: bool = True,
         recent: bool = False) -> str | None:
    """A value satisfying ``pred``; with ``recent`` (a step's main operand), half the time the
    newest one, so programs form chains (kernel -> fallback -> kernel) more than fans."""
    names = scope.names(pred, include_inputs)
    if not names:
        return None
    if recent and scope.rng.random() < 0.5:
        return names[0]
    return draw(st.sampled_from(names))


def dim_of(draw: DrawFn, t: torch.Tensor) -> int:
    return draw(st.integers(0, t.dim() - 1))


def scalar(draw: DrawFn) -> str:
    return draw(st.sampled_from(["2.0", "0.5", "-1.5", "3.0"]))


def broadcasts_to(src: torch.Tensor, shape: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(src.shape, shape) == shape
    except RuntimeError:
        return False


def broadcasts_with(src: torch.Tensor, other: torch.Tensor) -> bool:
    try:
        return math.prod(torch.broadcast_shapes(src.shape, other.shape)) <= 2048
    except RuntimeError:
        return False


def dims_of(draw: DrawFn, t: torch.Tensor) -> tuple[int, ...]:
    return tuple(sorted(draw(st.sets(st.integers(0, t.dim() - 1), min_size=1))))


def partner(draw: DrawFn, scope: Scope, x: str) -> str:
    """Another value that broadcasts with ``x`` (or ``x`` itself)."""
    t = scope.tensor(x)
    return pick(draw, scope, lambda o: broadcasts_with(o, t)) or x


def overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (expanded, or unfolded with overlapping
    windows): in-place writes into such values are refused by eager or by AOTAutograd."""
    extent = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride < extent:
            return True
        extent += stride * (size - 1)
    return False
