"""Lowerings of reductions: sum, prod, amax/amin, argmax/argmin, any/all, mean, and a
one-pass Welford var_mean. Each becomes one ``ReductionNode`` whose body inlines its
pointwise producers; the scheduler fuses consumers (softmax, norms) into the same kernel.
A sum of a scaled one-hot (cross-entropy's backward) becomes a pointwise value instead
(:mod:`.onehot`)."""
from __future__ import annotations

import logging
from typing import Any, Sequence

import sympy
import torch

from .. import ir
from ..errors import LoweringError
from ..ir import Expr, Layout
from .context import LoweringContext, capability, layout_from_meta
from .onehot import sum_of_one_hot
from .pointwise import check_dtype, compute_dtype
from .registry import lowering
from .values import Realized, TensorValue, cast, lazy, to_dtype
from .views import reshape

aten = torch.ops.aten
log = logging.getLogger(__name__)


def _dims(x: TensorValue, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    nd = max(x.ndim, 1)
    return sorted({d % nd for d in dim})


def acc_dtype_for(rtype: str, dtype: torch.dtype) -> torch.dtype:
    if rtype in ("any", "all"):
        return torch.bool
    if rtype in ("sum", "prod") and (not dtype.is_floating_point):
        return torch.int64
    return compute_dtype(dtype)


def reduce(ctx: LoweringContext, x: TensorValue, dims: Sequence[int], keepdim: bool, rtype: str,
           out_dtype: torch.dtype, layout: Layout | None = None, acc: torch.dtype | None = None
           ) -> list[TensorValue]:
    """One ReductionNode reducing ``x`` over ``dims``, accumulating in ``acc`` (by default the
    type ``acc_dtype_for`` gives); returns its output buffer(s). A sum of a scaled one-hot over
    one dim is a pointwise value instead (:mod:`.onehot`)."""
    check_dtype(x.dtype, ctx.origin)
    check_dtype(out_dtype, ctx.origin)
    dims = list(dims)
    if x.ndim == 0:
        dims = []
    if rtype in ("max", "min", "argmax", "argmin") and any(x.size[d] == 0 for d in dims):
        # eager raises ("Expected reduction dim ... to have non-zero size"): the library call
        # will, where a loop would return its identity (-inf, and -1 for the index)
        raise LoweringError(ctx.origin, f"{rtype} over an empty dim has no value")
    out_size = tuple(sympy.Integer(1) if i in dims else n for i, n in enumerate(x.size)) if keepdim \
        else tuple(n for i, n in enumerate(x.size) if i not in dims)
    if layout is None or tuple(layout.size) != out_size or layout.dtype != out_dtype:
        layout = Layout(out_dtype, x.device, out_size, ir.contiguous_strides(out_size))
    ranges: list[Expr] = []
    rranges: list[Expr] = []
    rvars: list[sympy.Symbol] = []
    full_idx: list[Expr] = []
    out_idx: list[Expr] = []
    for i, n in enumerate(x.size):
        if i in dims:
            if n == 1:
                full_idx.append(sympy.Integer(0))
            else:
                rvars.append(sympy.Symbol(f"r{len(rranges)}", integer=True, nonnegative=True))
                full_idx.append(rvars[-1])
                rranges.append(n)
            if keepdim:
                out_idx.append(sympy.Integer(0))
        else:
            if n == 1:
                v: Expr = sympy.Integer(0)
            else:
                v = sympy.Symbol(f"x{len(ranges)}", integer=True, nonnegative=True)
                ranges.append(n)
            full_idx.append(v)
            out_idx.append(v)
    if not rranges:
        return _trivial_reduction(ctx, x, full_idx, out_idx, tuple(ranges), rtype, layout, out_size)
    acc = acc or acc_dtype_for(rtype, x.dtype)
    body = x.load(full_idx)
    if rtype in ("any", "all"):
        body = cast(body, torch.bool)
    elif rtype not in ("argmax", "argmin"):
        body = cast(body, acc)
    else:
        body = cast(body, compute_dtype(x.dtype))
    if rtype == "sum" and len(rranges) == 1:
        selected = _one_hot_sum(ctx, x, body, full_idx, (rvars[0], rranges[0]), out_idx, out_dtype, out_size)
        if selected is not None:
            return [selected]
    name = ctx.new_name()
    extra: tuple[str, ...] = ()
    ctx.add_buffer(name, layout)
    outs = [Realized(out_dtype, x.device, out_size, name, layout)]
    if rtype == "welford":
        m2 = ctx.new_name()
        extra = (m2,)
        ctx.add_buffer(m2, layout)
        outs.append(Realized(out_dtype, x.device, out_size, m2, layout))
    ctx.add_node(ir.ReductionNode(
        name, layout=layout, ranges=tuple(ranges), reduction_ranges=tuple(rranges),
        reduction_type=rtype, body=body, store_index=layout.index(out_idx), acc_dtype=acc,
        extra_outputs=extra))
    return outs


def _one_hot_sum(ctx: LoweringContext, x: TensorValue, body: ir.Value, full_idx: list[Expr],
                 reduced: tuple[sympy.Symbol, Expr], out_idx: list[Expr], out_dtype: torch.dtype,
                 out_size: tuple[Expr, ...]) -> TensorValue | None:
    """The sum of ``body`` over ``reduced`` (the one reduction variable and its range) as a lazy
    pointwise value, when the body is a scaled one-hot; loads of values this graph stored
    are read through to what they compute, at the same element."""
    r, size = reduced

    def look_through(load: ir.Load) -> ir.Value | None:
        known = ctx.source(load.buffer)
        if known is None or tuple(known[1].size) != tuple(x.size):
            return None
        if sympy.expand(load.index - known[1].index(full_idx)) != 0:
            return None
        return known[0].load(full_idx)

    value = sum_of_one_hot(body, r, size, look_through)
    if value is None:
        return None
    log.debug("%s: a sum of a one-hot over %s elements, computed without a loop", ctx.origin, size)
    kept = {v: i for i, v in enumerate(out_idx) if isinstance(v, sympy.Symbol)}
    return lazy(out_dtype, x.device, out_size,
                lambda idx: cast(ir.reindex_value(value, {v: idx[i] for v, i in kept.items()}), out_dtype))


def _trivial_reduction(ctx: LoweringContext, x: TensorValue, full_idx: list[Expr], out_idx: list[Expr],
                       ranges: tuple[Expr, ...], rtype: str, layout: Layout,
                       out_size: tuple[Expr, ...]) -> list[Realized]:
    """A reduction over one element per output: the element itself (0 for arg-reductions; for a
    float sum ``0.0 + x``; for Welford a sum of squares of ``(x - x)**2``, 0 for a finite element
    and NaN for inf or NaN, as eager's variance of one element with correction 0)."""
    value = x.load(full_idx)
    if rtype in ("argmax", "argmin"):
        bodies = [ir.Const(torch.int64, value=0)]
    elif rtype == "welford":
        acc = compute_dtype(layout.dtype)
        v = cast(value, acc)
        deviation = ir.Op(acc, name="sub", args=(v, v))
        bodies = [v, ir.Op(acc, name="mul", args=(deviation, deviation))]
    elif rtype == "sum" and layout.dtype.is_floating_point:
        # eager's sum starts at +0.0: a sum of one -0.0 is +0.0 (the element itself was -0.0)
        acc = compute_dtype(layout.dtype)
        bodies = [ir.Op(acc, name="add", args=(cast(value, acc), ir.Const(acc, value=0.0)))]
    else:
        bodies = [value]
    outs = []
    for body in bodies:
        name = ctx.new_name()
        ctx.add_buffer(name, layout)
        ctx.add_node(ir.PointwiseNode(name, layout=layout, ranges=ranges, body=cast(body, layout.dtype),
                                      store_index=layout.index(out_idx)))
        outs.append(Realized(layout.dtype, x.device, out_size, name, layout))
    return outs


def _meta_layout(ctx: LoweringContext, i: int | None = None) -> Layout | None:
    meta = ctx.out_meta if i is None else ctx.out_meta[i]
    return layout_from_meta(meta)


def _meta_dtype(ctx: LoweringContext, i: int | None = None) -> torch.dtype:
    meta = ctx.out_meta if i is None else ctx.out_meta[i]
    return meta.dtype


def _simple(rtype: str):
    def lower(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False,
              *, dtype: torch.dtype | None = None) -> TensorValue:
        if isinstance(dim, bool):  # any.default-like signatures never pass a bool dim
            raise LoweringError(ctx.origin, "unexpected bool dim")
        out = _meta_dtype(ctx)
        src = x
        if dtype is not None and rtype in ("sum", "prod"):
            src = to_dtype(x, dtype)
        dims = _dims(x, dim)
        if rtype in ("any", "all") and isinstance(dim, (list, tuple)) and not dim:
            dims = []  # any/all over dim=() reduce nothing (sum, amax and mean over () reduce all)
        return reduce(ctx, src, dims, keepdim, rtype, out, _meta_layout(ctx))[0]
    return lower


lowering(aten.sum.dim_IntList, aten.sum.default)(_simple("sum"))
lowering(aten.prod.dim_int, aten.prod.default)(_simple("prod"))
lowering(aten.amax.default, aten.max.default)(_simple("max"))
lowering(aten.amin.default, aten.min.default)(_simple("min"))
lowering(aten.any.dim, aten.any.dims, aten.any.default)(_simple("any"))
lowering(aten.all.dim, aten.all.dims, aten.all.default)(_simple("all"))


@lowering(aten.argmax.default, aten.argmin.default)
def _arg(ctx: LoweringContext, x: TensorValue, dim: int | None = None, keepdim: bool = False) -> TensorValue:
    rtype = "argmax" if "argmax" in ctx.origin else "argmin"
    if x.dtype == torch.bool:
        raise LoweringError(ctx.origin, "bool input (eager has no kernel for it and raises)")
    if dim is None:
        if keepdim:
            raise LoweringError(ctx.origin, "keepdim without dim")
        flat = _flatten(x)
        return reduce(ctx, flat, [0], False, rtype, torch.int64, _meta_layout(ctx))[0]
    return reduce(ctx, x, _dims(x, dim), keepdim, rtype, torch.int64, _meta_layout(ctx))[0]


def _flatten(x: TensorValue) -> TensorValue:
    return reshape(x, (ir.sympy_product(x.size),))


@lowering(aten.max.dim, aten.min.dim)
def _max_dim(ctx: LoweringContext, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    kind = "max" if "max" in ctx.origin else "min"
    dims = _dims(x, dim)
    values = reduce(ctx, x, dims, keepdim, kind, _meta_dtype(ctx, 0), _meta_layout(ctx, 0))[0]
    index = reduce(ctx, x, dims, keepdim, "arg" + kind, torch.int64, _meta_layout(ctx, 1))[0]
    return values, index


@lowering(aten.mean.dim, aten.mean.default)
def _mean(ctx: LoweringContext, x: TensorValue, dim: Any = None, keepdim: bool = False,
          *, dtype: torch.dtype | None = None) -> TensorValue:
    out = _meta_dtype(ctx)
    if not out.is_floating_point:
        raise LoweringError(ctx.origin, "mean of a non-float dtype")
    dims = _dims(x, dim)
    count = ir.sympy_product([x.size[d] for d in dims]) if x.ndim else sympy.Integer(1)
    acc = compute_dtype(out)
    # eager sums ``x.to(dtype)``: an int64 or float32 input summed in float64 under
    # dtype=float64 (summed in the input's type, 4 * 2**62 wrapped to 0: found by a hunt)
    src = to_dtype(x, dtype) if dtype is not None else x
    total = reduce(ctx, src, dims, keepdim, "sum", acc, acc=acc)[0]
    return _divide_by(total, count, out)


def _divide_by(v: TensorValue, count: Expr, out: torch.dtype) -> TensorValue:
    acc = compute_dtype(out)

    def fn(idx: list[Expr]) -> ir.Value:
        n = cast(ir.IndexValue(torch.int64, expr=count), acc)
        return cast(ir.Op(acc, name="truediv", args=(cast(v.load(idx), acc), n)), out)

    return lazy(out, v.device, v.size, fn)


#: The ops whose own float32 Welford state eager's CPU kernels keep in double (by packet name).
_VARIANCES = frozenset({"var", "std", "var_mean", "std_mean"})


def _called_as_variance(ctx: LoweringContext) -> bool:
    namespace, _, rest = ctx.decomposed_from.partition(".")
    return namespace == "aten" and rest.split(".")[0] in _VARIANCES


def _welford(ctx: LoweringContext, x: TensorValue, dim: Any, correction: Any, keepdim: bool,
             root: bool = False) -> tuple[TensorValue, TensorValue]:
    """Variance (its square root with ``root``, taken before the cast to the output dtype: a
    float16 variance above 65504 is inf, its root is not) and mean."""
    out = _meta_dtype(ctx, 0) if isinstance(ctx.out_meta, (tuple, list)) else _meta_dtype(ctx)
    if not out.is_floating_point:
        raise LoweringError(ctx.origin, "variance of a non-float dtype")
    dims = _dims(x, dim)
    count = ir.sympy_product([x.size[d] for d in dims]) if x.ndim else sympy.Integer(1)
    acc = compute_dtype(out)
    if acc == torch.float32 and _called_as_variance(ctx) \
            and capability(x.device, "float32_variance_in_float64", False):
        # the device's eager var/std keep a double state (its norms do not), for half types
        # too: a bf16 variance of values near 1e19 is finite there, inf in float32
        acc = torch.float64
    mean, m2 = reduce(ctx, x, dims, keepdim, "welford", acc, acc=acc)
    corr = 1 if correction is None else correction

    def var_fn(idx: list[Expr]) -> ir.Value:
        n = cast(ir.IndexValue(torch.int64, expr=count), acc)
        denom = ir.Op(acc, name="sub", args=(n, ir.Const(acc, value=float(corr))))
        d = ir.Op(acc, name="maximum", args=(denom, ir.Const(acc, value=0.0)))
        v = ir.Op(acc, name="truediv", args=(m2.load(idx), d))
        return cast(ir.Op(acc, name="sqrt", args=(v,)) if root else v, out)

    var = lazy(out, x.device, m2.size, var_fn)
    if count == 0:  # mean and variance of nothing are NaN, as in eager
        nan = ir.Const(out, value=float("nan"))
        return lazy(out, x.device, m2.size, lambda idx: nan), lazy(out, x.device, mean.size, lambda idx: nan)
    mean_out = lazy(out, x.device, mean.size, lambda idx: cast(mean.load(idx), out))
    return var, mean_out


@lowering(aten.var_mean.correction)
def _var_mean(ctx: LoweringContext, x: TensorValue, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False) -> tuple:
    return _welford(ctx, x, dim, correction, keepdim)


@lowering(aten.var.correction)
def _var(ctx: LoweringContext, x: TensorValue, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> TensorValue:
    return _welford(ctx, x, dim, correction, keepdim)[0]


@lowering(aten.std.correction)
def _std(ctx: LoweringContext, x: TensorValue, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False) -> TensorValue:
    return _welford(ctx, x, dim, correction, keepdim, root=True)[0]


__all__ = ["reduce", "acc_dtype_for"]
