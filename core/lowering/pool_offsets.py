"""Lowerings of Coil's max-pool ops with int8 window offsets (:mod:`coil.pool_offsets`): the
forward is :mod:`.pooling`'s window maximum with the tap's number as its index; the backward
is its gather, matching a window's saved tap against the tap this element is in it."""
from __future__ import annotations

from typing import Any

import sympy
import torch

from .. import ir
from .. import pool_offsets  # noqa: F401  (defines torch.ops.coil.max_pool2d_offsets*)
from ..ir import Expr
from .context import LoweringContext
from .pointwise import compute_dtype
from .pooling import _add, _axes, _check_taps, _index, _masked, _meta, _window_source, max_pool
from .registry import lowering
from .values import TensorValue, cast, lazy

coil_ops = torch.ops.coil


@lowering(coil_ops.max_pool2d_offsets.default)
def _max_pool2d_offsets(ctx: LoweringContext, x: TensorValue, kernel_size: Any, stride: Any,
                        padding: Any, ceil_mode: bool) -> tuple[TensorValue, TensorValue]:
    return max_pool(ctx, x, kernel_size, stride, padding, 1, offsets=True)


@lowering(coil_ops.max_pool2d_offsets_backward.default)
def _max_pool2d_offsets_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue,
                                 kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                                 offsets: TensorValue) -> TensorValue:
    """Each input element's gradient: the sum, over the output windows that hold it (in
    ascending order, as eager adds them), of the window's gradient where the window's saved
    tap is this element's tap in it."""
    ah, aw = _axes(ctx, x, grad.size[-2:], kernel_size, stride, padding)
    out = _meta(ctx).dtype
    acc = compute_dtype(out)
    rows = len(ah.covering(sympy.Integer(0), True))
    cols = len(aw.covering(sympy.Integer(0), True))
    _check_taps(ctx, rows * cols, "output windows per input element")
    grad, offsets = _window_source(ctx, grad, _meta(ctx)), _window_source(ctx, offsets, _meta(ctx))
    lead = x.ndim - 2

    def fn(idx: list[Expr]) -> ir.Value:
        h, w = idx[lead], idx[lead + 1]
        total: ir.Value = ir.Const(acc, value=0.0)
        # exact: only windows that hold (h, w), so the tap number below lies in the window
        for oh, row_conds in ah.covering(h, True):
            for ow, col_conds in aw.covering(w, True):
                at = [*idx[:lead], oh, ow]
                tap = (h - ah.tap(oh, 0)) * aw.kernel + (w - aw.tap(ow, 0))
                hit = ir.Op(torch.bool, name="eq", args=(cast(offsets.load(at), torch.int64), _index(tap)))
                term = ir.Op(acc, name="where", args=(hit, cast(grad.load(at), acc), ir.Const(acc, value=0.0)))
                total = _add(total, _masked(row_conds + col_conds, term, 0.0))
        return cast(total, out)

    return lazy(out, x.device, x.size, fn)
