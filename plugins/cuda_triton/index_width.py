"""Whether a kernel's index arithmetic fits int32: a bound on the magnitude of each index
expression over the whole loop box, not its value at the top corner alone. An index with a
remainder (a reshaped transposed view: ``i // 5 + 805306369 * (i % 5)``) or a negative
coefficient (``flip``) is largest inside the box; read at the corner it looked small, and the
int32 offsets wrapped (found by a hunt, session 38)."""
from __future__ import annotations

from typing import Mapping

import sympy

from coil.sdk.symbolic import FloorDiv, ModIdx

#: Indices up to half of int32's range are written in int32 (sums of two stay in range).
INT32_SAFE = (2**31 - 1) // 2


def magnitude(e: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> int | None:
    """An upper bound of ``|e|`` with each symbol of ``ranges`` in ``[0, n)``; None where it
    is not known (a symbolic size, an unknown function)."""
    if e.is_Integer:
        return abs(int(e))
    if e.is_Number:
        return int(abs(e)) + 1
    if e.is_Symbol:
        n = ranges.get(e)
        return int(n) - 1 if n is not None and sympy.sympify(n).is_Integer else None
    parts = [magnitude(a, ranges) for a in e.args]
    if any(p is None for p in parts):
        return None
    if isinstance(e, sympy.Add):
        return sum(parts)  # type: ignore[arg-type]
    if isinstance(e, sympy.Mul):
        total = 1
        for p in parts:
            total *= p  # type: ignore[operator]
        return total
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return parts[0] ** int(e.exp)  # type: ignore[operator]
    if isinstance(e, FloorDiv) and e.args[1].is_Integer and int(e.args[1]) > 0:
        return parts[0] // int(e.args[1])  # type: ignore[operator]
    if isinstance(e, (ModIdx, sympy.Mod)) and e.args[1].is_Integer:
        return min(parts[0], abs(int(e.args[1])) - 1)  # type: ignore[type-var]
    if isinstance(e, (sympy.Min, sympy.Max, sympy.Abs)):
        return max(parts)  # type: ignore[type-var]
    return None


def needs_int64(exprs: list[sympy.Expr], ranges: Mapping[sympy.Symbol, sympy.Expr]) -> bool:
    """Whether any of ``exprs`` may leave :data:`INT32_SAFE` over the loop box."""
    for e in exprs:
        m = magnitude(sympy.expand(sympy.sympify(e)), ranges)
        if m is None or m + 1 > INT32_SAFE:
            return True
    return False


__all__ = ["magnitude", "needs_int64", "INT32_SAFE"]
