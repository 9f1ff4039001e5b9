"""Lowerings of 2-D pooling as pointwise bodies with the window unrolled:
``max_pool2d_with_indices``, ``avg_pool2d`` and ``_adaptive_avg_pool2d`` (what AOTAutograd hands
over: ``max_pool2d`` and ``adaptive_avg_pool2d`` arrive decomposed into these, or into ``mean``),
and their backwards as gathers over the few output windows that can hold each input element
(eager's CPU kernels scatter; a gather needs no atomics and fuses with its neighbours).

Results are eager's bit for bit: a max window keeps its first maximum and its last NaN (eager's
``val > max || isnan(val)`` from ``max = -inf``), a window of -inf, or one a dilation makes
miss the input, reports the index eager's kernels start from; sums run in window order from 0,
in float32 for half types, and divide by eager's count. Where eager's kernels disagree with
each other, Coil follows its CUDA kernels, float32 sums rounded once (half-type gradients over
overlapping windows, which eager's CPU kernels round after every addition), or keeps the ATen
call (adaptive averages of channels-last tensors, whose eager CPU kernel divides some lanes
by ``kh * kw`` and the rest by ``kh`` then ``kw``). Windows past :data:`MAX_TAPS` taps,
integer dtypes and symbolic adaptive sizes stay ATen calls too (``LoweringError``)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import sympy
import torch

from .. import ir
from ..errors import LoweringError
from ..ir import Expr
from ..ops import EXACT_OPS
from ..symbolic import FloorDiv, ModIdx
from .context import LoweringContext, layout_from_meta, require_capability
from .pointwise import compute_dtype
from .registry import lowering
from .values import Lazy, TensorValue, cast, const, lazy, to_sympy

aten = torch.ops.aten

#: Most taps of a window (or, in a backward, windows that may hold one input element) that a
#: body unrolls; Inductor draws the line at 25 too. A 5x5 window is 25 loads and ~100 ops per
#: output; past it the ATen kernel's loop is the better code.
MAX_TAPS = 25
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_INF = float("inf")


# ----------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class Axis:
    """One spatial dim of a pooling: output position ``o`` reads the input positions
    ``o*stride - pad + i*dilation`` for taps ``i < kernel`` that fall inside ``[0, size)``."""

    size: Expr
    out: Expr
    kernel: int
    stride: int
    pad: int
    dilation: int = 1

    def tap(self, o: Expr, i: int) -> Expr:
        return o * self.stride - self.pad + i * self.dilation

    def taps(self, o: Expr) -> list[tuple[Expr, list[ir.Value]]]:
        """Window ``o``'s positions, each with the conditions that it lies in the input."""
        return [(self.tap(o, i), self.inside(o, i)) for i in range(self.kernel)]

    def inside(self, o: Expr, i: int) -> list[ir.Value]:
        """The conditions for tap ``i`` of window ``o`` to fall inside the input, without
        those that hold for every window."""
        conds = []
        if i * self.dilation < self.pad:
            conds.append(cmp_index("ge", self.tap(o, i), 0))
        if not is_negative(self.tap(self.out - 1, i) - self.size):
            conds.append(cmp_index("lt", self.tap(o, i), self.size))
        return conds

    def first(self, o: Expr) -> ir.Value:
        """The first tap at or after 0, where eager's kernels start a window's index (past the
        input when a dilated window misses it)."""
        start = _index(self.tap(o, 0))
        if self.pad == 0:
            return start
        d = self.dilation
        before = _int_op("maximum", _index(self.pad - o * self.stride), _index(0))  # taps < 0
        if d > 1:
            before = _int_op("mul", _int_op("floordiv", _int_op("add", before, _index(d - 1)), _index(d)),
                             _index(d))
        return _int_op("add", start, before)

    def can_miss(self) -> bool:
        """Whether some window holds no input position (possible only when dilated)."""
        if self.dilation == 1:
            return False
        if not (self.size.is_number and self.out.is_number):
            return True
        return any(all(not 0 <= self.tap(o, i) < self.size for i in range(self.kernel))
                   for o in range(int(self.out)))

    def covering(self, h: Expr, exact: bool) -> list[tuple[Expr, list[ir.Value]]]:
        """The output windows that may hold input position ``h``, in ascending order, each
        with its conditions: that it is a window (``0 <= o < out``) and, if ``exact``, that it
        holds ``h`` (undilated axes only)."""
        span = (self.kernel - 1) * self.dilation
        top = FloorDiv(h + self.pad, self.stride)  # the last window starting at or before h
        last_top = FloorDiv(self.size - 1 + self.pad, self.stride)
        windows = []
        for t in reversed(range(span // self.stride + 1)):
            conds = []
            if t > 0:
                conds.append(cmp_index("ge", top - t, 0))
            if not is_negative(last_top - t - self.out):
                conds.append(cmp_index("lt", top - t, self.out))
            if exact and self.stride - 1 + t * self.stride > span:  # h past the window's end?
                conds.append(cmp_index("le", ModIdx(h + self.pad, self.stride) + t * self.stride, span))
            windows.append((top - t, conds))
        return windows


def is_negative(e: Expr) -> bool:
    """Whether ``e`` is provably negative (a number below 0, or negative by its symbols' assumptions)."""
    e = sympy.expand(e)
    return bool(e.is_number and e < 0) or e.is_negative is True


def _pair(ctx: LoweringContext, value: Any, what: str, default: tuple[int, int] | None = None
          ) -> tuple[int, int]:
    if isinstance(value, (list, tuple)) and not value and default is not None:
        return default
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(items) == 1:
        items = items * 2
    if len(items) != 2 or not all(type(v) is int for v in items):
        raise LoweringError(ctx.origin, f"{what} {value!r} is not one or two constant ints")
    return items[0], items[1]


def _check_channels_last(ctx: LoweringContext, x: TensorValue) -> None:
    """Channels-last pooling only where the device's backend lays convolutions out that way
    (``Capabilities.conv_channels_last``): there the taps of a window lie a row of channels
    apart, and a backend must read whole rows of channels to be fast (the C++ plugin's row
    pointers, ``masked_rows.py``: a 3x3/s2 max pool of 8x64x56x56 in 0.40 ms, one thread)."""
    meta = ctx.out_meta[0] if isinstance(ctx.out_meta, (tuple, list)) else ctx.out_meta
    if (isinstance(meta, torch.Tensor) and meta.dim() == 4 and meta.shape[1] > 1
            and meta.stride(1) == 1 and not meta.is_contiguous()):
        require_capability(x.device, "conv_channels_last", ctx.origin)


def axes(ctx: LoweringContext, x: TensorValue, out_hw: Sequence[Any], kernel_size: Any,
          stride: Any, padding: Any, dilation: Any = 1) -> tuple[Axis, Axis]:
    _check_channels_last(ctx, x)
    if x.ndim not in (3, 4):
        raise LoweringError(ctx.origin, f"a {x.ndim}-D input (3-D or 4-D are lowered)")
    if x.dtype not in FLOAT_DTYPES:
        raise LoweringError(ctx.origin, f"dtype {x.dtype} (floating types are lowered)")
    kh, kw = _pair(ctx, kernel_size, "kernel_size")
    sh, sw = _pair(ctx, stride, "stride", default=(kh, kw))
    ph, pw = _pair(ctx, padding, "padding")
    dh, dw = _pair(ctx, dilation, "dilation")
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise LoweringError(ctx.origin, "a non-positive kernel, stride or dilation")
    oh, ow = (to_sympy(s) for s in out_hw)
    return (Axis(x.size[-2], oh, kh, sh, ph, dh), Axis(x.size[-1], ow, kw, sw, pw, dw))


def _check_taps(ctx: LoweringContext, taps: int, what: str) -> None:
    if taps > MAX_TAPS:
        raise LoweringError(ctx.origin, f"{taps} {what} (at most {MAX_TAPS} are unrolled)")


def _meta(ctx: LoweringContext, i: int | None = None) -> torch.Tensor:
    meta = ctx.out_meta if i is None else ctx.out_meta[i]
    if not isinstance(meta, torch.Tensor):
        raise LoweringError(ctx.origin, "no tensor result")
    return meta


#: Most operations a lazy producer's body may have to be inlined into every tap. A ReLU or a
#: scale-and-shift is cheaper recomputed than stored and read back; a batch norm's affine
#: step + ReLU inlined into a 3x3 window made ShuffleNetV2's pooling kernel 3x slower on the
#: CPU (24 ms against 8.7 ms with the batch norm stored by its own kernel; the window's scalar
#: code pays for every operation nine times).
INLINE_OPS = 3


def window_source(ctx: LoweringContext, x: TensorValue, like: torch.Tensor,
                  inline_ops: int = INLINE_OPS) -> TensorValue:
    """What the taps read: a lazy producer inlined into every tap if it is exact and has at
    most ``inline_ops`` operations, else stored once, in the dim order of ``like`` (the op's
    result), which is the layout the graph stores it in when it keeps it (a training graph
    saves a pooling's input)."""
    if not isinstance(x, Lazy):
        return x
    body = x.load([sympy.Symbol(f"q{i}", integer=True, nonnegative=True) for i in range(x.ndim)])
    inexact = any(isinstance(v, ir.Op) and v.name not in EXACT_OPS for v in ir.walk(body))
    if not inexact and ir.op_count(body) <= inline_ops:
        return x
    order = sorted(range(like.dim()), key=lambda d: (-like.stride(d), d))  # outermost first
    strides: list[Expr] = [sympy.Integer(0)] * x.ndim
    step: Expr = sympy.Integer(1)
    for d in reversed(order):
        strides[d] = step
        step = step * x.size[d]
    layout = ir.Layout(x.dtype, x.device, tuple(x.size), tuple(strides))
    return ctx.realize(x, layout if like.dim() == x.ndim else None)


# ----------------------------------------------------------------------------- IR helpers


def _index(e: Expr | int) -> ir.Value:
    return ir.IndexValue(torch.int64, expr=sympy.sympify(e))


def cmp_index(name: str, a: Expr | int, b: Expr | int) -> ir.Value:
    """The int64 comparison ``name`` (``lt``, ``ge``, ``eq``...) of two index expressions."""
    return ir.Op(torch.bool, name=name, args=(_index(a), _index(b)))


def _int_op(name: str, a: ir.Value, b: ir.Value) -> ir.Value:
    return ir.Op(torch.int64, name=name, args=(a, b))


def _all(conds: Sequence[ir.Value]) -> ir.Value:
    mask = conds[0]
    for c in conds[1:]:
        mask = ir.Op(torch.bool, name="logical_and", args=(mask, c))
    return mask


def masked(conds: Sequence[ir.Value], body: ir.Value, other: float) -> ir.Value:
    return ir.Masked(body.dtype, mask=_all(conds), body=body, other=other) if conds else body


def _add(a: ir.Value, b: ir.Value) -> ir.Value:
    return ir.Op(a.dtype, name="add", args=(a, b))


def _window_sum(src: TensorValue, idx: list[Expr], ah: Any, aw: Any, acc: torch.dtype) -> ir.Value:
    """The sum of window ``idx``'s taps in ``acc``, in window order from 0, as eager adds;
    ``ah``/``aw`` are the window's axes (anything with ``taps(o)``)."""
    lead = len(idx) - 2
    total: ir.Value = ir.Const(acc, value=0.0)
    for ih, row_conds in ah.taps(idx[lead]):
        for iw, col_conds in aw.taps(idx[lead + 1]):
            v = cast(src.load([*idx[:lead], ih, iw]), acc)
            total = _add(total, masked(row_conds + col_conds, v, 0.0))
    return total


def _div(a: ir.Value, count: Expr | ir.Value) -> ir.Value:
    """``a / count`` in ``a``'s dtype, the count converted from int64 as C++ converts it."""
    count = count if isinstance(count, ir.Value) else _index(count)
    return ir.Op(a.dtype, name="truediv", args=(a, cast(count, a.dtype)))


def _first_max(leaves: Sequence[tuple[ir.Value, ir.Value | None]]
               ) -> tuple[ir.Value, ir.Value | None]:
    """The first greatest of ``leaves`` (value, index or None), NaN aside: a later value wins
    only if greater, so equal numbers (+0 and -0 alike) keep the first. Halves combine in a
    balanced tree (the rule is associative), whose depth keeps the value trees, each used
    twice per combine, small."""
    if len(leaves) == 1:
        return leaves[0]
    mid = len(leaves) // 2
    (lv, li), (rv, ri) = _first_max(leaves[:mid]), _first_max(leaves[mid:])
    take = ir.Op(torch.bool, name="gt", args=(rv, lv))
    value = ir.Op(lv.dtype, name="where", args=(take, rv, lv))
    if li is None or ri is None:
        return value, None
    return value, ir.Op(torch.int64, name="where", args=(take, ri, li))


def _window_max(leaves: Sequence[tuple[ir.Value, ir.Value | None]]
                ) -> tuple[ir.Value, ir.Value | None, ir.Value]:
    """Eager's winner of a window's taps in order (a later value wins if greater or NaN):
    the last NaN if there is one, else the first greatest. Returns the value, the index and
    whether the window holds a NaN. The NaN tests read the taps themselves, never a selected
    value: GCC 12 turns ``isnan(c ? a : b)`` into a select between masks, which it compiles
    poorly (a 3x3/2 pooling of 8x64x56x56 floats on one CPU thread took 20 ms with the NaN
    test inside the tree's combines, 4.4 ms so; eager's kernel 17 ms)."""
    value, index = _first_max(leaves)
    nans = [ir.Op(torch.bool, name="isnan", args=(v,)) for v, _ in leaves]
    any_nan, last_nan, last_index = nans[0], leaves[0][0], leaves[0][1]
    for nan, (v, i) in zip(nans[1:], leaves[1:]):
        any_nan = ir.Op(torch.bool, name="bitwise_or", args=(any_nan, nan))
        last_nan = ir.Op(v.dtype, name="where", args=(nan, v, last_nan))
        if i is not None and last_index is not None:
            last_index = ir.Op(torch.int64, name="where", args=(nan, i, last_index))
    value = ir.Op(value.dtype, name="where", args=(any_nan, last_nan, value))
    if index is not None and last_index is not None:
        index = ir.Op(torch.int64, name="where", args=(any_nan, last_index, index))
    return value, index, any_nan


# ----------------------------------------------------------------------------- max pooling


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(ctx: LoweringContext, x: TensorValue, kernel_size: Any,
                             stride: Any = (), padding: Any = 0, dilation: Any = 1,
                             ceil_mode: bool = False) -> tuple[TensorValue, TensorValue]:
    """Values and flat indices ``h * W + w`` of each window's maximum."""
    return max_pool(ctx, x, kernel_size, stride, padding, dilation, offsets=False)


def max_pool(ctx: LoweringContext, x: TensorValue, kernel_size: Any, stride: Any, padding: Any,
             dilation: Any, offsets: bool) -> tuple[TensorValue, TensorValue]:
    """Values and the index of each window's maximum: flat (``h * W + w``, int64), or with
    ``offsets`` the tap's number in its window (``i * kw + j``, int8; undilated windows)."""
    ah, aw = axes(ctx, x, _meta(ctx, 0).shape[-2:], kernel_size, stride, padding, dilation)
    _check_taps(ctx, ah.kernel * aw.kernel, "window taps")
    src = window_source(ctx, x, _meta(ctx, 0))
    acc = compute_dtype(x.dtype)
    lead = x.ndim - 2
    width = x.size[-1]
    size = (*x.size[:lead], ah.out, aw.out)
    edged = any(ah.inside(sympy.Integer(0), i) for i in range(ah.kernel)) or \
        any(aw.inside(sympy.Integer(0), j) for j in range(aw.kernel))

    def leaves(idx: list[Expr], with_index: bool) -> list[tuple[ir.Value, ir.Value | None]]:
        oh, ow = idx[lead], idx[lead + 1]
        out = []
        for i in range(ah.kernel):
            for j in range(aw.kernel):
                ih, iw = ah.tap(oh, i), aw.tap(ow, j)
                v = cast(src.load([*idx[:lead], ih, iw]), acc)
                # a tap off the input is -inf: it never wins, and the index of a window whose
                # maximum is -inf is fixed below
                v = masked(ah.inside(oh, i) + aw.inside(ow, j), v, -_INF)
                at = i * aw.kernel + j if offsets else ih * width + iw
                out.append((v, _index(at) if with_index else None))
        return out

    def values(idx: list[Expr]) -> ir.Value:
        return cast(_window_max(leaves(idx, False))[0], x.dtype)

    def indices(idx: list[Expr]) -> ir.Value:
        value, index, _ = _window_max(leaves(idx, True))
        assert index is not None
        if edged:  # a window of -inf answers its first tap inside the input, as eager
            oh, ow = idx[lead], idx[lead + 1]
            row, col = ah.first(oh), aw.first(ow)
            if offsets:
                row, col = _int_op("sub", row, _index(ah.tap(oh, 0))), _int_op("sub", col, _index(aw.tap(ow, 0)))
            start = _int_op("add", _int_op("mul", row, _index(aw.kernel if offsets else width)), col)
            is_low = ir.Op(torch.bool, name="eq", args=(value, ir.Const(acc, value=-_INF)))
            index = ir.Op(torch.int64, name="where", args=(is_low, start, index))
        return cast(index, torch.int8) if offsets else index

    # Both stored, side by side: the scheduler puts the two nodes (readers of one input) in
    # one kernel, where the index reuses the value tree, and drops the index node where
    # nothing reads it (inference); every user of the values then reads them rather than
    # recomputing the window (a ResNet stem's pooling feeds a convolution and a residual add).
    meta = ctx.out_meta
    return (ctx.realize(lazy(x.dtype, x.device, size, values), layout_from_meta(meta[0])),
            ctx.realize(lazy(torch.int8 if offsets else torch.int64, x.device, size, indices),
                        layout_from_meta(meta[1])))


@lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, kernel_size: Any,
                         stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                         indices: TensorValue) -> TensorValue:
    return max_pool_backward(ctx, grad, x, kernel_size, stride, padding, dilation, indices, offsets=False)


def max_pool_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, kernel_size: Any,
                      stride: Any, padding: Any, dilation: Any, indices: TensorValue,
                      offsets: bool) -> TensorValue:
    """Each input element's gradient: the sum, over the output windows that may hold it (in
    ascending order, as eager adds them), of the window's gradient where the window's saved
    index is this element: flat (``h * W + w``), or with ``offsets`` its tap number in the
    window (``max_pool``'s int8 offsets; only windows that hold the element are visited, so
    the tap number is one of the window's)."""
    ah, aw = axes(ctx, x, grad.size[-2:], kernel_size, stride, padding, dilation)
    if ah.can_miss() or aw.can_miss():
        raise LoweringError(ctx.origin, "a dilated window can miss the input, and eager's "
                                        "index for it points outside the window")
    out = _meta(ctx).dtype
    acc = compute_dtype(out)
    rows = len(ah.covering(sympy.Integer(0), offsets))
    cols = len(aw.covering(sympy.Integer(0), offsets))
    _check_taps(ctx, rows * cols, "output windows per input element")
    grad, indices = window_source(ctx, grad, _meta(ctx)), window_source(ctx, indices, _meta(ctx))
    lead = x.ndim - 2
    width = x.size[-1]

    def fn(idx: list[Expr]) -> ir.Value:
        h, w = idx[lead], idx[lead + 1]
        total: ir.Value = ir.Const(acc, value=0.0)
        for oh, row_conds in ah.covering(h, offsets):
            for ow, col_conds in aw.covering(w, offsets):
                at = [*idx[:lead], oh, ow]
                target = (h - ah.tap(oh, 0)) * aw.kernel + (w - aw.tap(ow, 0)) if offsets else h * width + w
                hit = ir.Op(torch.bool, name="eq", args=(cast(indices.load(at), torch.int64), _index(target)))
                term = ir.Op(acc, name="where", args=(hit, cast(grad.load(at), acc), ir.Const(acc, value=0.0)))
                total = _add(total, masked(row_conds + col_conds, term, 0.0))
        return cast(total, out)

    return lazy(out, x.device, x.size, fn)


