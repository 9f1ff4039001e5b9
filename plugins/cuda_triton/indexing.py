"""Index expressions of a Triton kernel, written over one flat program index per level.

A kernel's loop variables ``x0..`` are not materialised one by one: each level has a single
flat index (``xindex``, ``rindex``), and an index expression that is affine in the loop
variables is split into runs of consecutive dims whose coefficients chain like contiguous
strides (``c[i] == c[i+1] * n[i+1]``). Each run costs at most one division and one modulo
of the flat index, and a fully contiguous access costs none: ``x0*4096 + x1`` over
``(n, 4096)`` prints as ``xindex``."""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from coil.sdk.codegen import IndexPrinter, IndexSpelling


#: Python's spellings but for min/max, which Triton spells as elementwise ops.
PRINTER = IndexPrinter(IndexSpelling(minimum="tl.minimum({0}, {1})", maximum="tl.maximum({0}, {1})"))


def text(e: sympy.Expr) -> str:
    return PRINTER.print(sympy.sympify(e))


def _product(items: list[sympy.Expr]) -> sympy.Expr:
    out: sympy.Expr = sympy.Integer(1)
    for i in items:
        out = out * i
    return out


@dataclass(frozen=True)
class Run:
    """Dims ``lo..hi`` (inclusive) of one level, read as one flat variable."""

    prefix: str  # "x" | "r"
    lo: int
    hi: int

    @property
    def name(self) -> str:
        return f"{self.prefix}{self.lo}" if self.lo == self.hi else f"{self.prefix}{self.lo}_{self.hi}"


class Level:
    """The loop variables of one level (``x`` or ``r``) and their flat index."""

    def __init__(self, prefix: str, symbols: list[sympy.Symbol], ranges: tuple[sympy.Expr, ...],
                 flat: str) -> None:
        self.prefix = prefix
        self.symbols = symbols
        self.ranges = ranges
        self.flat = flat

    def definition(self, run: Run) -> str:
        """``name = (flat // inner) % extent`` for a run, leaving out what is trivial."""
        inner = _product(list(self.ranges[run.hi + 1:]))
        extent = _product(list(self.ranges[run.lo:run.hi + 1]))
        expr = self.flat
        if inner != 1:
            expr = f"({expr} // {IndexPrinter.group(text(inner))})"
        if run.lo != 0:
            expr = f"({expr} % {IndexPrinter.group(text(extent))})"
        return f"{run.name} = {expr}"

    def covers_all(self, run: Run) -> bool:
        return run.lo == 0 and run.hi == len(self.symbols) - 1


class IndexWriter:
    """Prints index expressions over the levels of a kernel, and says which runs they need."""

    def __init__(self, levels: list[Level]) -> None:
        self.levels = levels
        self.where = {s: (lv, i) for lv in levels for i, s in enumerate(lv.symbols)}

    def split(self, e: sympy.Expr) -> tuple[str, set[Run]]:
        """Source text of ``e`` and the runs it needs defined."""
        e = sympy.expand(sympy.sympify(e))
        linear: dict[sympy.Symbol, sympy.Expr] = {}
        rest: list[sympy.Expr] = []
        for term in sympy.Add.make_args(e):
            coeff, var = term.as_independent(*self.where, as_Add=False)
            if var in self.where and not coeff.free_symbols & set(self.where):
                linear[var] = linear.get(var, sympy.Integer(0)) + coeff
            else:
                rest.append(term)
        runs: set[Run] = set()
        parts: list[str] = []
        for lv in self.levels:
            for run, coeff in self._runs(lv, linear):
                runs.add(run)
                name = lv.flat if lv.covers_all(run) else run.name
                parts.append(name if coeff == 1 else f"{name} * {text(coeff)}")
        others = sympy.Add(*rest)
        if others != 0:
            rename = {}
            for s in others.free_symbols & set(self.where):
                lv, i = self.where[s]
                run = Run(lv.prefix, i, i)
                runs.add(run)
                # the variable holding the dim: the flat index when it is the level's only dim
                rename[s] = sympy.Symbol(lv.flat if lv.covers_all(run) else run.name,
                                         integer=True, nonnegative=True)
            parts.append(text(others.xreplace(rename)))
        return (" + ".join(parts) if parts else "0"), {r for r in runs if not self._is_flat(r)}

    def _is_flat(self, run: Run) -> bool:
        return any(lv.prefix == run.prefix and lv.covers_all(run) for lv in self.levels)

    def _runs(self, lv: Level, linear: dict[sympy.Symbol, sympy.Expr]) -> list[tuple[Run, sympy.Expr]]:
        out: list[tuple[Run, sympy.Expr]] = []
        coeffs = [linear.get(s, sympy.Integer(0)) for s in lv.symbols]
        hi = len(coeffs) - 1
        while hi >= 0:
            if coeffs[hi] == 0:
                hi -= 1
                continue
            lo = hi
            while lo > 0 and coeffs[lo - 1] != 0 and sympy.expand(coeffs[lo - 1] - coeffs[lo] * lv.ranges[lo]) == 0:
                lo -= 1
            out.append((Run(lv.prefix, lo, hi), coeffs[hi]))
            hi = lo - 1
        return out

    def mentions(self, e: sympy.Expr, prefix: str) -> bool:
        """Whether ``e`` uses a loop variable of the level ``prefix``."""
        return any(s in self.where and self.where[s][0].prefix == prefix
                   for s in sympy.sympify(e).free_symbols)
