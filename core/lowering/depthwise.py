"""Depthwise 2-D convolutions as pointwise bodies with the window unrolled, as the pooling
lowerings write their windows: output channel ``c`` of ``aten.convolution`` with
``groups`` equal to the input's channels reads input channel ``c // multiplier`` only, so each
output element is a sum of at most :data:`~.pooling.MAX_TAPS` products, and the batch norm
and activation around the convolution fuse into the same kernel.

A library pays a call per convolution, and its depthwise kernels are slow at the sizes
mobile nets reach in their late stages: on this project's CPU machine (one thread, float32,
oneDNN through ATen), a 2x288x2x2 depthwise 5x5 convolution took 45 us per call and a
2x144x4x4 one 35 us, for 58 and 115 thousand multiply-adds.

Only for devices that declare ``Capabilities.depthwise_conv`` (SDK 1.4.0; the backward,
``convolution_backward``, for plugins declaring SDK 1.7.0 or later); elsewhere, and for
transposed, grouped-but-not-depthwise, non-4-D, integer or symbolic-window convolutions, the
op stays a library call (``LoweringError``). The sum runs in tap order from 0 in float32 for
half types (float64 for float64) and rounds once to the output's dtype; a bias, where the
graph still has one, is added after the sum. The library sums in its own order, so results
agree with eager's within rounding, not bit for bit."""
from __future__ import annotations

from typing import Any

import sympy
import torch

from .. import ir
from ..errors import LoweringError
from ..ir import Expr
from ..symbolic import FloorDiv, ModIdx
from .context import LoweringContext, layout_from_meta, require_api, require_capability
from .pointwise import compute_dtype
from .pooling import FLOAT_DTYPES, MAX_TAPS, Axis, axes, cmp_index, is_negative, masked, window_source
from .reductions import reduce
from .registry import lowering
from .values import TensorValue, cast, lazy

aten = torch.ops.aten

#: Most operations of a producer inlined into a depthwise window's taps (pooling's limit is
#: :data:`~coil.lowering.pooling.INLINE_OPS`). A folded batch norm's bias + ReLU6 (the
#: ``freezing`` knob) inlined into MobileNetV2's 3x3 windows took 108 us per call against 46 us
#: for the window over a stored input plus the store (one thread, batch 2): a window's taps are
#: multiply-adds already, and each recomputes its producer.
DEPTHWISE_INLINE_OPS = 0


@lowering(aten.convolution.default)
def _convolution(ctx: LoweringContext, x: TensorValue, weight: TensorValue, bias: TensorValue | None,
                 stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                 groups: Any) -> TensorValue:
    """A depthwise convolution's windows; any other convolution raises ``LoweringError``."""
    meta = ctx.out_meta
    if not isinstance(meta, torch.Tensor):
        raise LoweringError(ctx.origin, "no tensor result")
    _check_depthwise(ctx, x, weight, transposed, groups, meta)
    require_capability(x.device, "depthwise_conv", ctx.origin)
    kh, kw = int(weight.size[2]), int(weight.size[3])
    ah, aw = axes(ctx, x, meta.shape[-2:], (kh, kw), stride, padding, dilation)
    src = window_source(ctx, x, meta, DEPTHWISE_INLINE_OPS)
    acc = compute_dtype(meta.dtype)
    multiplier = int(weight.size[0]) // int(x.size[1])

    def fn(idx: list[Expr]) -> ir.Value:
        n, c, oh, ow = idx
        cin = c if multiplier == 1 else FloorDiv(c, multiplier)
        return cast(_window(src, weight, n, c, cin, oh, ow, ah, aw, acc, bias), meta.dtype)

    # stored, not inlined: a user that inlined it would compute every tap again, and a
    # reduction's loops (a squeeze-and-excitation mean) vectorise the taps' masks poorly
    # (EfficientNet-B0, one thread: 6.9 ms against 5.0 with the library's convolutions);
    # pointwise users still fuse into the kernel that stores it
    value = lazy(meta.dtype, x.device, (x.size[0], weight.size[0], ah.out, aw.out), fn)
    return ctx.realize(value, layout_from_meta(meta))


def _check_depthwise(ctx: LoweringContext, x: TensorValue, weight: TensorValue, transposed: bool,
                     groups: Any, meta: torch.Tensor) -> None:
    if transposed:
        raise LoweringError(ctx.origin, "a transposed convolution (only depthwise ones are lowered)")
    if x.ndim != 4 or weight.ndim != 4:
        raise LoweringError(ctx.origin, f"a {x.ndim}-D convolution (only 2-D depthwise ones are lowered)")
    sizes = (x.size[1], *weight.size)
    if not all(sympy.sympify(s).is_number for s in sizes) or type(groups) is not int:
        raise LoweringError(ctx.origin, "symbolic channels or window")
    channels, out_channels, per_group, kh, kw = (int(s) for s in sizes)
    if groups == 1 or groups != channels or per_group != 1 or out_channels % channels:
        raise LoweringError(ctx.origin, f"groups={groups} over {channels} channels (only depthwise "
                                        "convolutions are lowered)")
    if kh * kw > MAX_TAPS:
        raise LoweringError(ctx.origin, f"{kh * kw} window taps (at most {MAX_TAPS} are unrolled)")
    if x.dtype not in FLOAT_DTYPES or weight.dtype != x.dtype or meta.dtype != x.dtype:
        raise LoweringError(ctx.origin, f"dtypes {x.dtype}, {weight.dtype} -> {meta.dtype}")


