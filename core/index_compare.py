"""Comparisons of an index with a constant, decided or reduced by the loop variables' ranges.

A ``cat`` selects its part by comparing the concatenated dim's index with the parts' offsets.
Read through a permute and a reshape, that index is a sum such as ``x0 // 197 + 64*(x1 // 192)``
(ViT's backward puts the q, k and v gradients, each 64 images deep, into one qkv gradient),
and every element paid for the divisions and the 64-bit comparisons of all three parts. With
``0 <= x0 // 197 < 64`` known from the ranges, ``x0 // 197 + 64*q >= 64*m`` is ``q >= m``,
and a comparison the ranges decide is a constant: here ``x1 // 192 >= 0`` always holds.

Written as ``g*q + r`` with ``0 <= r < g`` and a threshold ``g*m``, ``g*q + r >= g*m`` holds
exactly when ``q >= m`` (and ``<`` likewise), whatever the sign of ``q``."""
from __future__ import annotations

import dataclasses

import sympy
import torch

from . import ir
from .symbolic import upper_bound

#: Comparisons rewritten, as (``ge`` or ``lt``, what to add to the threshold).
_NORMAL = {"ge": ("ge", 0), "lt": ("lt", 0), "gt": ("ge", 1), "le": ("lt", 1)}


def simplify_comparison(op: ir.Op, ranges: dict) -> ir.Value | None:
    """``op`` (an index compared with an integer constant) decided by ``ranges`` (variable ->
    extent) as a constant, or reduced to a comparison of fewer terms; None to keep it."""
    normal = _NORMAL.get(op.name)
    if normal is None or len(op.args) != 2 or not isinstance(op.args[0], ir.IndexValue):
        return None
    k = _integer(op.args[1])
    if k is None:
        return None
    name, k = normal[0], k + normal[1]
    expr = sympy.expand(op.args[0].expr)
    constant, _ = expr.as_coeff_Add()
    if constant.is_Integer:  # e + c >= k is e >= k - c
        expr, k = expr - constant, k - int(constant)
    expr, k = _divided(expr, k, ranges)
    bound = upper_bound(expr, ranges)  # not None: expr >= 0 too
    if bound is not None and bound.is_Integer and (k <= 0 or int(bound) < k):
        return ir.Const(op.dtype, (k <= 0) if name == "ge" else (int(bound) < k))  # a Python bool
    index = op.args[0]
    if name == op.name and expr == sympy.expand(index.expr) and isinstance(op.args[1], ir.IndexValue) \
            and op.args[1].expr == k:
        return None  # nothing to gain
    return dataclasses.replace(op, name=name, args=(dataclasses.replace(index, expr=expr),
                                                    ir.IndexValue(index.dtype, expr=sympy.Integer(k))))


def _integer(v: ir.Value) -> int | None:
    if isinstance(v, ir.IndexValue) and v.expr.is_Integer:
        return int(v.expr)
    if isinstance(v, ir.Const) and isinstance(v.value, int) and not isinstance(v.value, bool):
        return v.value
    return None


def _divided(expr: sympy.Expr, k: int, ranges: dict) -> tuple[sympy.Expr, int]:
    """``(q, k // g)`` for the largest coefficient ``g`` that divides ``k`` and splits
    ``expr`` into ``g*q + r`` with ``0 <= r < g``; ``(expr, k)`` where none does."""
    coefficients = {abs(int(c)) for c in (t.as_coeff_Mul()[0] for t in sympy.Add.make_args(expr))
                    if c.is_Integer and abs(int(c)) > 1}
    for g in sorted(coefficients, reverse=True):
        if k % g:
            continue
        quotient, rest = sympy.Integer(0), sympy.Integer(0)
        for term in sympy.Add.make_args(expr):
            c, t = term.as_coeff_Mul()
            if c.is_Integer and int(c) % g == 0:
                quotient += sympy.Integer(int(c) // g) * t
            else:
                rest += term
        hi = upper_bound(rest, ranges)
        if rest == 0 or (hi is not None and hi.is_Integer and hi < g):
            return quotient, k // g
    return expr, k
