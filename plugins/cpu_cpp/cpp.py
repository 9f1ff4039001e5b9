"""C++ spellings shared by the kernel writers: index expressions, ``for`` headers and OpenMP
``if`` clauses."""
from __future__ import annotations

import sympy

from coil.sdk.codegen import IndexPrinter, IndexSpelling

#: Below this many points a loop nest runs on one thread (a parallel region costs microseconds).
PARALLEL_THRESHOLD = 16384

#: Index expressions are non-negative ``int64_t``: C++'s ``/`` is floor division for them.
PRINTER = IndexPrinter(IndexSpelling(floordiv="({0} / {1})", minimum="std::min<int64_t>({0}, {1})",
                                     maximum="std::max<int64_t>({0}, {1})", wide_integer="INT64_C({0})"))


def idx(e: sympy.Expr) -> str:
    return PRINTER.print(sympy.sympify(e))


def for_header(var: str, size: sympy.Expr | str, start: str = "0", step: int = 1) -> str:
    end = size if isinstance(size, str) else idx(size)
    inc = f"{var}++" if step == 1 else f"{var} += {step}"
    return f"for (int64_t {var} = {start}; {var} < {end}; {inc}) {{"


def parallel_if(points: sympy.Expr) -> str:
    """An OpenMP ``if`` clause that keeps small loop nests on one thread."""
    return f"if(parallel: {idx(points)} > {PARALLEL_THRESHOLD})"
