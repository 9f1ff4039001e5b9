"""Lowerings of indirect indexing (index, gather, index_select, embedding) as loads with
data-dependent ``Indirect`` indices, and of scatter writes (scatter, scatter_add,
scatter_reduce, index_put) as ``ScatterNode``s."""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any, Sequence

import sympy
import torch

from .. import ir
from ..errors import LoweringError
from ..ir import Expr
from .context import LoweringContext, layout_from_meta, require_capability, split_unit_dims
from .pointwise import check_dtype
from .registry import lowering
from .values import Lazy, Realized, TensorValue, broadcast_shapes, broadcast_to, cast, const, lazy
from .views import unsqueeze

aten = torch.ops.aten


def indirect(ctx: LoweringContext, index: ir.Value, size: Expr, wrap: bool = True) -> ir.Indirect:
    """``index`` (a Value) as an index into a dim of ``size``; ``wrap``: a negative one counts
    from the end, as Python's indexing (else eager rejects it, as out of range)."""
    symbol = sympy.Symbol(ctx.new_name("ind"), integer=True)
    return ir.Indirect(torch.int64, symbol=symbol, value=cast(index, torch.int64), size=size, wrap=wrap)


def load_indirect(x: Realized, src: Sequence[Expr], inds: Sequence[ir.Indirect]) -> ir.Value:
    return ir.Load(x.dtype, buffer=x.name, index=x.layout.index(list(src)), indirect=tuple(inds))


def inline_indirect(x: Lazy, src: Sequence[Expr], inds: Sequence[ir.Indirect]) -> ir.Value | None:
    """``x``'s body at a data-dependent index, when every use of the indirect variables sits
    in a load (which then carries them); None when the body uses them otherwise (as data)."""
    body = x.load(list(src))
    symbols = {ind.symbol for ind in inds}
    for v in ir.walk(body):
        if isinstance(v, ir.IndexValue) and v.expr.free_symbols & symbols:
            return None
        if isinstance(v, ir.Indirect) and sympy.sympify(v.size).free_symbols & symbols:
            return None

    def attach(ld: ir.Load) -> ir.Value | None:
        if ld.index.free_symbols & symbols:
            return dataclasses.replace(ld, indirect=(*ld.indirect, *inds))
        return None

    return ir.replace_loads(body, attach)


def _check_index(ctx: LoweringContext, idx: TensorValue) -> None:
    if idx.dtype in (torch.bool, torch.uint8):
        raise LoweringError(ctx.origin, "boolean-mask indexing has a data-dependent shape")


@dataclass
class AdvancedIndex:
    """Where advanced indexing puts things: the broadcast index shape ``bshape`` occupies
    ``b_start..`` of the result (in place when the indexed dims are adjacent, else in
    front); ``before``/``after`` are the input dims around it."""

    tensors: dict[int, TensorValue]
    bshape: tuple[Expr, ...]
    before: list[int]
    after: list[int]
    b_start: int
    size: list[Expr]
    #: Whether negative indices count from the end (``x[idx]``); index_select and embedding,
    #: lowered through it, reject them as eager does.
    wrap: bool = True

    def source(self, ctx: LoweringContext, x: TensorValue, idx: Sequence[Expr]
               ) -> tuple[list[Expr], list[ir.Indirect]]:
        """The input index (and its indirect variables) for result index ``idx``."""
        nb = len(self.bshape)
        src: list[Expr] = [sympy.Integer(0)] * x.ndim
        for k, d in enumerate(self.before):
            src[d] = idx[k]
        for k, d in enumerate(self.after):
            src[d] = idx[self.b_start + nb + k]
        inds = []
        for d, t in self.tensors.items():
            ind = indirect(ctx, t.load(list(idx[self.b_start:self.b_start + nb])), x.size[d], self.wrap)
            inds.append(ind)
            src[d] = ind.symbol
        return src, inds


def advanced_index(ctx: LoweringContext, x: TensorValue,
                   indices: Sequence[TensorValue | None]) -> AdvancedIndex | None:
    positions = [i for i, t in enumerate(indices) if t is not None]
    if not positions:
        return None
    for i in positions:
        _check_index(ctx, indices[i])  # type: ignore[arg-type]
    bshape = broadcast_shapes(*(indices[i].size for i in positions))  # type: ignore[union-attr]
    tensors = {i: broadcast_to(indices[i], bshape) for i in positions}  # type: ignore[arg-type]
    rest = [d for d in range(x.ndim) if d not in positions]
    if positions == list(range(positions[0], positions[-1] + 1)):
        before = [d for d in rest if d < positions[0]]
        after = [d for d in rest if d > positions[-1]]
    else:
        before, after = [], rest
    size = [x.size[d] for d in before] + list(bshape) + [x.size[d] for d in after]
    return AdvancedIndex(tensors, bshape, before, after, len(before), size)


