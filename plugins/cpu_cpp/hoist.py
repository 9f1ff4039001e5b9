"""Hoisting: the parts of an r loop's bodies that are the same at every reduced point (a
``log`` of a row's sum, a read of a scalar tensor) are computed once, before the loop. GCC
cannot do it itself: the loads might alias the loop's stores, and it does not move vector
math calls out of loops."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import sympy
import torch

from coil.sdk import Cast, Const, IndexValue, Load, Loop, Masked, Op, Value
from coil.sdk.codegen import ValueScope

if TYPE_CHECKING:
    from .codegen import KernelWriter


def hoist_invariants(kw: KernelWriter, loop: Loop, scope: ValueScope[str]) -> None:
    """Emit the invariant parts of ``loop``'s bodies into ``scope``, ahead of the loop, and
    the reciprocal of every invariant divisor of a float division (see :func:`reciprocal`)."""
    invariant = _Invariance(kw)
    for kn in loop.nodes:
        for v in unmasked(kn.body):
            if isinstance(v, (Op, Cast)) and invariant(v):
                kw.value(v, scope)
            elif _divides_by(v) and invariant(v.args[1]):  # type: ignore[attr-defined]
                kw.value(reciprocal(v), scope)  # type: ignore[arg-type]


def reciprocal(v: Op) -> Op:
    """``1 / d`` in double for a float division ``v`` by ``d``. Where a loop divides by a
    value it does not change (a softmax by its row's sum), the writer multiplies by this,
    computed once: a vector divide costs several multiplies (measured ~10% of a float32
    softmax over 1536x4096). In double, ``1 / d`` neither overflows nor loses bits for any
    float ``d`` (denormal, huge, zero, inf, NaN), and the product rounded to float equals
    the float quotient but where that lies within 2^-52 of a rounding tie."""
    return Op(torch.float64, name="reciprocal", args=(Cast(torch.float64, x=v.args[1]),))


def _divides_by(v: Value) -> bool:
    return (isinstance(v, Op) and v.name == "truediv" and v.dtype == torch.float32
            and all(a.dtype == torch.float32 for a in v.args))


def unmasked(v: Value) -> Iterator[Value]:
    """The values of a tree outside masked bodies (which do not always run, so they must not
    be moved or reused), children before parents."""
    for c in v.children():
        if c is not None and not isinstance(c, Masked):
            yield from unmasked(c)
    yield v


class _Invariance:
    """Whether a value is the same at every point of the r loops, memoised by identity."""

    def __init__(self, kw: KernelWriter) -> None:
        self.kw = kw
        self.r_vars = set(kw.k.r_vars)
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
            return self._fixed(v) and not v.indirect and not self._on_r(v.index)
        if isinstance(v, IndexValue):
            return not self._on_r(v.expr)
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
