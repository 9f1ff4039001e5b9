"""Tiled transposes. A pointwise kernel that reads one tensor along rows and another along
columns (``x + y.t()``) walks the second with a stride of a whole row per element: every
load touches a new cache line, and by the time the next column comes round the lines are
gone. Looping over square tiles of the two dims instead keeps a tile's lines of the strided
tensor in L1 while its rows are walked, so each line is fetched once. Measured on
``x + y.t()`` of 1536x4096 float32, one thread: 5x faster than the untiled loop nest."""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from coil.sdk import Kernel, Load, walk

#: Tile side: 32 float rows of a strided tensor are 32 cache lines each way (a tile of each
#: tensor 4 KiB, in L1 beside its neighbour's). A full tile runs loops of constant length and
#: its transposed copy whole register blocks (``coil_transpose.h``). ``x + y.t()`` of
#: 1536x4096 float32 in one process, Inductor beside it, 5 processes (session 29, AVX-512):
#: tiles of 32 4.4-6.4 ms against Inductor's 5.6-6.1 with one thread, 2.1-3.0 against
#: 2.8-3.0 with two; 64 and 16 were level or slower (before full tiles ran constant-length
#: loops, tiles of 16 took 9.5 ms).
TILE = 32
#: Dims shorter than this are not tiled (a short row fits the cache either way).
SHORT = 32


@dataclass(frozen=True)
class Tiles:
    """Tile the kept dims ``dim`` (some outer dim) and the innermost one."""

    dim: int


def transpose_tiles(k: Kernel, tile: int = TILE) -> Tiles | None:
    """Where some memory access of ``k`` is contiguous along an outer kept dim and strided
    along the innermost one (a transposed read or write), the outer dim to tile with the
    innermost; else None (also where either dim is known to be shorter than :data:`SHORT` or
    ``tile``, or ``tile`` is 0)."""
    if len(k.x_vars) < 2 or tile <= 0:
        return None
    last = k.x_vars[-1]
    if _short(k.x_ranges[-1], tile):
        return None
    loop_vars = {*k.x_vars, *k.r_vars}
    for e in _accesses(k):
        if _unit(e, last):
            continue
        along_last = stride_along(e, last, loop_vars)
        if along_last is None or along_last == 0:
            continue  # broadcast along the innermost dim (a bias per row): nothing strided
        for d, v in enumerate(k.x_vars[:-1]):
            if _unit(e, v) and not _short(k.x_ranges[d], tile):
                return Tiles(d)
    return None


def _accesses(k: Kernel) -> list[sympy.Expr]:
    out: list[sympy.Expr] = []
    for loop in k.loops:
        for kn in loop.nodes:
            if kn.node.outputs()[0] not in k.internal:
                out.append(sympy.sympify(kn.store_index))
            out.extend(sympy.sympify(v.index) for v in walk(kn.body)
                       if isinstance(v, Load) and v.buffer not in k.internal)
    return out


def stride_along(e: sympy.Expr, v: sympy.Symbol, loop_vars: set[sympy.Symbol]) -> sympy.Expr | None:
    """The stride of index ``e`` along loop variable ``v``: a number, or an expression in the
    sizes alone under dynamic shapes (``x0 + s1*x1`` along ``x1``: ``s1``); None where ``e``
    is not linear in ``v`` with such a stride (floor divisions, products of loop variables)."""
    try:
        d = sympy.diff(e, v)
    except (TypeError, ValueError):
        return None
    if d.is_number:
        return d
    if d.has(sympy.Derivative) or not d.free_symbols.isdisjoint(loop_vars):
        return None
    return d


def _unit(e: sympy.Expr, v: sympy.Symbol) -> bool:
    return stride_along(e, v, set()) == 1


def _short(n: sympy.Expr, tile: int) -> bool:
    return bool(n.is_number and int(n) < min(tile, SHORT))
