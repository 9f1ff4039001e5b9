"""Masked loads whose mask is the same along a pointwise kernel's innermost loop (a pooling
window's tap, which lies in the padding for a whole row of channels-last channels; a ``cat``
of NCHW tensors, whose source changes with the channel only) read through a pointer chosen
once per row: the row of the loaded buffer where the mask holds, else a row filled with the
masked value. The inner loop then reads one contiguous row with no branch, and vectorises.

Written as an ``if`` around the load, GCC 12 vectorised none of these loops: a 3x3 stride-2
max pool of 8x64x56x56 channels-last floats took 5.2 ms on one thread (ATen's kernel 1.1 ms).

Only a top-level ``Masked`` (not inside another's body, so its mask is computed wherever the
value is) whose mask is loop-invariant and safe to compute before the loop, over a loop of a
known length, whose body reads memory the kernel does not write at indices that step by one
along the loop (or stay put). A bare load (or a cast of one, where the masked value survives
the round trip through the load's type) reads a fill row of the masked value; any other body
(a producer inlined into a pooling window's taps: ``relu(x * w + b)``) is computed from fill
rows of zeros where the mask fails, no integer division among its ops, and the masked value
selected after it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import sympy
import torch

from coil.sdk import Cast, Const, IndexValue, Load, Masked, Op, Value, walk
from coil.sdk.codegen import ValueScope

from .hoist import invariance, unmasked
from .optable import BUFFER_CTYPES, CTYPES, integer_division, literal

if TYPE_CHECKING:
    from .codegen import KernelWriter

#: Longest inner loop a fill row is made for (a stack array of this many elements at most).
MAX_ROW = 8192


@dataclass(frozen=True)
class MaskedRow:
    """One masked value read through row pointers: its loads, each with the fill row it falls
    back to, and whether it is a bare load (its fill row then holds the masked value, and no
    select is needed)."""

    loads: tuple[Load, ...]
    fills: tuple[str, ...]
    bare: bool


class MaskedRows:
    """The masked values of one kernel's bodies read through row pointers (``plan``), their
    fill rows (``declare``, before the loop nest) and pointers (``bind``, once per row)."""

    def __init__(self, kw: KernelWriter, var: sympy.Symbol, length: sympy.Expr) -> None:
        self.kw = kw
        self.var = var
        self.length = length
        self.rows: dict[Masked, MaskedRow] = {}
        self.fills: dict[tuple[torch.dtype, str], str] = {}
        self.written = {s for loop in kw.k.loops for kn in loop.nodes for s in kn.stores}
        #: Per planned value, for the row being written: its mask's local and its loads' pointers.
        self.masks: dict[Masked, str] = {}
        self.pointers: dict[tuple[str, Load], str] = {}

    def plan(self, bodies: list[Value]) -> MaskedRows:
        if not (self.length.is_number and 0 < int(self.length) <= MAX_ROW):
            return self
        invariant = invariance(self.kw, {self.var})
        for body in bodies:
            for v in top_level_masked(body):
                if v not in self.rows and invariant(v.mask):  # type: ignore[arg-type]
                    row = self._row(v)
                    if row is not None:
                        self.rows[v] = row
        return self

    def _row(self, v: Masked) -> MaskedRow | None:
        body = v.body.x if isinstance(v.body, Cast) else v.body  # type: ignore[union-attr]
        if isinstance(body, Load) and (body is v.body or _survives(v.other, body.dtype)):
            if not self._contiguous(body):
                return None
            return MaskedRow((body,), (self._fill(body.dtype, literal(v.other, body.dtype)),), True)
        loads = []
        for x in walk(v.body):  # type: ignore[arg-type]
            if isinstance(x, Load):
                if not self._contiguous(x):
                    return None
                loads.append(x)
            elif integer_division(x):  # a fill row's values may divide by zero
                return None
            elif not isinstance(x, (Op, Cast, Const, IndexValue)):
                return None
        loads = list(dict.fromkeys(loads))
        return MaskedRow(tuple(loads), tuple(self._fill(x.dtype, literal(0, x.dtype)) for x in loads), False)

    def _contiguous(self, load: Load) -> bool:
        """A load of memory the kernel does not write, stepping by one along the loop or not
        moving along it."""
        if load.indirect or load.buffer in self.kw.locals or load.buffer in self.kw.k.internal:
            return False
        if load.buffer in self.written:
            return False
        index = sympy.expand(sympy.sympify(load.index))
        return sympy.expand(index - index.subs(self.var, 0)) in (self.var, 0)

    def _fill(self, dtype: torch.dtype, value: str) -> str:
        return self.fills.setdefault((dtype, value), f"fill{len(self.fills)}")

    def declare(self) -> None:
        """The fill rows, before the loop nest (read-only, so the threads share them)."""
        if not self.fills:
            return
        n = int(self.length)
        for (dtype, fill_value), name in self.fills.items():
            self.kw.w.line(f"alignas(64) {BUFFER_CTYPES[dtype]} {name}[{n}];")
            self.kw.w.line(f"std::fill_n({name}, {n}, {fill_value});")

    def bind(self, row: ValueScope[str]) -> None:
        """Each planned value's mask and its loads' pointers, for the row the enclosing loops
        are at."""
        self.masks, self.pointers = {}, {}
        for v, planned in self.rows.items():
            mask = self.kw.value(v.mask, row)  # type: ignore[arg-type]
            self.masks[v] = mask
            for load, fill in zip(planned.loads, planned.fills):
                if (mask, load) in self.pointers:
                    continue
                base = sympy.sympify(load.index).subs(self.var, 0)
                name = f"p{len(self.pointers)}"
                self.kw.w.line(f"const {BUFFER_CTYPES[load.dtype]}* {name} = {mask} ? "
                               f"{load.buffer} + {self.kw.idx(base)} : {fill};")
                self.pointers[mask, load] = name

    def read(self, v: Masked, scope: ValueScope[str]) -> str | None:
        """The expression for ``v`` in the inner loop, if it reads through row pointers: the
        body computed from the pointers' rows, then the masked value selected where the mask
        (the same along the row) fails."""
        planned = self.rows.get(v) if self.masks else None
        if planned is None:
            return None
        inner = scope.child()
        for load in planned.loads:
            moves = self.var in sympy.sympify(load.index).free_symbols
            inner[load] = f"{self.pointers[self.masks[v], load]}[{self.var.name if moves else 0}]"
        body = self.kw.value(v.body, inner)  # type: ignore[arg-type]
        if planned.bare:
            return body
        return f"coil::row_select<{CTYPES[v.dtype]}>({self.masks[v]}, {body}, {literal(v.other, v.dtype)})"


def top_level_masked(v: Value) -> Iterator[Masked]:
    """The ``Masked`` values of a tree that are not inside another's body."""
    if isinstance(v, Masked):
        yield v
        return
    for c in unmasked(v):
        for child in c.children():
            if isinstance(child, Masked):
                yield child


def _survives(value: object, dtype: torch.dtype) -> bool:
    """Whether ``value`` converted to ``dtype`` and back is itself (NaN counting as NaN)."""
    if not dtype.is_floating_point or not isinstance(value, (int, float)):
        return False
    back = torch.tensor(value, dtype=torch.float64).to(dtype).double().item()
    return back == value or (math.isnan(back) and math.isnan(float(value)))