@lowering(aten.index.Tensor)
def _index(ctx: LoweringContext, x: TensorValue, indices: Sequence[TensorValue | None],
           wrap: bool = True) -> TensorValue:
    x = ctx.realize(x)
    check_dtype(x.dtype, ctx.origin)
    plan = advanced_index(ctx, x, indices)
    if plan is None:
        return x
    plan.wrap = wrap

    def fn(idx: list[Expr]) -> ir.Value:
        src, inds = plan.source(ctx, x, idx)
        return load_indirect(x, src, inds)

    return lazy(x.dtype, x.device, plan.size, fn)


@lowering(aten.index_select.default)
def _index_select(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    dim = dim % max(x.ndim, 1)
    if x.ndim == 0:
        raise LoweringError(ctx.origin, "index_select of a 0-dim tensor")
    if index.ndim == 0:
        index = unsqueeze(index, 0)
    return _index(ctx, x, [None] * dim + [index], wrap=False)


@lowering(aten.embedding.default)
def _embedding(ctx: LoweringContext, weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> TensorValue:
    return _index(ctx, weight, [indices], wrap=False)


@lowering(aten.gather.default)
def _gather(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue,
            *, sparse_grad: bool = False) -> TensorValue:
    check_dtype(x.dtype, ctx.origin)
    if index.ndim != x.ndim and x.ndim != 0:
        raise LoweringError(ctx.origin, "index and input ranks differ")
    # a cheap pointwise input is read where the index points instead of being written out
    # whole first (cross-entropy gathers one element per row of a log-softmax)
    inline = isinstance(x, Lazy) and x.ndim != 0 and \
        ir.op_count(x.load(list(x.size))) <= ctx.config.realize_opcount_threshold
    if not inline:
        x = ctx.realize(x)
    if x.ndim == 0:  # every index must be 0 (eager raises otherwise): the library checks
        raise LoweringError(ctx.origin, "gather from a 0-dim tensor")
    dim = dim % x.ndim
    realized: list[Realized] = []

    def fn(idx: list[Expr]) -> ir.Value:
        ind = indirect(ctx, index.load(idx), x.size[dim], wrap=False)
        src = list(idx)
        src[dim] = ind.symbol
        if inline and not realized:
            got = inline_indirect(x, src, [ind])  # type: ignore[arg-type]
            if got is not None:
                return got
            realized.append(ctx.realize(x))
        base = realized[0] if realized else x
        return load_indirect(base, src, [ind])  # type: ignore[arg-type]

    return lazy(x.dtype, x.device, index.size, fn)


# ----------------------------------------------------------------------------- scatter


def _scatter_node(ctx: LoweringContext, base: TensorValue, src_size: Sequence[Expr],
                  target: Any, value: Any, accumulate: ir.ScatterAccumulate | None) -> Realized:
    """``target(s) -> (dst index list, indirects)``; ``value(s) -> Value``; the buffer in
    ``base``'s dtype (which may be wider than the op's result)."""
    dtype = base.dtype
    check_dtype(dtype, ctx.origin)
    require_capability(base.device, "scatter", ctx.origin)
    layout = layout_from_meta(ctx.out_meta) or ir.Layout(
        dtype, base.device, tuple(base.size), ir.contiguous_strides(base.size))
    if layout.dtype != dtype:
        layout = dataclasses.replace(layout, dtype=dtype)
    ranges, idx = split_unit_dims(base.size, "x")
    src_ranges, sidx = split_unit_dims(src_size, "r")
    dst, inds = target(sidx)
    name = ctx.new_name()
    ctx.add_buffer(name, layout)
    ctx.add_node(ir.ScatterNode(
        name, layout=layout, ranges=ranges, base=base.load(idx), store_index=layout.index(idx),
        src_ranges=src_ranges, value=cast(value(sidx), dtype), target_index=layout.index(dst),
        target_indirect=tuple(inds), accumulate=accumulate))
    return Realized(dtype, base.device, tuple(base.size), name, layout)


def _scatter_dim(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: Any,
                 accumulate: ir.ScatterAccumulate | None) -> Realized:
    if x.ndim == 0:
        raise LoweringError(ctx.origin, "scatter into a 0-dim tensor")
    dim = dim % x.ndim

    def target(s: list[Expr]) -> tuple[list[Expr], list[ir.Indirect]]:
        ind = indirect(ctx, index.load(s), x.size[dim], wrap=False)
        dst = list(s)
        dst[dim] = ind.symbol
        return dst, [ind]

    def value(s: list[Expr]) -> ir.Value:
        if isinstance(src, TensorValue):
            return src.load(s)
        return const(src, x.dtype)

    if accumulate == "add" and x.dtype in (torch.float16, torch.bfloat16):
        # eager's CPU scatter_add and scatter_reduce("sum") add a half type in float32 and
        # round once (index_add and index_put round each add); rounding each add, a bf16
        # sum of 5000 ones stopped at 256 (found by a hunt, session 38)
        f32 = torch.float32
        wide = _scatter_node(ctx, lazy(f32, x.device, x.size, lambda idx: cast(x.load(idx), f32)),
                             index.size, target, value, accumulate)
        return lazy(x.dtype, x.device, tuple(x.size), lambda idx: cast(wide.load(idx), x.dtype))
    return _scatter_node(ctx, x, index.size, target, value, accumulate)


@lowering(aten.scatter.src, aten.scatter.value)
def _scatter(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: Any) -> TensorValue:
    if x.ndim and index.ndim == x.ndim:
        one_per_line = _one_per_line(ctx, x, dim % x.ndim, index, src)
        if one_per_line is not None:
            return one_per_line
    return _scatter_dim(ctx, x, dim, index, src, None)


def _one_per_line(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue,
                  src: Any) -> TensorValue | None:
    """A scatter writing one element per line along ``dim`` (``index`` of size 1 there and
    ``x``'s size elsewhere) as a pointwise select: element ``i`` is ``src`` where ``i`` is its
    line's index, else ``x``. Cross-entropy's backward scatters a one-hot this way (GPT-2:
    8192 rows of 50257); as a select it fuses with what reads it instead of being written
    whole first. None where the shapes differ (the general scatter)."""
    # sizes compared as written (symbols stay symbols): a size that differs only in how it
    # is spelled takes the general scatter, which is right as well
    if index.size[dim] != 1 or any(index.size[d] != x.size[d] for d in range(x.ndim) if d != dim):
        return None
    if isinstance(src, TensorValue) and tuple(src.size) != tuple(index.size):
        return None
    dtype = x.dtype
    check_dtype(dtype, ctx.origin)

    def fn(idx: list[Expr]) -> ir.Value:
        line = list(idx)
        line[dim] = sympy.Integer(0)
        # the line's index as an Indirect used as a value: checked against the dim's size
        # (eager raises for one outside it, which no element would match)
        hit = ir.Op(torch.bool, name="eq", args=(ir.IndexValue(torch.int64, expr=idx[dim]),
                                                 indirect(ctx, index.load(line), x.size[dim], wrap=False)))
        value = src.load(line) if isinstance(src, TensorValue) else const(src, dtype)
        return ir.Op(dtype, name="where", args=(hit, cast(value, dtype), x.load(idx)))

    return lazy(dtype, x.device, tuple(x.size), fn)


@lowering(aten.scatter_add.default)
def _scatter_add(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: TensorValue) -> TensorValue:
    return _scatter_dim(ctx, x, dim, index, src, "add")


@lowering(aten.scatter_reduce.two)
def _scatter_reduce(ctx: LoweringContext, x: TensorValue, dim: int, index: TensorValue, src: TensorValue,
                    reduce: str, *, include_self: bool = True) -> TensorValue:
    modes: dict[str, ir.ScatterAccumulate] = {"sum": "add", "prod": "mul", "amax": "amax", "amin": "amin"}
    if reduce not in modes or not include_self:
        raise LoweringError(ctx.origin, f"reduce={reduce!r}, include_self={include_self}")
    return _scatter_dim(ctx, x, dim, index, src, modes[reduce])


@lowering(aten.index_put.default)
def _index_put(ctx: LoweringContext, x: TensorValue, indices: Sequence[TensorValue | None],
               values: TensorValue, accumulate: bool = False) -> TensorValue:
    if values.dtype != x.dtype:  # ATen's index_put raises ("... dtypes match"); so does eager
        raise LoweringError(ctx.origin, f"values of {values.dtype} into {x.dtype}")
    plan = advanced_index(ctx, x, indices)
    if plan is None:
        raise LoweringError(ctx.origin, "index_put without indices")
    vals = broadcast_to(values, plan.size)
    return _scatter_node(ctx, x, plan.size, lambda s: plan.source(ctx, x, s), vals.load,
                         "add" if accumulate else None)


__all__ = ["indirect", "load_indirect"]
