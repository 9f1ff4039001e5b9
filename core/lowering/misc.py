"""Lowerings of tensor factories (full, arange, zeros), copies and casts, concatenation and
padding (masked loads), scans (cumsum, cumprod), masked fills and input mutation."""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from .. import ir
from ..errors import LoweringError
from ..ir import Expr
from .context import LoweringContext, capability, layout_from_meta, require_capability, split_unit_dims
from .pointwise import _where, check_dtype, check_scalar_fits, compute_dtype, pointwise
from .registry import lowering
from .values import Realized, TensorValue, broadcast_to, cast, const, lazy, to_dtype, to_sympy
from .views import _clamp_bounds

aten = torch.ops.aten


def _meta(ctx: LoweringContext) -> torch.Tensor:
    meta = ctx.out_meta
    if not isinstance(meta, torch.Tensor):
        raise LoweringError(ctx.origin, "no tensor result")
    return meta


def _meta_size(meta: torch.Tensor) -> tuple[Expr, ...]:
    return tuple(to_sympy(s) for s in meta.size())


def constant(ctx: LoweringContext, value: Any) -> TensorValue:
    meta = _meta(ctx)
    check_dtype(meta.dtype, ctx.origin)
    check_scalar_fits(ctx.origin, value, meta.dtype)
    v = const(value, meta.dtype)
    return lazy(meta.dtype, meta.device, _meta_size(meta), lambda idx: v)


