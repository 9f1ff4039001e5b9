"""Iterate a kernel in the memory order of what it writes.

A node's kept dims arrive in logical order (N, C, H, W). When the buffer it writes is laid
out otherwise — channels-last, a transposed result — a plugin that walks ``x0..`` in that
order writes with a stride: on a GPU every store of a warp lands in its own memory sector
(an NHWC batch-norm + ReLU ran 14x slower than in NCHW on the H200), and on a CPU the inner
loop cannot be vectorised. This pass permutes a kernel's kept dims so that the last one is
the fastest-moving dim of its stores. Every point of a kept dim is still visited exactly
once, so the permutation never changes what a kernel computes; only which program or
iteration handles which point.

Device-neutral: it looks only at the stores' index expressions. It leaves a kernel alone
when its stores disagree on the order, when a stride is not a plain integer (dynamic
shapes), or when a kept dim appears inside a non-linear index (a floor or modulo)."""
from __future__ import annotations

from typing import Sequence

import sympy

from . import ir
from .kernel import KernelNode

Expr = sympy.Expr


def memory_order(x_ranges: Sequence[Expr], knodes: Sequence[KernelNode],
                 outputs: set[str]) -> tuple[int, ...] | None:
    """The permutation ``p`` (new dim ``j`` is old dim ``p[j]``) that makes the stores of
    ``outputs`` walk memory in order, or None when the logical order is kept."""
    n = len(x_ranges)
    if n < 2:
        return None
    xs = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(n)]
    orders = set()
    for kn in knodes:
        if not set(kn.stores) & outputs:
            continue
        strides = [_stride(kn.store_index, v) for v in xs]
        if any(s is None for s in strides):
            return None
        # size-1 dims do not move: put them outermost, then the largest stride first
        key = [(0, 0, i) if x_ranges[i] == 1 else (1, -int(strides[i]), i) for i in range(n)]  # type: ignore[arg-type]
        orders.add(tuple(sorted(range(n), key=lambda i: key[i])))
    if len(orders) != 1:
        return None
    perm = orders.pop()
    moved = [i for i in perm if x_ranges[i] != 1]
    if moved == sorted(moved):  # only size-1 dims would move: nothing to gain
        return None
    return perm


def permute(perm: Sequence[int], x_ranges: Sequence[Expr],
            knodes: Sequence[KernelNode]) -> tuple[tuple[Expr, ...], list[KernelNode]]:
    """``x_ranges`` and ``knodes`` with the kept dims in the order ``perm``."""
    mapping = {sympy.Symbol(f"x{old}", integer=True, nonnegative=True):
               sympy.Symbol(f"x{new}", integer=True, nonnegative=True) for new, old in enumerate(perm)}
    ranges = tuple(x_ranges[old] for old in perm)
    out = [KernelNode(kn.node, kn.level, ir.reindex_value(kn.body, mapping),
                      sympy.sympify(kn.store_index).xreplace(mapping), kn.stores) for kn in knodes]
    return ranges, out


def _stride(index: Expr, var: sympy.Symbol) -> int | None:
    """The integer coefficient of ``var`` in ``index`` (0 when absent), or None when ``var``
    appears other than as ``c * var`` with an integer ``c``."""
    index = sympy.sympify(index)
    if var not in index.free_symbols:
        return 0
    total = 0
    for term in sympy.Add.make_args(index):
        if var not in term.free_symbols:
            continue
        coeff, rest = term.as_independent(var, as_Add=False)
        if rest != var or not coeff.is_Integer:
            return None
        total += int(coeff)
    return total
