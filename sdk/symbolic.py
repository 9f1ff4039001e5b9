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


def upper_bound(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr | None:
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
        elif isinstance(rest, (FloorDiv, ModIdx)) and rest.args[1].is_Integer and rest.args[1] > 0:
            inner = upper_bound(rest.args[0], ranges)  # None also when a term may be negative
            if inner is None or not inner.is_Integer:
                return None
            divisor = int(rest.args[1])
            total += coeff * (int(inner) // divisor if isinstance(rest, FloorDiv) else min(int(inner), divisor - 1))
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
        q = _exact_quotient(term, divisor)
        if q is not None:
            quotient += q
        else:
            rest += term
    return quotient, rest


def _exact_quotient(term: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
    """``term / divisor`` when it is an integer polynomial, else None (a zero divisor, as a
    zero-size dim's index arithmetic holds, has no quotient)."""
    if divisor.is_zero:
        return None
    if divisor.is_Integer:  # the common case, without sympy's rational function machinery
        coeff, rest = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % int(divisor) == 0:
            return sympy.Integer(int(coeff) // int(divisor)) * rest
        return None
    q = sympy.cancel(term / divisor)
    if q.is_polynomial() and sympy.fraction(sympy.together(q))[1] == 1 and _integral(q):
        return q
    return None


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
    done: dict[sympy.Expr, sympy.Expr] = {}  # sympy trees share subtrees: visit each once

    def visit(e: sympy.Expr) -> sympy.Expr:
        if e not in done:
            done[e] = _visit(e)
        return done[e]

    def _visit(e: sympy.Expr) -> sympy.Expr:
        if not e.args:
            return e
        args = [visit(a) for a in e.args]
        if isinstance(e, (FloorDiv, ModIdx)):
            a, b = args
            quotient, rest = _split_divisible(a, b)
            bound = upper_bound(rest, ranges)
            if bound is not None and _is_less(bound, b):
                return quotient if isinstance(e, FloorDiv) else rest
            bound_all = upper_bound(a, ranges)
            if bound_all is not None and _is_less(bound_all, b):
                return sympy.Integer(0) if isinstance(e, FloorDiv) else a
            return e.func(a, b)
        return e.func(*args)

    return visit(expr)


def fold_divmod(expr: sympy.Expr) -> sympy.Expr:
    """``c*b*FloorDiv(a, b) + c*ModIdx(a, b)`` folded back into ``c*a``, and
    ``c*b*ModIdx(FloorDiv(a, b), n) + c*ModIdx(a, b)`` into ``c*ModIdx(a, b*n)``, repeatedly:
    a flat index split into dims by div/mod and recombined through a dense layout is the flat
    index again (or, for the inner dims alone, its remainder)."""
    if not expr.has(ModIdx):
        return expr
    terms = list(sympy.Add.make_args(sympy.expand(expr)))
    changed = True
    while changed:
        changed = False
        for t in terms:
            coeff, rest = t.as_coeff_Mul()
            mods = [f for f in sympy.Mul.make_args(rest) if isinstance(f, ModIdx)]
            if len(mods) != 1:
                continue
            mod = mods[0]
            a, b = mod.args
            partner = sympy.expand(t / mod * b * FloorDiv(a, b))
            if partner in terms:
                terms.remove(t)
                terms.remove(partner)
                terms.append(sympy.expand(t / mod * a))
                changed = True
                break
            outer = _outer_remainder(terms, t / mod * b, FloorDiv(a, b))
            if outer is not None:
                terms.remove(t)
                terms.remove(outer[0])
                terms.append(sympy.expand(t / mod * ModIdx(a, b * outer[1])))
                changed = True
                break
    return sympy.Add(*terms)


def _outer_remainder(terms: list[sympy.Expr], scale: sympy.Expr, quotient: sympy.Expr
                     ) -> tuple[sympy.Expr, sympy.Expr] | None:
    """The term of ``terms`` that is ``scale * ModIdx(quotient, n)``, and ``n``."""
    for term in terms:
        mods = [f for f in sympy.Mul.make_args(term) if isinstance(f, ModIdx) and f.args[0] == quotient]
        if len(mods) == 1 and sympy.expand(term / mods[0] - scale) == 0:
            return term, mods[0].args[1]
    return None


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
        if isinstance(e, (sympy.Add, sympy.Mul)) and _fractional(e):
            # an exact quotient, such as a dynamic size split in halves (``s0/2``): the sum
            # over its common denominator, divided once (a term rounded alone could be off)
            numerator, denominator = sympy.fraction(sympy.together(e))
            if denominator.is_Integer:
                return self.floordiv(self.print(sympy.expand(numerator)), self.integer(int(denominator)))
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
        if isinstance(e, sympy.Abs):  # of a symbolic integer (``abs(n)``): the larger of n, -n
            return self.maximum([self.print(e.args[0]), self.print(-e.args[0])])
        raise NotImplementedError(f"cannot print index expression {e!r} ({type(e).__name__})")

    def _factor(self, e: sympy.Expr) -> str:
        text = self.print(e)
        if isinstance(e, sympy.Add):
            return text if text.startswith("(") else f"({text})"
        return text


def _fractional(e: sympy.Expr) -> bool:
    """Whether a term of ``e`` (a sum or a product) has a coefficient that is not an integer."""
    terms = e.args if isinstance(e, sympy.Add) else (e,)
    return any(not t.as_coeff_Mul()[0].is_Integer for t in terms)


#: Size expressions Coil cannot spell in its own functions, each named by a symbol that the
#: wrapper computes in Python before any kernel runs (``derived_definitions``).
_DERIVED: dict[sympy.Expr, sympy.Symbol] = {}


def derived_definitions() -> dict[sympy.Symbol, sympy.Expr]:
    """Derived size symbol -> the torch expression (of input size symbols) it stands for."""
    return {sym: expr for expr, sym in _DERIVED.items()}


def _derived(expr: sympy.Expr) -> sympy.Symbol:
    if expr not in _DERIVED:
        _DERIVED[expr] = sympy.Symbol(f"d{len(_DERIVED)}", integer=True)
    return _DERIVED[expr]


def from_torch(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with torch's integer functions (``torch.utils._sympy.functions``: FloorDiv,
    CeilDiv, ModularIndexing, Mod, Max, Min...) rewritten into Coil's, where that keeps the
    meaning. Coil's division and modulo are for non-negative dividends: a part whose dividend
    the symbols' assumptions (torch's sizes are positive integers) do not prove non-negative,
    such as ``(s1 - s0)//2``, becomes a derived symbol the wrapper computes with Python's own
    floor division; one of other symbols than input sizes is left as it is (printing it
    fails with a clear error rather than dividing wrongly)."""
    if not any(type(n).__module__.startswith("torch.") for n in sympy.preorder_traversal(expr)):
        return expr
    return _from_torch(expr)


def _from_torch(e: sympy.Expr) -> sympy.Expr:
    if e.is_Atom:
        return e
    args = [_from_torch(a) for a in e.args]
    name = type(e).__name__ if type(e).__module__.startswith("torch.") else ""
    nonneg = bool(args) and args[0].is_nonnegative is True
    if name in ("FloorDiv", "CleanDiv") and nonneg and args[1].is_positive:
        return FloorDiv(*args)
    if name == "CeilDiv" and nonneg and args[1].is_positive:
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if name in ("Mod", "PythonMod") and nonneg and args[1].is_positive:
        return ModIdx(*args)
    if name == "ModularIndexing" and nonneg and args[1].is_positive and args[2].is_positive:
        return ModIdx(FloorDiv(args[0], args[1]), args[2])
    if name == "Max":
        return sympy.Max(*args)
    if name == "Min":
        return sympy.Min(*args)
    if name and all(sym.name.startswith("s") for sym in e.free_symbols):
        return _derived(e)
    return e.func(*args) if tuple(args) != e.args else e


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