@lowering(aten.full.default, aten.scalar_tensor.default)
def _full(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    value = args[1] if ctx.origin.startswith("aten.full") else args[0]
    return constant(ctx, value)


@lowering(aten.zeros.default, aten.empty.memory_format, aten.empty_strided.default,
          aten.new_empty.default, aten.new_zeros.default, aten.empty_like.default,
          aten.zeros_like.default, aten.new_empty_strided.default, aten.empty_permuted.default)
def _zeros(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    # empty* hands back zeros: defined contents cost one write and avoid reading garbage
    return constant(ctx, 0)


@lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    return constant(ctx, 1)


@lowering(aten.full_like.default, aten.new_full.default)
def _full_like(ctx: LoweringContext, x: TensorValue, *args: Any, **kwargs: Any) -> TensorValue:
    value = args[1] if "new_full" in ctx.origin else args[0]
    return constant(ctx, value)


@lowering(aten.fill.Scalar)
def _fill(ctx: LoweringContext, x: TensorValue, value: Any) -> TensorValue:
    return constant(ctx, value)


@lowering(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    meta = _meta(ctx)
    check_dtype(meta.dtype, ctx.origin)
    if ctx.origin.endswith("arange.default"):
        start, step = 0, 1
    else:
        start = args[0]
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    dtype = meta.dtype
    if isinstance(start, (int, torch.SymInt)) and isinstance(step, int):
        s0 = to_sympy(start)

        def fn(idx: list[Expr]) -> ir.Value:
            return cast(ir.IndexValue(torch.int64, expr=s0 + idx[0] * step), dtype)
    else:
        acc = torch.float64

        def fn(idx: list[Expr]) -> ir.Value:
            i = cast(ir.IndexValue(torch.int64, expr=idx[0]), acc)
            scaled = ir.Op(acc, name="mul", args=(i, const(step, acc)))
            return cast(ir.Op(acc, name="add", args=(const(start, acc), scaled)), dtype)
    return lazy(dtype, meta.device, _meta_size(meta), fn)


@lowering(torch.ops.prims.iota.default)
def _iota(ctx: LoweringContext, length: Any, *, start: int, step: int, **kwargs: Any) -> TensorValue:
    meta = _meta(ctx)
    return lazy(meta.dtype, meta.device, _meta_size(meta),
                lambda idx: cast(ir.IndexValue(torch.int64, expr=start + idx[0] * step), meta.dtype))


def copy_of(x: TensorValue, dtype: torch.dtype | None = None) -> TensorValue:
    """A lazy elementwise copy (so realizing it makes a new buffer, never an alias)."""
    dtype = dtype or x.dtype
    return lazy(dtype, x.device, x.size, lambda idx: cast(x.load(idx), dtype))


@lowering(aten.clone.default)
def _clone(ctx: LoweringContext, x: TensorValue, *, memory_format: Any = None) -> TensorValue:
    return copy_of(x)


@lowering(aten._to_copy.default)
def _to_copy(ctx: LoweringContext, x: TensorValue, *, dtype: torch.dtype | None = None,
             device: Any = None, layout: Any = None, pin_memory: Any = None,
             non_blocking: bool = False, memory_format: Any = None) -> TensorValue:
    if isinstance(x, (bool, int, float)):  # a number (vmap's graphs: ``_to_copy(2, dtype=...)``)
        return constant(ctx, x)
    if not isinstance(x, TensorValue):
        raise LoweringError(ctx.origin, f"a copy of {type(x).__name__}")
    if device is not None and torch.device(device) != x.device:
        raise LoweringError(ctx.origin, "copies between devices go through ATen")
    target = dtype or x.dtype
    check_dtype(target, ctx.origin)
    check_dtype(x.dtype, ctx.origin)
    return copy_of(x, target)


@lowering(aten.copy.default)
def _copy(ctx: LoweringContext, dst: TensorValue, src: TensorValue, non_blocking: bool = False) -> TensorValue:
    if src.device != dst.device:
        raise LoweringError(ctx.origin, "copies between devices go through ATen")
    return copy_of(broadcast_to(src, dst.size), dst.dtype)


@lowering(aten.copy_.default)
def _copy_(ctx: LoweringContext, dst: TensorValue, src: TensorValue, non_blocking: bool = False) -> TensorValue:
    """In-place copy into a graph input (AOTAutograd's input-mutation epilogue)."""
    if not isinstance(dst, Realized) or ctx.buffers.get(dst.name) is None:
        raise LoweringError(ctx.origin, "copy_ into a value that is not a buffer")
    if isinstance(src, TensorValue) and src.device != dst.device:
        raise LoweringError(ctx.origin, "copies between devices go through ATen")
    value = copy_of(broadcast_to(src, dst.size), dst.dtype) if isinstance(src, TensorValue) else None
    if value is None:
        raise LoweringError(ctx.origin, "copy_ from a scalar")
    ranges, idx = split_unit_dims(dst.size)
    name = ctx.new_name()
    storage = ctx.buffers[dst.name].storage or dst.name
    store_index = dst.layout.index(idx)
    body = value.load(idx)
    if _source_first(ctx, body, storage, store_index):
        # ``x[1:].copy_(x[:-1] * 2)``: one loop writing x while reading other elements of it
        # would read what it already wrote; eager computes the source first, and so does this.
        # Likewise where the source reads another input this graph has already written
        # (``a.add_(b); b.mul_(a)``: each write must wait for the other's read of the old
        # values, a cycle): the source, computed first, reads them before either write.
        body = ctx.realize(value).load(idx)
    ctx.add_buffer(name, dst.layout, storage=storage)
    ctx.add_node(ir.PointwiseNode(name, layout=dst.layout, ranges=ranges, body=body,
                                  store_index=store_index, mutates=storage))
    return Realized(dst.dtype, dst.device, dst.size, name, dst.layout)


def _source_first(ctx: LoweringContext, body: ir.Value, storage: str, store_index: Expr) -> bool:
    """Whether a write of ``body`` into ``storage`` must compute ``body`` into a buffer first:
    it loads ``storage``'s memory (the buffer itself or one written into it) at any index but
    ``store_index`` (a gather's index holds its data-dependent symbol, so it differs too), or
    the old value of another graph input an earlier node of the graph writes."""
    written = {n.mutates for n in ctx.nodes if isinstance(n, ir.PointwiseNode) and n.mutates} - {storage}
    for v in ir.walk(body):
        if not isinstance(v, ir.Load):
            continue
        buf = ctx.buffers.get(v.buffer)
        memory = buf.storage if buf is not None and buf.storage else v.buffer
        if memory in written:
            return True
        if memory == storage and v.index != store_index \
                and sympy.expand(sympy.sympify(v.index) - store_index) != 0:
            return True
    return False


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: LoweringContext, x: TensorValue, mask: TensorValue, value: Any) -> TensorValue:
    out = _meta(ctx).dtype
    check_scalar_fits(ctx.origin, value, out)
    return _where(ctx, mask, value, x) if out == x.dtype else pointwise("where", [mask, value, x], out)


def _in_range(e: Expr, lo: Expr, hi: Expr) -> ir.Value:
    v = ir.IndexValue(torch.int64, expr=e)
    ge = ir.Op(torch.bool, name="ge", args=(v, ir.IndexValue(torch.int64, expr=lo)))
    lt = ir.Op(torch.bool, name="lt", args=(v, ir.IndexValue(torch.int64, expr=hi)))
    return ir.Op(torch.bool, name="logical_and", args=(ge, lt))


@lowering(aten.cat.default)
def _cat(ctx: LoweringContext, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    meta = _meta(ctx)
    parts = [t for t in tensors if not (t.ndim == 1 and t.size[0] == 0)]
    if len(parts) > 16:
        raise LoweringError(ctx.origin, "concatenation of more than 16 tensors")
    if not parts:
        return constant(ctx, 0)
    dim = dim % parts[0].ndim
    dtype = meta.dtype
    check_dtype(dtype, ctx.origin)
    offsets: list[Expr] = []
    acc: Expr = sympy.Integer(0)
    for t in parts:
        offsets.append(acc)
        acc = acc + t.size[dim]

    def fn(idx: list[Expr]) -> ir.Value:
        # every part's load is masked: a plugin may evaluate all operands of a where
        result: ir.Value = const(0, dtype)
        for t, off in reversed(list(zip(parts, offsets))):
            src = list(idx)
            src[dim] = idx[dim] - off
            mask = _in_range(idx[dim], off, off + t.size[dim])
            masked = ir.Masked(dtype, mask=mask, body=cast(t.load(src), dtype), other=0)
            result = masked if result is None else ir.Op(dtype, name="where", args=(mask, masked, result))
        return result

    return lazy(dtype, meta.device, _meta_size(meta), fn)


@lowering(aten.constant_pad_nd.default)
def _pad(ctx: LoweringContext, x: TensorValue, pad: Sequence[Any], value: Any = 0) -> TensorValue:
    meta = _meta(ctx)
    check_dtype(x.dtype, ctx.origin)
    los = [sympy.Integer(0)] * x.ndim
    for k in range(len(pad) // 2):
        los[x.ndim - 1 - k] = to_sympy(pad[2 * k])

    def fn(idx: list[Expr]) -> ir.Value:
        src = [i - lo for i, lo in zip(idx, los)]
        conds = [_in_range(s, sympy.Integer(0), n) for s, n, lo, i in zip(src, x.size, los, idx)]
        mask: ir.Value | None = None
        for c in conds:
            mask = c if mask is None else ir.Op(torch.bool, name="logical_and", args=(mask, c))
        body = x.load(src)
        if mask is None:
            return body
        return ir.Op(x.dtype, name="where", args=(mask, ir.Masked(x.dtype, mask=mask, body=body, other=0),
                                                  const(value, x.dtype)))

    return lazy(x.dtype, x.device, _meta_size(meta), fn)


@lowering(aten.cumsum.default, aten.cumprod.default)
def _scan(ctx: LoweringContext, x: TensorValue, dim: int, *, dtype: torch.dtype | None = None) -> TensorValue:
    meta = _meta(ctx)
    out = meta.dtype
    check_dtype(out, ctx.origin)
    check_dtype(x.dtype, ctx.origin)
    require_capability(x.device, "scans", ctx.origin)
    combine = "sum" if "cumsum" in ctx.origin else "prod"
    if x.ndim == 0:
        return copy_of(x, out)
    dim = dim % x.ndim
    acc = compute_dtype(out)
    if acc == torch.float32 and out == torch.float32 and capability(x.device, "float32_scans_in_float64", False):
        acc = torch.float64  # the device's eager scans keep a double running value
    layout = layout_from_meta(meta) or ir.Layout(out, x.device, x.size, ir.contiguous_strides(x.size))
    ranges: list[Expr] = []
    idx: list[Expr] = []
    for d, n in enumerate(x.size):
        if d == dim:
            idx.append(sympy.Symbol("r0", integer=True, nonnegative=True))
        elif n == 1:
            idx.append(sympy.Integer(0))
        else:
            idx.append(sympy.Symbol(f"x{len(ranges)}", integer=True, nonnegative=True))
            ranges.append(n)
    name = ctx.new_name()
    ctx.add_buffer(name, layout)
    ctx.add_node(ir.ScanNode(name, layout=layout, ranges=tuple(ranges), scan_range=x.size[dim],
                             combine=combine, body=cast(x.load(idx), acc),
                             store_index=layout.index(idx), acc_dtype=acc))
    return Realized(out, x.device, tuple(x.size), name, layout)


__all__ = ["constant", "copy_of", "to_dtype"]


@lowering(aten.slice_scatter.default)
def _slice_scatter(ctx: LoweringContext, x: TensorValue, src: TensorValue, dim: int = 0,
                   start: Any = None, end: Any = None, step: int = 1) -> TensorValue:
    """``x`` with ``src`` written over ``x[..., start:end, ...]`` (a masked select)."""
    if step != 1:
        raise LoweringError(ctx.origin, "slice_scatter with a step")
    dim = dim % x.ndim
    lo, _ = _clamp_bounds(x.size[dim], start, end)
    dtype = x.dtype

    def fn(idx: list[Expr]) -> ir.Value:
        offset = idx[dim] - lo
        inside = _in_range(offset, sympy.Integer(0), src.size[dim])
        src_idx = list(idx)
        src_idx[dim] = offset
        body = cast(src.load(src_idx), dtype)
        masked = ir.Masked(dtype, mask=inside, body=body, other=0)
        return ir.Op(dtype, name="where", args=(inside, masked, x.load(idx)))

    return lazy(dtype, x.device, x.size, fn)