# ----------------------------------------------------------------------------- average pooling


def _avg_divisor(ah: Axis, aw: Axis, oh: Expr, ow: Expr, count_include_pad: bool) -> ir.Value:
    """Eager's count for window (oh, ow): the window clipped to the padded input, or to the
    input itself without ``count_include_pad`` (int64 ops rather than sympy's Min and Max,
    whose construction compares their arguments at length)."""
    def extent(a: Axis, o: Expr) -> ir.Value:
        start = _index(a.tap(o, 0))
        limit = a.size + a.pad if count_include_pad else a.size
        if is_negative(a.tap(a.out - 1, 0) + a.kernel - limit - 1):  # no window is clipped
            end = _index(a.tap(o, 0) + a.kernel)
        else:
            end = _int_op("minimum", _index(a.tap(o, 0) + a.kernel), _index(limit))
        if not count_include_pad and a.pad > 0:
            start = _int_op("maximum", start, _index(0))
        return _int_op("sub", end, start)

    return _int_op("mul", extent(ah, oh), extent(aw, ow))


def _avg_args(ctx: LoweringContext, divisor_override: Any) -> None:
    if divisor_override is not None and (type(divisor_override) is not int or divisor_override == 0):
        raise LoweringError(ctx.origin, f"divisor_override {divisor_override!r}")