def _window(src: TensorValue, weight: TensorValue, n: Expr, c: Expr, cin: Expr, oh: Expr, ow: Expr,
            ah: Axis, aw: Axis, acc: torch.dtype, bias: TensorValue | None) -> ir.Value:
    """The sum over window (oh, ow) of input channel ``cin`` times output channel ``c``'s
    weights, taps in order; a tap in the padding reads zero. The mask holds the load alone:
    a backend reads a masked load whose mask is the same along its inner loop through a
    row pointer (the C++ plugin's ``masked_rows.py``), not a masked product."""
    total: ir.Value = ir.Const(acc, value=0.0)
    zero = sympy.Integer(0)
    for i, (ih, row_conds) in enumerate(ah.taps(oh)):
        for j, (iw, col_conds) in enumerate(aw.taps(ow)):
            tap = masked(row_conds + col_conds, cast(src.load([n, cin, ih, iw]), acc), 0.0)
            w = cast(weight.load([c, zero, sympy.Integer(i), sympy.Integer(j)]), acc)
            total = ir.Op(acc, name="add", args=(total, ir.Op(acc, name="mul", args=(tap, w))))
    if bias is not None:
        total = ir.Op(acc, name="add", args=(total, cast(bias.load([c]), acc)))
    return total


# ----------------------------------------------------------------------------- backward

#: The SDK release from which ``Capabilities.depthwise_conv`` covers the backward too.
BACKWARD_API = (1, 7, 0)

#: The dim order a depthwise backward stores a lazy operand in when it has no input gradient
#: to take it from: channels-last, as the forward's layout (strides of a 4-D example).
_CHANNELS_LAST = torch.empty_strided((2, 2, 2, 2), (8, 1, 4, 2), device="meta")


@lowering(aten.convolution_backward.default)
def _convolution_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, weight: TensorValue,
                          bias_sizes: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                          output_padding: Any, groups: Any, output_mask: Any) -> tuple:
    """A depthwise convolution's gradients (one output channel per input channel), where a
    library's are slowest of all: ATen's CPU backward runs one small convolution per channel
    (a 2x288x2x2 5x5 window took 1.0 ms per call, one thread; MobileNetV3's twelve took 5.2 ms
    of a 10 ms training step). The input's gradient sums, over the weight's taps, the
    gradient of the output window that reads the element through each; the weight's is one
    reduction over batch and output positions per (tap, channel); the bias's the gradient's
    sum per channel. Any other convolution raises ``LoweringError`` and stays the library's."""
    meta = ctx.out_meta
    if not isinstance(meta, (tuple, list)) or len(meta) != 3 or not isinstance(output_mask, (list, tuple)):
        raise LoweringError(ctx.origin, "not three results")
    like = next((m for m in meta if isinstance(m, torch.Tensor)), None)
    if like is None:
        raise LoweringError(ctx.origin, "no tensor result")
    _check_depthwise(ctx, x, weight, transposed, groups, like)
    if int(weight.size[0]) != int(x.size[1]):
        raise LoweringError(ctx.origin, "a channel multiplier above 1")
    dilations = dilation if isinstance(dilation, (list, tuple)) else [dilation]
    if any(d != 1 for d in dilations):
        raise LoweringError(ctx.origin, "a dilated window")
    require_capability(x.device, "depthwise_conv", ctx.origin)
    require_api(x.device, BACKWARD_API, ctx.origin)
    kh, kw = int(weight.size[2]), int(weight.size[3])
    ah, aw = axes(ctx, x, grad.size[-2:], (kh, kw), stride, padding, dilation)
    acc = compute_dtype(x.dtype)
    order = meta[0] if isinstance(meta[0], torch.Tensor) else _CHANNELS_LAST
    source = window_source(ctx, grad, order, DEPTHWISE_INLINE_OPS)
    results: list[Any] = [None, None, None]
    if output_mask[0]:
        results[0] = _input_grad(ctx, source, weight, x, ah, aw, acc, meta[0])
    if output_mask[1]:
        results[1] = _weight_grad(ctx, source, window_source(ctx, x, order, DEPTHWISE_INLINE_OPS),
                                   weight, ah, aw, acc, meta[1])
    if output_mask[2]:
        results[2] = reduce(ctx, grad, [0, 2, 3], False, "sum", meta[2].dtype, layout_from_meta(meta[2]))[0]
    return tuple(results)


