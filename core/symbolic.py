"""Index arithmetic: sympy functions for non-negative integer division and modulo, a simplifier
that uses the known ranges of loop variables, and a printer that plugins specialise."""
from __future__ import annotations

import re

from typing import Callable, Iterable, Mapping

import sympy


class FloorDiv(sympy.Function):
    """``a // b`` for non-negative integers ``a`` and positive ``b``."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if a == b:
            return sympy.Integer(1)
        return None


class ModIdx(sympy.Function):
    """``a % b`` for non-negative integers ``a`` and positive ``b``."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 1 or a == 0 or a == b:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return None


def sym(name: str) -> sympy.Symbol:
    """A loop or size variable: an integer that is never negative."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


def loop_vars(prefix: str, n: int) -> list[sympy.Symbol]:
    return [sym(f"{prefix}{i}") for i in range(n)]


def _upper_bound(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr | None:
    """Largest value of a sum of non-negative terms (coefficient * variable), or None."""
    total = sympy.Integer(0)
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if coeff < 0:
            return None
        if rest == 1:
            total += coeff
        elif rest in ranges:
            total += coeff * (ranges[rest] - 1)
        else:
            return None
    return total


def _is_less(a: sympy.Expr, b: sympy.Expr) -> bool:
    diff = sympy.expand(b - a)
    if diff.is_number:
        return bool(diff > 0)
    return bool(diff.is_positive)


def _split_divisible(expr: sympy.Expr, divisor: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """Split a sum into (terms divisible by ``divisor``, divided) and the remaining terms."""
    quotient, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(expr)):
        q = sympy.cancel(term / divisor)
        if q.is_polynomial() and sympy.fraction(sympy.together(q))[1] == 1 and _integral(q):
            quotient += q
        else:
            rest += term
    return quotient, rest


def _integral(expr: sympy.Expr) -> bool:
    return all(
        c.is_Integer for c in sympy.Poly(expr, *expr.free_symbols).coeffs()
    ) if expr.free_symbols else bool(expr.is_Integer)


def simplify_index(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """Remove FloorDiv/ModIdx that the variables' ranges make redundant.

    ``FloorDiv(x0*T + x1, T)`` becomes ``x0`` and ``ModIdx(x0*T + x1, T)`` becomes ``x1`` when
    ``0 <= x1 < T`` is known from ``ranges`` (loop variable -> loop size)."""
    if not expr.has(FloorDiv, ModIdx):
        return expr

    def visit(e: sympy.Expr) -> sympy.Expr:
        if not e.args:
            return e
        args = [visit(a) for a in e.args]
        if isinstance(e, (FloorDiv, ModIdx)):
            a, b = args
            quotient, rest = _split_divisible(a, b)
            bound = _upper_bound(rest, ranges)
            if bound is not None and _is_less(bound, b):
                return quotient if isinstance(e, FloorDiv) else rest
            bound_all = _upper_bound(a, ranges)
            if bound_all is not None and _is_less(bound_all, b):
                return sympy.Integer(0) if isinstance(e, FloorDiv) else a
            return e.func(a, b)
        return e.func(*args)

    return visit(expr)


class ExprPrinter:
    """Prints index expressions as source text. Plugins override the spellings of floor
    division, modulo, min/max and integer literals for their language."""

    @staticmethod
    def group(text: str) -> str:
        """``text`` as one operand: a name or a number as it is, anything else in parentheses
        (``x0 // 5*s0`` would divide by 5 and multiply by ``s0``)."""
        return text if re.fullmatch(r"[\w.]+", text) else f"({text})"

    def floordiv(self, a: str, b: str) -> str:
        return f"({self.group(a)} // {self.group(b)})"

    def mod(self, a: str, b: str) -> str:
        return f"({self.group(a)} % {self.group(b)})"

    def integer(self, value: int) -> str:
        return str(value)

    def symbol(self, s: sympy.Symbol) -> str:
        return s.name

    def minimum(self, args: list[str]) -> str:
        return f"min({', '.join(args)})"

    def maximum(self, args: list[str]) -> str:
        return f"max({', '.join(args)})"

    def print(self, e: sympy.Expr | int) -> str:
        e = sympy.sympify(e)
        if e.is_Integer:
            return self.integer(int(e))
        if e.is_Symbol:
            return self.symbol(e)
        if isinstance(e, FloorDiv):
            return self.floordiv(self.print(e.args[0]), self.print(e.args[1]))
        if isinstance(e, ModIdx):
            return self.mod(self.print(e.args[0]), self.print(e.args[1]))
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=sympy.default_sort_key)
            text = self.print(terms[0])
            for t in terms[1:]:
                c, rest = t.as_coeff_Mul()
                if c < 0:
                    text += f" - {self.print(-t)}"
                else:
                    text += f" + {self.print(t)}"
            return f"({text})"
        if isinstance(e, sympy.Mul):
            c, rest = e.as_coeff_Mul()
            if c == -1:
                return f"(-{self.print(rest)})"
            return "*".join(self._factor(a) for a in e.args)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "*".join([self._factor(e.base)] * int(e.exp))
        if isinstance(e, sympy.Min):
            return self.minimum([self.print(a) for a in e.args])
        if isinstance(e, sympy.Max):
            return self.maximum([self.print(a) for a in e.args])
        raise NotImplementedError(f"cannot print index expression {e!r} ({type(e).__name__})")

    def _factor(self, e: sympy.Expr) -> str:
        text = self.print(e)
        if isinstance(e, sympy.Add):
            return text if text.startswith("(") else f"({text})"
        return text


def free_symbols(exprs: Iterable[sympy.Expr]) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for e in exprs:
        if isinstance(e, sympy.Basic):
            out |= e.free_symbols
    return out


def substitute(expr: sympy.Expr, mapping: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    if not mapping or not isinstance(expr, sympy.Basic):
        return expr
    return expr.xreplace(dict(mapping))


IndexFn = Callable[[list[sympy.Expr]], sympy.Expr]