@lowering(aten.avg_pool2d.default)
def _avg_pool2d(ctx: LoweringContext, x: TensorValue, kernel_size: Any, stride: Any = (),
                padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: Any = None) -> TensorValue:
    """The window's sum (in window order, from 0, as eager adds) over its count."""
    ah, aw = axes(ctx, x, _meta(ctx).shape[-2:], kernel_size, stride, padding)
    _avg_args(ctx, divisor_override)
    _check_taps(ctx, ah.kernel * aw.kernel, "window taps")
    src = window_source(ctx, x, _meta(ctx))
    acc = compute_dtype(x.dtype)
    lead = x.ndim - 2

    def fn(idx: list[Expr]) -> ir.Value:
        oh, ow = idx[lead], idx[lead + 1]
        total = _window_sum(src, idx, ah, aw, acc)
        if divisor_override is not None:
            return cast(ir.Op(acc, name="truediv", args=(total, const(divisor_override, acc))), x.dtype)
        return cast(_div(total, _avg_divisor(ah, aw, oh, ow, count_include_pad)), x.dtype)

    return lazy(x.dtype, x.device, (*x.size[:lead], ah.out, aw.out), fn)


@lowering(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue, kernel_size: Any,
                         stride: Any, padding: Any, ceil_mode: bool, count_include_pad: bool,
                         divisor_override: Any) -> TensorValue:
    """Each input element's gradient: the sum over the windows holding it, in ascending
    order, of the window's gradient over its count."""
    ah, aw = axes(ctx, x, grad.size[-2:], kernel_size, stride, padding)
    _avg_args(ctx, divisor_override)
    out = _meta(ctx).dtype
    acc = compute_dtype(out)
    rows = len(ah.covering(sympy.Integer(0), True))
    cols = len(aw.covering(sympy.Integer(0), True))
    _check_taps(ctx, rows * cols, "output windows per input element")
    grad = window_source(ctx, grad, _meta(ctx))
    lead = x.ndim - 2

    def fn(idx: list[Expr]) -> ir.Value:
        total: ir.Value = ir.Const(acc, value=0.0)
        for oh, row_conds in ah.covering(idx[lead], True):
            for ow, col_conds in aw.covering(idx[lead + 1], True):
                g = cast(grad.load([*idx[:lead], oh, ow]), acc)
                if divisor_override is not None:
                    term = ir.Op(acc, name="truediv", args=(g, const(divisor_override, acc)))
                else:
                    term = _div(g, _avg_divisor(ah, aw, oh, ow, count_include_pad))
                total = _add(total, masked(row_conds + col_conds, term, 0.0))
        return cast(total, out)

    return lazy(out, x.device, x.size, fn)


