"""1x1 convolutions as matrix products, where the device's backend asks for it
(``DeviceBackend.convolution_as_matmul``: inference and training forward graphs since SDK
1.6.0, the training backward's ``convolution_backward`` since 1.7.0).

A 1x1 convolution (unstrided, unpadded, one group) is a linear layer over each pixel's
channels. Over a channels-last input the pixels' channel vectors are the rows of a matrix
already, so the convolution is ``mm`` of that view by the transposed weight, and the product
viewed back is the output, channels-last. A library's convolution can cost far more than the
product (the C++ plugin's measurements are in its ``prepack`` module). The pass runs after
the freezing passes (a frozen convolution the backend packed is no longer a convolution) and
after the bias split (:mod:`coil.conv_bias`), so the bias is an add that fuses into the next
kernel. The forward's product leaves what it saves for the backward (the input and the
weight) unchanged; the backward's ``convolution_backward`` of such a convolution, its input
and output gradient channels-last, becomes two products over the same pixel rows (the input's
gradient: the output gradient's rows by the weight; the weight's: the output gradient's rows,
transposed, by the input's) and a column sum for the bias."""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import torch
import torch.fx

from .conv_layout import describe
from .wrapper import reinterpret
from .sdk.backend import ConvolutionInfo

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: The device's backend's ``convolution_as_matmul`` (None where its plugin predates it).
Asker = Callable[[torch.device], Callable[[ConvolutionInfo], bool] | None]


def pixel_rows(x: torch.Tensor) -> torch.Tensor:
    """A 4-D input's pixels as the rows of a (pixels, channels) matrix (a view where ``x`` is
    channels-last: one call of torch's C helper, where permute and reshape dispatch twice;
    these products run dozens of times per call of a mobile net)."""
    n, c, h, w = x.shape
    if x.is_contiguous(memory_format=torch.channels_last):
        return reinterpret(x, (n * h * w, c), (c, 1), 0)
    return x.permute(0, 2, 3, 1).reshape(n * h * w, c)


def from_pixel_rows(rows: torch.Tensor, like: tuple[int, int, int, int]) -> torch.Tensor:
    """A (pixels, channels) product as the 4-D output of an input shaped ``like`` (batch,
    channels, height, width), channels-last."""
    n, _, h, w = like
    c = rows.shape[1]
    if rows.is_contiguous():
        return reinterpret(rows, (n, c, h, w), (h * w * c, 1, w * c, c), 0)
    return rows.view(n, h, w, c).permute(0, 3, 1, 2)


def _matrix(weight: torch.Tensor) -> torch.Tensor:
    """A 1x1 convolution's (out, in, 1, 1) weight as an (out, in) matrix."""
    out, inp = weight.shape[0], weight.shape[1]
    if weight.stride()[:2] == (inp, 1):  # contiguous or channels-last: the same memory order
        return reinterpret(weight, (out, inp), (inp, 1), 0)
    return weight.reshape(out, inp)


def _static_4d(values: list[object]) -> bool:
    return all(isinstance(v, torch.Tensor) and v.dim() == 4 and all(isinstance(s, int) for s in v.shape)
               for v in values)


def _candidate(conv: torch.fx.Node) -> bool:
    if conv.op != "call_function" or conv.target is not aten.convolution.default or conv.kwargs:
        return False
    if len(conv.args) != 9 or conv.args[2] is not None:  # biases were split off before
        return False
    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in (conv.args[0], conv.args[1])]
    values.append(conv.meta.get("val"))
    if not _static_4d(values):
        return False
    x, weight, _ = values
    return (x.is_contiguous(memory_format=torch.channels_last)  # its pixels are rows: a view
            and (weight.is_contiguous() or weight.is_contiguous(memory_format=torch.channels_last)))


class PointwiseMatmul:
    """``aten.convolution`` of a 1x1 kernel as ``aten.mm``: the input's pixels (a view of a
    channels-last input) by the transposed weight, the product returned as the 4-D
    channels-last output. One library call to the core, so the kernels around it index a
    plain 4-D buffer: the views of the product, lowered one by one, left div/mod index
    arithmetic in them (MobileNetV2's depthwise kernels, measured, ran 22x slower)."""

    _schema = torch._C.parse_schema("coil::pointwise_convolution(Tensor input, Tensor weight) -> Tensor")
    #: Reported as a library call by design, not as a fallback.
    coil_library = True
    #: Holds nothing but its class: the graph cache keeps it (pickled) in a wrapper's namespace.
    coil_cacheable = True
    __name__ = "coil.pointwise_convolution"

    def __init__(self) -> None:
        self._op = self  # what the wrapper calls

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return from_pixel_rows(torch.mm(pixel_rows(x), _matrix(weight).t()), x.shape)

    def __repr__(self) -> str:
        return self.__name__


