"""Iteration spaces: one pointwise node re-expressed over another shape of the same points.

A ``view`` between (batch, tokens, features) and (batch * tokens, features) gives the nodes on
either side of it different loop ranges over the same elements, and a kernel has one space.
The scheduler fuses such nodes by moving one of them onto the other's ranges:

* :func:`merge_leading` merges leading dims ((2, 8, 64) onto (16, 64)): the merged variable is
  split back by div/mod, which :func:`simplify_in` folds away where the layouts are dense;
* :func:`refine` splits dims ((16, 64) onto (2, 8, 64), or onto a reduction's
  (batch, tokens) x (features) space): each old variable is a linear combination of new ones.

Loop variables are ``x0, x1, ...`` in both shapes; the substitutions are simultaneous."""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import sympy

from . import ir
from .symbolic import FloorDiv, ModIdx, fold_divmod, simplify_index


def loop_var(i: int) -> sympy.Symbol:
    """The ``i``-th loop variable of a node's ranges."""
    return sympy.Symbol(f"x{i}", integer=True, nonnegative=True)


def simplify_in(e: sympy.Expr, ranges: dict) -> sympy.Expr:
    """An index in a kernel over ``ranges`` (variable -> extent), with div/mod pairs that a
    view split a dim into folded back (``512*(x0 // 8) + 64*(x0 % 8)`` is ``64*x0``): reads and
    writes of one element through two views then compare equal."""
    return simplify_index(fold_divmod(e), ranges)


def _moved(node: ir.PointwiseNode, target: tuple, mapping: dict) -> ir.PointwiseNode:
    bounds = {loop_var(i): n for i, n in enumerate(target)}

    def fix(e: sympy.Expr) -> sympy.Expr:
        return simplify_in(e, bounds)
    body = ir.map_indices(ir.reindex_value(node.body, mapping), fix)
    store = fix(node.store_index.xreplace(mapping))
    return dataclasses.replace(node, ranges=tuple(target), body=body, store_index=store)


def _merges(ranges: Sequence[sympy.Expr], target: Sequence[sympy.Expr]) -> bool:
    """Whether ``ranges``' leading dims merge into the first of the 2-D ``target``."""
    return (len(target) == 2 and bool(ranges) and ranges[-1] == target[-1]
            and sympy.expand(sympy.Mul(*ranges[:-1]) - target[0]) == 0)


def mover(ranges: Sequence[sympy.Expr], target: Sequence[sympy.Expr]
          ) -> Callable[[ir.Node, tuple], ir.PointwiseNode | None] | None:
    """The move that takes nodes over ``ranges`` onto ``target`` (:func:`merge_leading` or
    :func:`refine`), decided from the shapes alone, or None where neither applies: the
    scheduler asks this for every pair it cannot fuse, so no node body is touched here."""
    if len(ranges) > len(target) and _merges(ranges, target):
        return merge_leading
    if len(ranges) < len(target) and _runs(ranges, target) is not None:
        return refine
    return None


def merge_leading(node: ir.Node, target: tuple) -> ir.PointwiseNode | None:
    """``node`` over the 2-D ``target`` instead of its own ranges, when both have the same
    number of points and the same last dim: its leading dims are ``target``'s first dim split
    by div/mod. None where that does not hold."""
    if not isinstance(node, ir.PointwiseNode) or node.mutates or not _merges(tuple(node.ranges), target):
        return None
    ranges = tuple(node.ranges)
    mapping: dict = {loop_var(len(ranges) - 1): loop_var(1)}
    q: sympy.Expr = loop_var(0)
    for d in range(len(ranges) - 2, 0, -1):
        mapping[loop_var(d)] = ModIdx(q, ranges[d])
        q = FloorDiv(q, ranges[d])
    mapping[loop_var(0)] = q
    return _moved(node, target, mapping)


def _runs(coarse: Sequence[sympy.Expr], fine: Sequence[sympy.Expr]) -> list[list[int]] | None:
    """For each dim of ``coarse``, the consecutive dims of ``fine`` whose product it is; None
    where ``fine`` does not refine ``coarse`` that way."""
    runs: list[list[int]] = []
    j = 0
    for n in coarse:
        run: list[int] = []
        product: sympy.Expr = sympy.Integer(1)
        while j < len(fine) and (not run or sympy.expand(product - n) != 0):
            run.append(j)
            product = product * fine[j]
            j += 1
        if not run or sympy.expand(product - n) != 0:
            return None
        runs.append(run)
    return runs if j == len(fine) else None


def refine(node: ir.Node, target: tuple) -> ir.PointwiseNode | None:
    """``node`` over ``target``, a finer shape of its points (each of its dims the product of
    consecutive dims of ``target``), else None."""
    if not isinstance(node, ir.PointwiseNode) or node.mutates or not node.ranges:
        return None
    runs = _runs(tuple(node.ranges), tuple(target)) if len(target) > len(node.ranges) else None
    if runs is None:
        return None
    mapping: dict = {}
    for i, run in enumerate(runs):
        flat: sympy.Expr = sympy.Integer(0)
        for j in run:
            flat = flat * target[j] + loop_var(j)
        mapping[loop_var(i)] = flat
    return _moved(node, target, mapping)