# ----------------------------------------------------------------------------- adaptive average


@dataclass(frozen=True)
class AdaptiveAxis:
    """One dim of an adaptive pooling with static sizes: window ``o`` is
    ``[floor(o*size/out), ceil((o+1)*size/out))``."""

    size: int
    out: int

    def start(self, o: Expr) -> Expr:
        return FloorDiv(o * self.size, self.out)

    def end(self, o: Expr) -> Expr:
        return FloorDiv((o + 1) * self.size + self.out - 1, self.out)

    @functools.cached_property
    def extents(self) -> list[int]:
        return [int(self.end(sympy.Integer(o)) - self.start(sympy.Integer(o))) for o in range(self.out)]

    @functools.cached_property
    def most_covering(self) -> int:
        """The most windows that hold one position."""
        starts = [int(self.start(sympy.Integer(o))) for o in range(self.out)]
        return max(sum(1 for s, n in zip(starts, self.extents) if s <= p < s + n) for p in range(self.size))

    def taps(self, o: Expr) -> list[tuple[Expr, list[ir.Value]]]:
        """Window ``o``'s positions, each with the condition that the window reaches it."""
        shortest = min(self.extents)
        return [(self.start(o) + i, [] if i < shortest else [cmp_index("lt", self.start(o) + i, self.end(o))])
                for i in range(max(self.extents))]

    def count(self, o: Expr) -> Expr:
        ext = self.extents
        return sympy.Integer(ext[0]) if len(set(ext)) == 1 else self.end(o) - self.start(o)

    def covering(self, h: Expr) -> list[tuple[Expr, list[ir.Value]]]:
        """The windows holding position ``h``, ascending: from the first whose end passes h."""
        first = FloorDiv(h * self.out, self.size)
        windows = []
        for t in range(self.most_covering):
            o = first + t
            conds = [] if t == 0 else [cmp_index("lt", o, self.out), cmp_index("le", self.start(o), h)]
            windows.append((o, conds))
        return windows


