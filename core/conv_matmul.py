"""1x1 convolutions of inference and training forward graphs as matrix products, where the
device's backend asks for it (``DeviceBackend.convolution_as_matmul``, SDK 1.6.0).

A 1x1 convolution (unstrided, unpadded, one group) is a linear layer over each pixel's
channels. Over a channels-last input the pixels' channel vectors are the rows of a matrix
already, so the convolution is ``mm`` of that view by the transposed weight, and the product
viewed back is the output, channels-last. A library's convolution can cost far more than the
product (the C++ plugin's measurements are in its ``prepack`` module). The pass runs after
the freezing passes (a frozen convolution the backend packed is no longer a convolution) and
after the bias split (:mod:`coil.conv_bias`), so the bias is an add that fuses into the next
kernel. A backward graph's convolutions (``convolution_backward``) are left as they are: the
forward's product leaves what it saves for them (the input and the weight) unchanged."""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.fx

from .conv_layout import describe
from .sdk.backend import ConvolutionInfo

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: The device's backend's ``convolution_as_matmul`` (None where its plugin predates it).
Asker = Callable[[torch.device], Callable[[ConvolutionInfo], bool] | None]


def pixel_rows(x: torch.Tensor) -> torch.Tensor:
    """A 4-D input's pixels as the rows of a (pixels, channels) matrix (a view where ``x`` is
    channels-last)."""
    n, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).reshape(n * h * w, c)


def from_pixel_rows(rows: torch.Tensor, like: tuple[int, int, int, int]) -> torch.Tensor:
    """A (pixels, channels) product as the 4-D output of an input shaped ``like`` (batch,
    channels, height, width), channels-last."""
    n, _, h, w = like
    return rows.view(n, h, w, rows.shape[1]).permute(0, 3, 1, 2)


def _candidate(conv: torch.fx.Node) -> bool:
    if conv.op != "call_function" or conv.target is not aten.convolution.default or conv.kwargs:
        return False
    if len(conv.args) != 9 or conv.args[2] is not None:  # biases were split off before
        return False
    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in (conv.args[0], conv.args[1])]
    values.append(conv.meta.get("val"))
    if not all(isinstance(v, torch.Tensor) and v.dim() == 4 and all(isinstance(s, int) for s in v.shape)
               for v in values):
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
    __name__ = "coil.pointwise_convolution"

    def __init__(self) -> None:
        self._op = self  # what the wrapper calls

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        weight = weight.reshape(weight.shape[0], weight.shape[1])
        return from_pixel_rows(torch.mm(pixel_rows(x), weight.t()), x.shape)

    def __repr__(self) -> str:
        return self.__name__


def matmul_convolutions(gm: torch.fx.GraphModule, ask: Asker) -> int:
    """Rewrite the bias-free 1x1 convolutions over channels-last inputs whose backend asks
    for it as matrix products; returns how many."""
    graph = gm.graph
    count = 0
    for conv in list(graph.nodes):
        if not _candidate(conv):
            continue
        info = describe(conv)
        wants = ask(conv.meta["val"].device)
        if not info.pointwise or wants is None or not wants(info):
            continue
        with graph.inserting_before(conv):
            new = graph.call_function(PointwiseMatmul(), (conv.args[0], conv.args[1]))
        new.meta.update(conv.meta)
        conv.replace_all_uses_with(new)
        graph.erase_node(conv)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
        log.debug("%d 1x1 convolution(s) as matrix products", count)
    return count
