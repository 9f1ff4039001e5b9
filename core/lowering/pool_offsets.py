"""Lowerings of Coil's max-pool ops with int8 window offsets (:mod:`coil.pool_offsets`): the
forward is :mod:`.pooling`'s window maximum with the tap's number as its index; the backward
is its gather, matching a window's saved tap against the tap this element is in it."""
from __future__ import annotations

from typing import Any

import torch

from .. import pool_offsets  # noqa: F401  (defines torch.ops.coil.max_pool2d_offsets*)
from .context import LoweringContext
from .pooling import max_pool, max_pool_backward
from .registry import lowering
from .values import TensorValue, lazy, to_sympy

coil_ops = torch.ops.coil


@lowering(coil_ops.max_pool2d_offsets.default)
def _max_pool2d_offsets(ctx: LoweringContext, x: TensorValue, kernel_size: Any, stride: Any,
                        padding: Any, ceil_mode: bool) -> tuple[TensorValue, TensorValue]:
    return max_pool(ctx, x, kernel_size, stride, padding, 1, offsets=True)


@lowering(coil_ops.max_pool2d_offsets_backward.default)
def _max_pool2d_offsets_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue,
                                 kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                                 offsets: TensorValue) -> TensorValue:
    return max_pool_backward(ctx, grad, x, kernel_size, stride, padding, 1, offsets, offsets=True)


@lowering(coil_ops.max_pool2d_offsets_backward_sized.default)
def _max_pool2d_offsets_backward_sized(ctx: LoweringContext, grad: TensorValue, offsets: TensorValue,
                                       input_size: Any, input_stride: Any, kernel_size: Any, stride: Any,
                                       padding: Any, ceil_mode: bool) -> TensorValue:
    # the input stands in for its size, dtype and device alone: nothing loads it
    size = tuple(to_sympy(s) for s in input_size)
    shape_only = lazy(grad.dtype, grad.device, size, _never_loaded)
    return max_pool_backward(ctx, grad, shape_only, kernel_size, stride, padding, 1, offsets, offsets=True)


def _never_loaded(idx: list[Any]) -> Any:
    raise AssertionError("the pooling input of a sized backward is never loaded")