def _adaptive_axes(ctx: LoweringContext, x: TensorValue, out_hw: Sequence[Any]) -> tuple[AdaptiveAxis, AdaptiveAxis]:
    _check_channels_last(ctx, x)
    if x.ndim not in (3, 4) or x.dtype not in FLOAT_DTYPES:
        raise LoweringError(ctx.origin, f"a {x.ndim}-D {x.dtype} input")
    sizes = [*x.size[-2:], *(to_sympy(s) for s in out_hw)]
    if not all(s.is_number for s in sizes) or min(int(s) for s in sizes) < 1:
        raise LoweringError(ctx.origin, "symbolic or empty sizes (windows must be static)")
    h, w, oh, ow = (int(s) for s in sizes)
    return AdaptiveAxis(h, oh), AdaptiveAxis(w, ow)


def _adaptive_division(ctx: LoweringContext, ah: AdaptiveAxis, aw: AdaptiveAxis, meta: torch.Tensor) -> None:
    """Eager divides a sum by ``kh`` then ``kw``, but a channels-last tensor's vector lanes by
    ``kh * kw``; refuse where the two can round differently."""
    channels_last = meta.dim() == 4 and meta.shape[1] > 1 and meta.stride(1) == 1
    if not channels_last:
        return
    for kh in set(ah.extents):
        for kw in set(aw.extents):
            if kh > 1 and kw > 1 and (kh & (kh - 1) or kw & (kw - 1)):
                raise LoweringError(ctx.origin, f"channels-last windows of {kh}x{kw}: eager divides "
                                                "by kh*kw in vector lanes, by kh then kw elsewhere")


