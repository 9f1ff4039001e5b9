"""C++ spellings shared by the kernel writers: index expressions, ``for`` headers, OpenMP
``if`` clauses, and the scope of already computed values."""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from coil.sdk import ExprPrinter, Value

#: Below this many points a loop nest runs on one thread (a parallel region costs microseconds).
PARALLEL_THRESHOLD = 16384


class CppPrinter(ExprPrinter):
    def floordiv(self, a: str, b: str) -> str:
        return f"({self.group(a)} / {self.group(b)})"

    def integer(self, value: int) -> str:
        return f"INT64_C({value})" if abs(value) > 2**31 - 1 else str(value)

    def minimum(self, args: list[str]) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"std::min<int64_t>({out}, {a})"
        return out

    def maximum(self, args: list[str]) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"std::max<int64_t>({out}, {a})"
        return out


PRINTER = CppPrinter()


def idx(e: sympy.Expr) -> str:
    return PRINTER.print(sympy.sympify(e))


def for_header(var: str, size: sympy.Expr | str, start: str = "0", step: int = 1) -> str:
    end = size if isinstance(size, str) else idx(size)
    inc = f"{var}++" if step == 1 else f"{var} += {step}"
    return f"for (int64_t {var} = {start}; {var} < {end}; {inc}) {{"


def parallel_if(points: sympy.Expr) -> str:
    """An OpenMP ``if`` clause that keeps small loop nests on one thread."""
    return f"if(parallel: {idx(points)} > {PARALLEL_THRESHOLD})"


@dataclass
class Scope:
    """Values already computed in the current C++ block (common subexpressions)."""

    parent: "Scope | None" = None
    memo: dict[Value, str] = field(default_factory=dict)

    def get(self, v: Value) -> str | None:
        s: Scope | None = self
        while s is not None:
            if v in s.memo:
                return s.memo[v]
            s = s.parent
        return None