def _backward_candidate(node: torch.fx.Node) -> ConvolutionInfo | None:
    """What the backend is told about a ``convolution_backward`` whose output gradient and
    input are channels-last (their pixels are rows: views), as of the forward convolution;
    None for any other node."""
    if node.op != "call_function" or node.target is not aten.convolution_backward.default or node.kwargs:
        return None
    if len(node.args) != 11:
        return None
    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:3]]
    if not _static_4d(values):
        return None
    grad, x, weight = values
    if not (grad.is_contiguous(memory_format=torch.channels_last)
            and x.is_contiguous(memory_format=torch.channels_last)
            and (weight.is_contiguous() or weight.is_contiguous(memory_format=torch.channels_last))):
        return None
    stride, padding, dilation, transposed, _, groups = node.args[4:10]
    return ConvolutionInfo(input=_four(x), weight=_four(weight), output=_four(grad),
                           stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                           groups=int(groups), transposed=bool(transposed), dtype=x.dtype)


def _four(t: torch.Tensor) -> tuple[int, int, int, int]:
    n, c, h, w = (int(s) for s in t.shape)
    return n, c, h, w


def _pair(v: Sequence[int]) -> tuple[int, int]:
    return int(v[0]), int(v[-1])


class PointwiseMatmulBackward:
    """``aten.convolution_backward`` of a 1x1 convolution as products over pixel rows (views of
    the channels-last output gradient and input): the input's gradient is the gradient's rows
    by the weight, returned channels-last; the weight's is the gradient's rows, transposed, by
    the input's, returned in the strides the graph's metadata gives it (for a 1x1 weight any
    strides of its two real dims (in, 1) are one memory order); the bias's is the gradient's
    column sum. ``mask`` is the call's ``output_mask``: a gradient not asked for is None."""

    _schema = torch._C.parse_schema("coil::pointwise_convolution_backward(Tensor grad_output, Tensor input, "
                                    "Tensor weight) -> (Tensor, Tensor, Tensor)")
    coil_library = True
    coil_cacheable = True  # plain values only: the graph cache pickles it
    __name__ = "coil.pointwise_convolution_backward"

    def __init__(self, mask: tuple[bool, bool, bool], weight_stride: tuple[int, ...] | None) -> None:
        self.mask = mask
        self.weight_stride = weight_stride
        self._op = self  # what the wrapper calls

    def __call__(self, grad: torch.Tensor, x: torch.Tensor,
                 weight: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows = pixel_rows(grad)
        grad_input = grad_weight = grad_bias = None
        if self.mask[0]:
            grad_input = from_pixel_rows(torch.mm(rows, _matrix(weight)), x.shape)
        if self.mask[1]:
            product = torch.mm(rows.t(), pixel_rows(x))
            grad_weight = (reinterpret(product, weight.shape, self.weight_stride, 0) if self.weight_stride
                           else product.view(weight.shape))
        if self.mask[2]:
            grad_bias = rows.sum(0)
        return grad_input, grad_weight, grad_bias

    def __repr__(self) -> str:
        return self.__name__


def _weight_stride(node: torch.fx.Node) -> tuple[int, ...] | None:
    """The weight gradient's strides from the metadata where they are a (out, in) matrix's
    memory order, else None (the product's own view; the wrapper restrides it)."""
    meta = node.meta.get("val")
    grad_weight = meta[1] if isinstance(meta, (list, tuple)) and len(meta) == 3 else None
    if not isinstance(grad_weight, torch.Tensor):
        return None
    stride = tuple(int(s) for s in grad_weight.stride())
    out, inp = int(grad_weight.shape[0]), int(grad_weight.shape[1])
    ok = (out == 1 or stride[0] == inp) and (inp == 1 or stride[1] == 1)
    return stride if ok else None


def _replace(graph: torch.fx.Graph, node: torch.fx.Node, target: object, args: tuple) -> None:
    """``node`` replaced by a call of ``target`` on ``args``, with its metadata (the same
    results)."""
    with graph.inserting_before(node):
        new = graph.call_function(target, args)  # type: ignore[arg-type]
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def matmul_convolutions(gm: torch.fx.GraphModule, ask: Asker, *, backward: Asker | None = None) -> int:
    """Rewrite the bias-free 1x1 convolutions over channels-last inputs whose backend asks
    for it as matrix products, and with ``backward`` (the asker of backends that answer for
    backward graphs too) their ``convolution_backward``; returns how many."""
    graph = gm.graph
    count = 0
    for conv in list(graph.nodes):
        if backward is not None and (info := _backward_candidate(conv)) is not None:
            wants = backward(conv.args[1].meta["val"].device)
            if info.pointwise and wants is not None and wants(info):
                mask = tuple(bool(m) for m in conv.args[10])
                _replace(graph, conv, PointwiseMatmulBackward(mask, _weight_stride(conv)), tuple(conv.args[:3]))
                count += 1
            continue
        if not _candidate(conv):
            continue
        info = describe(conv)
        wants = ask(conv.meta["val"].device)
        if info.pointwise and wants is not None and wants(info):
            _replace(graph, conv, PointwiseMatmul(), (conv.args[0], conv.args[1]))
            count += 1
    if count:
        graph.lint()
        gm.recompile()
        log.debug("%d 1x1 convolution(s) as matrix products", count)
    return count
