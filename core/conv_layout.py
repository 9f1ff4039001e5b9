"""Channels-last convolutions for devices whose convolution library prefers them.

cuDNN runs 2-D convolutions on tensor cores in NHWC; given NCHW tensors it transposes around
each one or, for depthwise convolutions, falls back to a slow direct kernel (on the H200,
EfficientNet-B0's depthwise convolutions took 1.9 ms per call in NCHW against 0.5 ms in
NHWC). This pass gives every 2-D convolution of an inference graph channels-last input and
weight (a ``clone`` in that memory format, which fuses into the kernel that produces or casts
the operand), then propagates the new layouts through the graph with fake tensors, so the
pointwise kernels between convolutions read and write channels-last too. Clones that the
propagated layouts make redundant are dropped, and graph outputs keep eager's strides.

Driven by ``Capabilities.conv_channels_last`` of the device's backend. Static shapes and
inference graphs only: a training graph's saved activations are laid out by the forward
graph that AOTAutograd traced, which the backward graph's inputs must match."""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.fx

log = logging.getLogger(__name__)
aten = torch.ops.aten
CL = torch.channels_last


def to_channels_last(gm: torch.fx.GraphModule, prefers: Callable[[torch.device], bool]) -> int:
    """Rewrite ``gm``'s 2-D convolutions to channels-last; returns how many."""
    graph = gm.graph
    convs = [n for n in graph.nodes if n.op == "call_function" and n.target is aten.convolution.default
             and _is_4d(n.args[0]) and _is_4d(n.args[1]) and prefers(n.meta["val"].device)]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not convs or not all(_static(n.meta.get("val")) for n in placeholders):
        return 0
    output = next(n for n in graph.nodes if n.op == "output")
    eager_outputs = {id(a): a.meta.get("val") for a in _flat(output.args[0]) if isinstance(a, torch.fx.Node)}
    clones = []
    for conv in convs:
        for i in (0, 1):
            with graph.inserting_before(conv):
                clone = graph.call_function(aten.clone.default, (conv.args[i],), {"memory_format": CL})
            conv.update_arg(i, clone)
            clones.append(clone)
    fake = torch._guards.detect_fake_mode([n.meta["val"] for n in placeholders if "val" in n.meta])
    if fake is None:
        _undo(graph, clones)
        return 0
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    try:
        FakeTensorProp(gm, fake).propagate_dont_convert_inputs(*[n.meta["val"] for n in placeholders])
    except Exception as exc:  # noqa: BLE001 - an op the fake mode cannot run: keep eager's layouts
        log.debug("channels-last propagation failed (%s); convolutions left as they were", exc)
        _undo(graph, clones)
        FakeTensorProp(gm, fake).propagate_dont_convert_inputs(*[n.meta["val"] for n in placeholders])
        return 0
    for clone in clones:  # already channels-last: the clone would only copy
        src = clone.args[0]
        if isinstance(src, torch.fx.Node) and _is_channels_last(src.meta.get("val")):
            clone.replace_all_uses_with(src)
            graph.erase_node(clone)
    _keep_output_strides(graph, output, eager_outputs)
    graph.lint()
    gm.recompile()
    log.debug("%d convolutions in channels-last", len(convs))
    return len(convs)


def _keep_output_strides(graph: torch.fx.Graph, output: torch.fx.Node, eager: dict[int, object]) -> None:
    """Outputs whose layout the propagation changed are copied back into eager's (contiguous)."""
    def fix(a: object) -> object:
        if not isinstance(a, torch.fx.Node):
            return a
        before, after = eager.get(id(a)), a.meta.get("val")
        if (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
                and before.stride() != after.stride() and before.is_contiguous()):
            with graph.inserting_before(output):
                copy = graph.call_function(aten.clone.default, (a,), {"memory_format": torch.contiguous_format})
            copy.meta["val"] = before
            return copy
        return a
    output.args = (torch.fx.node.map_aggregate(output.args[0], fix),)


def _undo(graph: torch.fx.Graph, clones: list[torch.fx.Node]) -> None:
    for clone in clones:
        clone.replace_all_uses_with(clone.args[0])
        graph.erase_node(clone)


def _is_4d(a: object) -> bool:
    return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dim() == 4


def _static(v: object) -> bool:
    if isinstance(v, torch.Tensor):
        return all(isinstance(s, int) for s in (*v.shape, *v.stride()))
    return not isinstance(v, torch.SymInt)


def _is_channels_last(v: object) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_contiguous(memory_format=CL)


def _flat(a: object) -> list[object]:
    return list(a) if isinstance(a, (list, tuple)) else [a]
