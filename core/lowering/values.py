"""Tensor values during lowering: ``Lazy`` (an unrealized pointwise body, composed into its
users) and ``Realized`` (a buffer seen through a strided layout, which covers views)."""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sympy
import torch

from .. import ir, symbolic
from ..errors import LoweringError
from ..ir import Expr, Layout, Value


@dataclass
class TensorValue:
    dtype: torch.dtype
    device: torch.device
    size: tuple[Expr, ...]

    def load(self, idx: Sequence[Expr]) -> Value:
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        return len(self.size)


@dataclass
class Lazy(TensorValue):
    """A pointwise body not yet written to memory; users inline it."""

    fn: Callable[[list[Expr]], Value]
    #: The ATen ops whose bodies this value inlines (for kernel names and reports).
    origins: tuple[str, ...] = ()
    #: For a view of another value: (base, rebuild). Realizing writes the base and views it
    #: again with ``rebuild(realized_base)``, so the buffer keeps the base's loop structure.
    view_of: "tuple[TensorValue, Callable[[TensorValue], TensorValue]] | None" = None

    def load(self, idx: Sequence[Expr]) -> Value:
        return self.fn(list(idx))


@dataclass
class Realized(TensorValue):
    """Buffer ``name`` seen through ``layout`` (a strided view of its storage)."""

    name: str
    layout: Layout

    def load(self, idx: Sequence[Expr]) -> Value:
        return ir.Load(self.dtype, buffer=self.name, index=self.layout.index(list(idx)))


def lazy(dtype: torch.dtype, device: torch.device, size: Sequence[Expr],
         fn: Callable[[list[Expr]], Value]) -> Lazy:
    return Lazy(dtype, device, tuple(size), fn)


def cast(v: Value, dtype: torch.dtype) -> Value:
    if v.dtype == dtype:
        return v
    if isinstance(v, ir.Const):
        return ir.Const(dtype, value=_convert_const(v.value, dtype))
    return ir.Cast(dtype, x=v)


def _convert_const(value: object, dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return bool(value)
    if dtype in (torch.float16, torch.bfloat16):
        return _half(float(value), dtype)  # type: ignore[arg-type]
    if dtype.is_floating_point:
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return value
    return int(value)  # type: ignore[call-overload]


@functools.lru_cache(maxsize=1024)
def _half(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to a half type: a constant of that type holds what a tensor of it
    would (``torch.full((4,), 0.1, dtype=torch.float16)`` holds 0.0999755859375, and a
    consumer computing in float32 reads that)."""
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))


def const(value: object, dtype: torch.dtype) -> Value:
    """A scalar operand as a value. A symbolic size (a ``SymInt`` such as ``x.shape[0]`` under
    dynamic shapes) stays symbolic, an index expression used as data: converting it to a
    number would add a guard on the size (``Eq(s0, 3)``) and recompile for every size."""
    if isinstance(value, torch.SymInt):
        expr = to_sympy(value)
        if not expr.is_number:
            return cast(ir.IndexValue(torch.int64, expr=expr), dtype)
        value = int(expr)
    return ir.Const(dtype, value=_convert_const(value, dtype))


def to_sympy(x: object) -> Expr:
    """A Python int, SymInt or sympy expression as a sympy expression in Coil's own functions
    (torch's symbolic sizes use its own ``FloorDiv``, ``Max``... which plugins do not print)."""
    if isinstance(x, torch.SymInt):
        x = x.node.expr
    if isinstance(x, sympy.Basic):
        if x.is_Atom:
            return x
        return symbolic.from_torch(x)
    return sympy.Integer(int(x))  # type: ignore[arg-type]


def is_one(e: Expr) -> bool:
    return e == 1


def broadcast_shapes(*sizes: Sequence[Expr]) -> tuple[Expr, ...]:
    ndim = max((len(s) for s in sizes), default=0)
    out: list[Expr] = []
    for i in range(ndim):
        dim: Expr = sympy.Integer(1)
        for s in sizes:
            j = i - (ndim - len(s))
            if j < 0:
                continue
            if s[j] != 1:
                dim = s[j]
        out.append(dim)
    return tuple(out)


def broadcast_to(v: TensorValue, size: Sequence[Expr]) -> TensorValue:
    """``v`` expanded to ``size`` (index remapping, no copy)."""
    size = tuple(size)
    if tuple(v.size) == size:
        return v
    lead = len(size) - len(v.size)

    def fn(idx: list[Expr]) -> Value:
        src = [sympy.Integer(0) if v.size[j] == 1 else idx[j + lead] for j in range(len(v.size))]
        return v.load(src)

    return lazy(v.dtype, v.device, size, fn)


def to_dtype(v: TensorValue, dtype: torch.dtype) -> TensorValue:
    """``v`` converted elementwise to ``dtype`` (lazy)."""
    if v.dtype == dtype:
        return v
    return lazy(dtype, v.device, v.size, lambda idx: cast(v.load(idx), dtype))

def check_static_sizes(result: Any, meta: Any) -> Any:
    """A lowered value's sizes against the graph's metadata, where the metadata has a number:
    the same number, or a size 1 spelled symbolically (broadcasting, squeeze and expand
    decide on a literal 1; Dynamo's guards may have settled a size the lowering only knows
    as an expression). Otherwise ``LoweringError``: the op runs in ATen, reported. Returns
    ``result``."""
    if isinstance(result, (list, tuple)) and isinstance(meta, (list, tuple)) and len(result) == len(meta):
        for r, m in zip(result, meta):
            check_static_sizes(r, m)
        return result
    if not isinstance(result, TensorValue) or not isinstance(meta, torch.Tensor):
        return result
    if len(result.size) != meta.dim():
        raise LoweringError("sizes", f"rank {len(result.size)} against the graph's {meta.dim()}")
    for d, (got, want) in enumerate(zip(result.size, meta.shape)):
        if not isinstance(want, int):
            continue
        got = sympy.sympify(got)
        if (got.is_number and int(got) != want) or (not got.is_number and want == 1):
            raise LoweringError("sizes", f"dim {d} is {got}, the graph's {want}")
    return result

