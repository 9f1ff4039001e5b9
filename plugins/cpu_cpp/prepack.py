"""Frozen convolutions through oneDNN and linear layers through MKL, their weights packed
once (the ``freezing`` knob; ``DeviceBackend.frozen_convolution`` and ``frozen_linear``, SDK 1.5.0).

ATen's CPU convolution reorders its weight into oneDNN's blocked layout on every call; with
the weight frozen, that reorder runs once, when the graph compiles
(``mkldnn._reorder_convolution_weight``), and each call runs
``mkldnn._convolution_pointwise`` over the packed weight. ResNet-18 (batch 2, 64x64 images,
one thread, float32): 15.0 ms per call in eager, 8.6 ms with its weights packed. That op returns
channels-last outputs, so a graph with packed convolutions is laid out channels-last
(:func:`packs`, read by ``prefers_channels_last``).

oneDNN's call costs some 25-30 us however small the convolution, and ATen knows it: for
float32 it calls oneDNN only where its rule (``use_mkldnn`` in ATen's convolution) expects that
to win, and computes the rest (1x1 unstrided convolutions over fewer than 16 images on one
thread, single images of fewer than 20480 elements with small windows) as a matrix product.
MobileNetV3's 1x1 convolutions over 1x1-8x8 images (batch 2, one thread) take 8-11 us that
way, against 25-31 us packed. Packing only saves oneDNN's weight reorder, so a convolution is
packed exactly where ATen would call oneDNN (:func:`aten_uses_onednn`, the same rule).
(Timing both ways while the graph compiles was tried and misled: every call made inside
AOTAutograd's compile pays 20-25 us more in dispatch, which favours the larger call.)

One exception counts for the layout only: a 1x1 unstrided convolution with a weight of
262144 elements or more, which ATen computes as a matrix product on one thread, ran
0.54-0.68x that time packed (ResNet-50's 1024->256 and the like, batch 2); such convolutions
now go to MKL or ``mm`` (below), which were faster still, but a graph that has them is still
laid out channels-last, as the packed call wanted.

Linear layers (``DeviceBackend.frozen_linear``) go to MKL's packed matrix product
(``mkl._mkl_reorder_linear_weight`` once, ``mkl._mkl_linear`` per call) where it measured
faster, one thread and two, on this machine (an AMD EPYC): 8 to 256 rows against a weight of
at least 32768 elements took 0.39-0.97x ATen's time (``F.linear``), and most of that range
0.5-0.8x; fewer rows (2: 1.01-1.33x) and smaller weights (64x256: up to 1.33x) lose.

1x1 convolutions (unstrided, unpadded, one group; :func:`as_matmul`) are matrix products
of the pixels by the weight, and run as such (``DeviceBackend.convolution_as_matmul``: the
core calls ``mm`` over the channels-last input; frozen ones go to MKL's linear call first,
where its rule above takes them). oneDNN's call, packed or not, cost more at every shape
measured (batch 2, float32, this machine): with two threads ATen's convolution calls oneDNN
without a packed weight and took 1.3-5.8x ``mm``'s time over 21 shapes from MobileNets,
EfficientNet, ConvNeXt and ResNet-50 (1943 against 906 us in all); packed, oneDNN took 826
us over 15 of them against 558 for ``mm`` and 526 for MKL (one thread: 1106, 898, 855). With
one thread ATen's own matrix product was level with ``mm`` for small weights and 1.1-1.3x
slower for 65536 weight elements or more. EfficientNet-B0 with two threads: 3.65 against
8.25 ms per call.

Float32 only; depthwise convolutions the core generates itself
(``Capabilities.depthwise_conv``: at most 25 taps) are left to it."""
from __future__ import annotations

from typing import Callable

import torch

import coil.sdk as sdk

#: Most window taps of a depthwise convolution the core generates (``coil.lowering.depthwise``).
DEPTHWISE_TAPS = 25
#: Fewest weight elements of a 1x1 convolution packed where ATen would not call oneDNN.
POINTWISE_WEIGHT = 262144
#: Rows and weight elements of the linear layers packed for MKL (see above).
LINEAR_ROWS = (8, 256)
LINEAR_WEIGHT = 32768


def packs(info: sdk.ConvolutionInfo) -> bool:
    """Whether :func:`frozen_convolution` takes this convolution."""
    kh, kw = info.kernel_size
    return (info.frozen and not info.transposed and info.dtype == torch.float32
            and not (info.depthwise and kh * kw <= DEPTHWISE_TAPS)
            and torch.backends.mkldnn.is_available()
            and (aten_uses_onednn(info) or _large_pointwise(info)))


def _large_pointwise(info: sdk.ConvolutionInfo) -> bool:
    """A 1x1 convolution whose weight is large enough that oneDNN's packed call beats ATen's
    matrix product (:data:`POINTWISE_WEIGHT`)."""
    out_channels, in_per_group, kh, kw = info.weight
    return kh == kw == 1 and info.groups == 1 and out_channels * in_per_group >= POINTWISE_WEIGHT


def as_matmul(info: sdk.ConvolutionInfo) -> bool:
    """Whether a 1x1 convolution (unstrided, unpadded, one group) runs as a matrix product
    (``DeviceBackend.convolution_as_matmul``; see the module's notes)."""
    return info.dtype == torch.float32 and info.pointwise


def frozen_convolution(info: sdk.ConvolutionInfo, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The convolution over ``weight`` packed for ``info``'s input size; None where
    :func:`packs` says no, and for the 1x1 convolutions that go as matrix products
    (:func:`as_matmul`: MKL's packed linear call or ``mm``)."""
    if (not packs(info) or as_matmul(info) or weight.dtype != torch.float32
            or (bias is not None and bias.dtype != torch.float32)):
        return None
    padding, stride, dilation = list(info.padding), list(info.stride), list(info.dilation)
    groups = info.groups
    packed = torch.ops.mkldnn._reorder_convolution_weight(weight, padding, stride, dilation, groups,
                                                          list(info.input))
    bias = bias.contiguous() if bias is not None else None
    op = torch.ops.mkldnn._convolution_pointwise.default

    def convolution(x: torch.Tensor) -> torch.Tensor:
        return op(x, packed, bias, padding, stride, dilation, groups, "none", [], "")

    return convolution


def aten_uses_onednn(info: sdk.ConvolutionInfo) -> bool:
    """Whether ATen's CPU convolution would call oneDNN for a float32 convolution like
    ``info`` on this many threads (its ``use_mkldnn`` rule)."""
    n, c, h, w = info.input
    kh, kw = info.kernel_size
    strided = any(s != 1 for s in info.stride)
    dilated = any(d != 1 for d in info.dilation)
    not_single_threaded_1x1 = (strided or dilated or n >= 16 or kh != 1 or kw != 1
                               or torch.get_num_threads() > 1)
    big_enough = info.groups > 1 or (kh > 3 and kw > 3) or n > 1 or n * c * h * w > 20480
    return not_single_threaded_1x1 and big_enough


def frozen_linear(rows: int, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``input @ weight.T + bias`` through MKL with the weight packed once, where that
    measured faster (:data:`LINEAR_ROWS`, :data:`LINEAR_WEIGHT`); None elsewhere."""
    if (weight.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32)
            or not LINEAR_ROWS[0] <= rows <= LINEAR_ROWS[1] or weight.numel() < LINEAR_WEIGHT
            or not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear")):
        return None
    weight = weight.contiguous()
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
    op = torch.ops.mkl._mkl_linear.default

    def linear(x: torch.Tensor) -> torch.Tensor:
        return op(x, packed, weight, bias, rows)

    return linear
