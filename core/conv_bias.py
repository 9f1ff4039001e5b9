"""Convolution biases as pointwise adds that fuse.

A convolution library that does not fuse the bias (cuDNN through ATen) runs it as a second
kernel over the whole output: EfficientNet-B0's 16 squeeze-and-excitation blocks paid 32
such launches per call on the H200. This pass calls the convolution without its bias and
adds the bias, viewed as ``(1, C, 1, ...)``, as a graph op; the add then fuses into the
kernel that consumes the convolution (the activation, a batch norm, a residual). The values
are those of a library that adds the bias after the convolution (ATen's CUDA path): the
convolution's result, rounded to its dtype, plus the bias. A float16 or bfloat16 convolution
on a device whose eager kernel adds the bias itself, rounding once
(``Capabilities.half_conv_bias_in_kernel``: ATen's CPU path), keeps its bias (split, 332 of
1024 bf16 elements differed from eager's by an ulp: found by a hunt, session 38).

Device-neutral; it applies to every convolution whose bias has the output's dtype."""
from __future__ import annotations

import logging

import torch
import torch.fx

from .graph_edit import caller, settled
from .lowering.context import capability

log = logging.getLogger(__name__)
aten = torch.ops.aten


def split_conv_bias(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s biased convolutions in place; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.convolution.default and _splittable(node):
            _rewrite(gm.graph, node)
            count += 1
    return settled(gm, count, log, "%d convolution biases moved into pointwise adds")


def _splittable(node: torch.fx.Node) -> bool:
    bias = node.args[2] if len(node.args) > 2 else None
    out = node.meta.get("val")
    if node.kwargs or not isinstance(bias, torch.fx.Node) or not isinstance(out, torch.Tensor):
        return False
    b = bias.meta.get("val")
    if out.dtype in (torch.float16, torch.bfloat16) and capability(out.device, "half_conv_bias_in_kernel", False):
        return False
    return (isinstance(b, torch.Tensor) and b.dim() == 1 and b.dtype == out.dtype
            and isinstance(b.shape[0], int) and out.dim() >= 3 and out.shape[1] == b.shape[0])


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    call = caller(graph, node)

    out = node.meta["val"]
    bias = node.args[2]
    with graph.inserting_before(node):
        conv = call(aten.convolution.default, (node.args[0], node.args[1], None, *node.args[3:]))
        shape = [1, bias.meta["val"].shape[0]] + [1] * (out.dim() - 2)  # type: ignore[union-attr]
        added = call(aten.add.Tensor, (conv, call(aten.view.default, (bias, shape))))
    node.replace_all_uses_with(added)
    graph.erase_node(node)