def _input_grad(ctx: LoweringContext, grad: TensorValue, weight: TensorValue, x: TensorValue,
                ah: Axis, aw: Axis, acc: torch.dtype, meta: torch.Tensor) -> TensorValue:
    """Input element (n, c, h, w)'s gradient: over the weight taps (i, j), in order, the
    gradient of the output window that reads the element through that tap, where there is
    one, times the tap. Each tap is a constant and each mask depends on the element's
    position alone, so a backend reads the taps from a table and the gradient through row
    pointers (the C++ plugin, one thread: a 2x96x32x32 stride-2 window took 0.24 ms written
    as the windows covering each element, whose tap varies with its position, and 0.10 ms
    as taps; a 2x32x32x32 stride-1 one 0.19 ms with the mask around the product, 0.05 with
    the mask around the load)."""
    zero = sympy.Integer(0)

    def fn(idx: list[Expr]) -> ir.Value:
        n, c, h, w = idx
        total: ir.Value = ir.Const(acc, value=0.0)
        for i in range(ah.kernel):
            oh, row_conds = _reader(ah, h, i)
            for j in range(aw.kernel):
                ow, col_conds = _reader(aw, w, j)
                # the mask holds the load alone, as the forward's taps (see _window)
                g = masked(row_conds + col_conds, cast(grad.load([n, c, oh, ow]), acc), 0.0)
                tap = cast(weight.load([c, zero, sympy.Integer(i), sympy.Integer(j)]), acc)
                total = ir.Op(acc, name="add", args=(total, ir.Op(acc, name="mul", args=(g, tap))))
        return cast(total, meta.dtype)

    value = lazy(meta.dtype, x.device, tuple(x.size), fn)
    return ctx.realize(value, layout_from_meta(meta))


def _reader(axis: Axis, h: Expr, i: int) -> tuple[Expr, list[ir.Value]]:
    """The output position whose window reads input position ``h`` through tap ``i``
    (``o * stride - pad + i == h``), and the conditions that it exists: a whole multiple of
    the stride, inside ``[0, out)``. The numerator is kept non-negative by a whole number of
    strides added and taken off again, so no division or remainder sees a negative value."""
    shift = axis.stride * (axis.kernel + 1)  # more than any tap can take off
    numerator = h + axis.pad - i + shift
    o = FloorDiv(numerator, axis.stride) - shift // axis.stride if axis.stride > 1 else h + axis.pad - i
    conds = []
    if axis.stride > 1:
        conds.append(cmp_index("eq", ModIdx(numerator, axis.stride), 0))
    if i > axis.pad:  # h + pad - i < 0 for the first positions
        conds.append(cmp_index("ge", o, 0))
    if not is_negative((axis.size - 1 + axis.pad - i) // 1 - axis.stride * axis.out):
        conds.append(cmp_index("lt", o, axis.out))
    return o, conds


def _weight_grad(ctx: LoweringContext, grad: TensorValue, x: TensorValue, weight: TensorValue,
                 ah: Axis, aw: Axis, acc: torch.dtype, meta: torch.Tensor) -> TensorValue:
    """Channel ``c``'s tap (i, j): the sum over batch and output positions of the output
    gradient times the input element the tap reads there (zero in the padding). One
    reduction over (n, oh, ow) of a (kh, kw, channels, n, oh, ow) product, channels innermost
    in its result as in its channels-last operands, so a backend can run the reduction along
    whole rows of channels (with the channels outermost, the C++ plugin's loop read them 32
    floats apart: 0.73 ms for a 2x32x32x32 3x3 window, one thread); the weight's layout is
    a copy of that small result."""
    def fn(idx: list[Expr]) -> ir.Value:
        i, j, c, n, oh, ow = idx
        ih, iw = oh * ah.stride - ah.pad + i, ow * aw.stride - aw.pad + j
        tap = masked(_inside(ih, ah) + _inside(iw, aw), cast(x.load([n, c, ih, iw]), acc), 0.0)
        return ir.Op(acc, name="mul", args=(cast(grad.load([n, c, oh, ow]), acc), tap))

    kh, kw, channels = weight.size[2], weight.size[3], weight.size[0]
    product = lazy(acc, x.device, (kh, kw, channels, x.size[0], ah.out, aw.out), fn)
    taps = reduce(ctx, product, [3, 4, 5], False, "sum", meta.dtype)[0]
    value = lazy(meta.dtype, x.device, tuple(weight.size), lambda idx: taps.load([idx[2], idx[3], idx[0]]))
    return ctx.realize(value, layout_from_meta(meta))


def _inside(position: Expr, axis: Axis) -> list[ir.Value]:
    """The conditions for ``position`` (an output window's start plus a tap, the tap a loop
    variable) to lie in the input, without one that holds for every window and tap."""
    conds = []
    if axis.pad > 0:
        conds.append(cmp_index("ge", position, 0))
    if not is_negative((axis.out - 1) * axis.stride - axis.pad + axis.kernel - 1 - axis.size):
        conds.append(cmp_index("lt", position, axis.size))
    return conds
