"""Hoisting: the parts of an r loop's bodies that are the same at every reduced point (a
``log`` of a row's sum, a read of a scalar tensor) are computed once, before the loop; and
the parts of a pointwise kernel's body that are the same along its innermost loop (an
eval-mode batch norm's per-channel ``weight / sqrt(var + eps)`` over an NCHW row) once per
row, before that loop. GCC cannot do it itself: the loads might alias the loop's stores,
and it does not move vector math calls out of loops. Integer divisions stay where they are:
hoisted, one would also run where the loop it left has no iteration to run (a division by
zero the kernel never performed)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import sympy
import torch

from coil.sdk import Cast, Const, IndexValue, Indirect, Load, Loop, Masked, Op, Value
from coil.sdk.codegen import ValueScope

from .optable import integer_division

if TYPE_CHECKING:
    from .codegen import KernelWriter


def hoist_invariants(kw: KernelWriter, loop: Loop, scope: ValueScope[str]) -> None:
    """Emit the invariant parts of ``loop``'s bodies into ``scope``, ahead of the loop."""
    _hoist(kw, [kn.body for kn in loop.nodes], _Invariance(kw, set(kw.k.r_vars)), scope)


def hoist_row_invariants(kw: KernelWriter, bodies: list[Value], var: sympy.Symbol,
                         scope: ValueScope[str]) -> int:
    """Emit the parts of a pointwise kernel's ``bodies`` that do not change along its
    innermost loop variable ``var`` into ``scope``, ahead of that loop; returns how many.
    Math ops, casts and the loads they leave (a per-channel parameter), not constants."""
    return _hoist(kw, bodies, _Invariance(kw, {var}), scope, loads=True)


def invariance(kw: KernelWriter, loop_vars: set[sympy.Symbol], gathers: bool = False
               ) -> Callable[[Value], bool]:
    """Whether a value is the same at every point of the loops over ``loop_vars`` and may be
    computed before them (memoised). ``gathers``: loads through indices read from memory the
    kernel does not write count too (a table filled over the kernel's own points reads
    only indices the kernel reads; hoisted ahead of one loop, such a load would read an index
    that loop might not)."""
    return _Invariance(kw, loop_vars, gathers)


def _hoist(kw: KernelWriter, bodies: list[Value], invariant: _Invariance, scope: ValueScope[str],
           loads: bool = False) -> int:
    hoisted = 0
    # an index read from memory is hoisted with its bounds check (codegen's _indirect): the
    # check then runs once per row, outside the vector loop it would keep scalar
    kinds = (Op, Cast, Load, Indirect) if loads else (Op, Cast, Indirect)
    for body in bodies:
        for v in unmasked(body):
            if isinstance(v, kinds) and invariant(v):
                kw.value(v, scope)
                hoisted += 1
    return hoisted


def unmasked(v: Value) -> Iterator[Value]:
    """The values of a tree outside masked bodies (which do not always run, so they must not
    be moved or reused), children before parents."""
    for c in v.children():
        if c is not None and not isinstance(c, Masked):
            yield from unmasked(c)
    yield v


class _Invariance:
    """Whether a value is the same at every point of the loops over ``loop_vars``, memoised
    by identity."""

    def __init__(self, kw: KernelWriter, loop_vars: set[sympy.Symbol], gathers: bool = False) -> None:
        self.kw = kw
        self.r_vars = loop_vars
        self.gathers = gathers
        self.written = {s for loop in kw.k.loops for kn in loop.nodes for s in kn.stores}
        self.known: dict[int, bool] = {}

    def __call__(self, v: Value) -> bool:
        if id(v) not in self.known:
            self.known[id(v)] = self._check(v)
        return self.known[id(v)]

    def _check(self, v: Value) -> bool:
        if isinstance(v, Const):
            return True
        if isinstance(v, Load):
            if v.indirect and not (self.gathers and all(self(i) for i in v.indirect)):
                return False
            return self._fixed(v) and not self._on_r(v.index)
        if isinstance(v, Indirect):  # the index alone (a load through it: above)
            return v.value is not None and self(v.value)
        if isinstance(v, IndexValue):
            return not self._on_r(v.expr)
        if integer_division(v):
            return False
        if isinstance(v, (Op, Cast)):
            return all(self(c) for c in v.children())
        return False

    def _fixed(self, load: Load) -> bool:
        """A local computed before the loop, or memory the kernel never writes."""
        if load.buffer in self.kw.locals:
            return True
        return load.buffer not in self.kw.k.internal and load.buffer not in self.written

    def _on_r(self, e: sympy.Expr) -> bool:
        return bool(sympy.sympify(e).free_symbols & self.r_vars)