def _per_count(value: ir.Value, ah: AdaptiveAxis, aw: AdaptiveAxis, oh: Expr, ow: Expr) -> ir.Value:
    return _div(_div(value, ah.count(oh)), aw.count(ow))


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx: LoweringContext, x: TensorValue, output_size: Any) -> TensorValue:
    meta = _meta(ctx)
    ah, aw = _adaptive_axes(ctx, x, meta.shape[-2:])
    _check_taps(ctx, max(ah.extents) * max(aw.extents), "window taps")
    _adaptive_division(ctx, ah, aw, meta)
    src = window_source(ctx, x, _meta(ctx))
    acc = compute_dtype(x.dtype)
    lead = x.ndim - 2

    def fn(idx: list[Expr]) -> ir.Value:
        total = _window_sum(src, idx, ah, aw, acc)
        return cast(_per_count(total, ah, aw, idx[lead], idx[lead + 1]), x.dtype)

    return lazy(x.dtype, x.device, (*x.size[:lead], sympy.Integer(ah.out), sympy.Integer(aw.out)), fn)


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(ctx: LoweringContext, grad: TensorValue, x: TensorValue) -> TensorValue:
    meta = _meta(ctx)
    ah, aw = _adaptive_axes(ctx, x, grad.size[-2:])
    rows, cols = ah.covering(sympy.Symbol("h")), aw.covering(sympy.Symbol("w"))
    _check_taps(ctx, len(rows) * len(cols), "output windows per input element")
    _adaptive_division(ctx, ah, aw, meta)
    out = meta.dtype
    acc = compute_dtype(out)
    grad = window_source(ctx, grad, _meta(ctx))
    lead = x.ndim - 2

    def fn(idx: list[Expr]) -> ir.Value:
        total: ir.Value = ir.Const(acc, value=0.0)
        for oh, row_conds in ah.covering(idx[lead]):
            for ow, col_conds in aw.covering(idx[lead + 1]):
                g = cast(grad.load([*idx[:lead], oh, ow]), acc)
                total = _add(total, masked(row_conds + col_conds, _per_count(g, ah, aw, oh, ow), 0.0))
        return cast(total, out)

    return lazy(out, x.device, x.size, fn)


__all__ = ["MAX_TAPS", "Axis", "AdaptiveAxis"]
