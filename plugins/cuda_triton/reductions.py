"""How each reduction type is written in Triton, in both kernel shapes.

* persistent: the whole reduced row sits in one ``[XBLOCK, RBLOCK]`` block; masked lanes
  are set to the reduction's identity and the block is reduced along axis 1 at once
  (Welford is two exact passes over the registers: the mean, then squared deviations);
* looped: an ``[XBLOCK, RBLOCK]`` block of per-lane states is updated once per block of the
  row, then the lanes are combined along axis 1 (Welford combines (mean, m2, count)).

Results keep the reduced axis (``[XBLOCK, 1]``) so they broadcast against the block."""
from __future__ import annotations

import torch

from coil.sdk import CodeWriter
from coil.sdk.codegen import reduction_identity

from .optable import compute, literal

BLOCK = "[XBLOCK, RBLOCK]"


#: The neutral element of a reduction (for masked lanes and initial states), under the name
#: the split strategy imports.
identity = reduction_identity


def combine_fn(kind: str, dtype: torch.dtype) -> str:
    """The name of the function that combines two states of a reduction (for ``tl.reduce``
    and the looped update): :mod:`.runtime_lib`'s (NaN-propagating) for floats, Triton's own
    for integers."""
    if kind in ("max", "argmax"):
        return "max_nan" if dtype.is_floating_point else "tl.maximum"
    if kind in ("min", "argmin"):
        return "min_nan" if dtype.is_floating_point else "tl.minimum"
    return {"sum": "add_combine", "prod": "mul_combine", "any": "or_combine", "all": "and_combine"}[kind]


def reduce_block(kind: str, acc: str, dtype: torch.dtype) -> str:
    """Reduce a block of states along axis 1, keeping the axis (Triton's ``tl.max``/``tl.min``
    for integers: ``tl.reduce`` takes only jitted combine functions, not ``tl.maximum``)."""
    if kind == "sum":
        return f"tl.sum({acc}, 1)[:, None]"
    if kind in ("max", "min") and not dtype.is_floating_point:
        return f"tl.{kind}({acc}, 1)[:, None]"
    return f"tl.reduce({acc}, 1, {combine_fn(kind, dtype)})[:, None]"


class Reduction:
    """The code of one reduction node: state, update per block, and final results."""

    def __init__(self, name: str, kind: str, acc_dtype: torch.dtype, value_dtype: torch.dtype) -> None:
        self.name = name
        self.kind = kind
        self.acc_dtype = acc_dtype
        self.value_dtype = value_dtype
        self.acc_t = compute(acc_dtype)

    def _value(self, v: str, mask: str | None) -> str:
        """The body value as a full block, cast to the accumulator type, masked lanes neutral."""
        kind = self.kind
        if kind in ("any", "all"):
            v = f"({v} != 0)"
            cast = "tl.int1"
        elif kind in ("argmax", "argmin"):
            cast = compute(self.value_dtype)
        else:
            cast = self.acc_t
        full = f"tl.broadcast_to(({v}).to({cast}), {BLOCK})"
        if mask is None or kind == "welford":
            return full
        dtype = torch.bool if kind in ("any", "all") else (
            self.value_dtype if kind in ("argmax", "argmin") else self.acc_dtype)
        neutral = literal(reduction_identity(kind, dtype), dtype, "[1, 1]")
        return f"tl.where({mask}, {full}, {neutral})"

    # -- persistent: the whole row at once

    def persistent(self, w: CodeWriter, v: str, mask: str | None, rindex: str, rnumel: str) -> list[str]:
        """Lines reducing a whole row; returns the names of the results ([XBLOCK, 1])."""
        n, kind = self.name, self.kind
        w.line(f"{n}_v = {self._value(v, mask)}")
        if kind == "welford":
            zero = "0.0"
            masked = f"tl.where({mask}, {n}_v, {zero})" if mask else f"{n}_v"
            w.line(f"{n}_mean = tl.sum({masked}, 1)[:, None] / ({rnumel})")
            dev = f"{n}_v - {n}_mean"
            w.line(f"{n}_d = tl.where({mask}, {dev}, {zero})" if mask else f"{n}_d = {dev}")
            w.line(f"{n}_m2 = tl.sum({n}_d * {n}_d, 1)[:, None]")
            return [f"{n}_mean", f"{n}_m2"]
        if kind in ("argmax", "argmin"):
            w.line(f"{n}_i = tl.broadcast_to({rindex}, {BLOCK}).to(tl.int64)")
            w.line(f"_, {n}_r = tl.reduce(({n}_v, {n}_i), 1, {kind}_combine)")
            return [f"{n}_r[:, None]"]
        w.line(f"{n}_r = {reduce_block(kind, f'{n}_v', self.acc_dtype)}")
        return [f"{n}_r"]

    # -- looped: per-lane states over blocks of the row

    def declare(self, w: CodeWriter) -> None:
        n, kind = self.name, self.kind
        if kind == "welford":
            for field in ("mean", "m2", "n"):
                w.line(f"{n}_{field} = tl.zeros({BLOCK}, {self.acc_t})")
            return
        if kind in ("argmax", "argmin"):
            init = literal(reduction_identity(kind, self.value_dtype), self.value_dtype, BLOCK)
            w.line(f"{n}_acc = {init}")
            w.line(f"{n}_idx = tl.zeros({BLOCK}, tl.int64)")
            return
        dtype = torch.bool if kind in ("any", "all") else self.acc_dtype
        w.line(f"{n}_acc = {literal(reduction_identity(kind, dtype), dtype, BLOCK)}")

    def update(self, w: CodeWriter, v: str, mask: str | None, rindex: str) -> None:
        n, kind = self.name, self.kind
        w.line(f"{n}_v = {self._value(v, mask)}")
        keep = (lambda new, old: f"tl.where({mask}, {new}, {old})") if mask else (lambda new, old: new)
        if kind == "welford":
            w.line(f"{n}_n1 = {n}_n + 1.0")
            w.line(f"{n}_delta = {n}_v - {n}_mean")
            w.line(f"{n}_mean1 = {n}_mean + {n}_delta / {n}_n1")
            w.line(f"{n}_m2 = {keep(f'{n}_m2 + {n}_delta * ({n}_v - {n}_mean1)', f'{n}_m2')}")
            w.line(f"{n}_mean = {keep(f'{n}_mean1', f'{n}_mean')}")
            w.line(f"{n}_n = {keep(f'{n}_n1', f'{n}_n')}")
            return
        if kind in ("argmax", "argmin"):
            w.line(f"{n}_i = tl.broadcast_to({rindex}, {BLOCK}).to(tl.int64)")
            w.line(f"{n}_acc, {n}_idx = {kind}_combine({n}_acc, {n}_idx, {n}_v, {n}_i)")
            return
        w.line(f"{n}_acc = {combine_fn(kind, self.acc_dtype)}({n}_acc, {n}_v)")

    def finish(self, w: CodeWriter) -> list[str]:
        n, kind = self.name, self.kind
        if kind == "welford":
            mean, m2, _ = welford_lanes(w, n, f"{n}_mean", f"{n}_m2", f"{n}_n")
            return [mean, m2]
        if kind in ("argmax", "argmin"):
            w.line(f"_, {n}_r = tl.reduce(({n}_acc, {n}_idx), 1, {kind}_combine)")
            return [f"{n}_r[:, None]"]
        dtype = torch.bool if kind in ("any", "all") else self.acc_dtype
        w.line(f"{n}_r = {reduce_block(kind, f'{n}_acc', dtype)}")
        return [f"{n}_r"]


def welford_lanes(w: CodeWriter, name: str, mean: str, m2: str, count: str) -> list[str]:
    """Lines combining ``[XBLOCK, N]`` blocks of Welford states along axis 1 at once (Chan's
    formula for many groups: the counts' sum, the count-weighted mean, then each group's m2
    plus its count times its squared distance to that mean); returns the names of the mean,
    m2 and count (``[XBLOCK, 1]``). States of count 0 (masked lanes, empty chunks) weigh
    nothing. Three sums, where ``tl.reduce`` with a combining function folds pairs one by
    one (Triton's interpreter, which CI runs, takes a Python call per pair)."""
    w.line(f"{name}_cnt = tl.sum({count}, 1)[:, None]")
    w.line(f"{name}_cmean = tl.sum({mean} * {count}, 1)[:, None] / tl.where({name}_cnt == 0, 1.0, {name}_cnt)")
    w.line(f"{name}_dev = tl.where({count} == 0, 0.0, {mean} - {name}_cmean)")
    w.line(f"{name}_cm2 = tl.sum({m2} + {count} * {name}_dev * {name}_dev, 1)[:, None]")
    return [f"{name}_cmean", f"{name}_cm2", f"{name}_cnt"]
