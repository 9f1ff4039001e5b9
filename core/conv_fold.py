"""Batch norms of a frozen graph (:mod:`coil.freezing`) folded into the convolutions before
them: the per-channel affine ops after a convolution whose weight is frozen (an inference
batch norm as the decompositions write it, ``(y - mean) * invstd * gamma + beta``, and a split
bias) fold into its weight and bias, computed in float64 and rounded once. ResNets and
MobileNets then run no batch-norm arithmetic at all."""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from .constant_fold import ORIGIN, add_constant, value_of

log = logging.getLogger(__name__)
aten = torch.ops.aten

def frozen_operands(gm: torch.fx.GraphModule, conv: torch.fx.Node
                     ) -> tuple[torch.Tensor, torch.Tensor | None, frozenset[int]] | None:
    """A convolution's frozen weight and bias (None when it has none) and their origin; None
    unless both are frozen constants."""
    if conv.op != "call_function" or conv.target is not aten.convolution.default:
        return None
    weight = value_of(gm, conv.args[1])
    bias_node = conv.args[2]
    bias = value_of(gm, bias_node) if bias_node is not None else None
    if weight is None or (bias_node is not None and bias is None):
        return None
    origin = conv.args[1].meta[ORIGIN] | (bias_node.meta[ORIGIN] if bias_node is not None else frozenset())
    return weight, bias, origin


def _per_channel(c: Any, out: torch.Tensor, channels: int, device: torch.device) -> torch.Tensor | None:
    """``c`` (a number, or a tensor that broadcasts along the output's channel dim only) as a
    float64 vector over the channels on ``device`` (the weight's); None for anything else."""
    if isinstance(c, bool) or not isinstance(c, (int, float, torch.Tensor)):
        return None
    if not isinstance(c, torch.Tensor):
        return torch.full((channels,), float(c), dtype=torch.float64, device=device)
    if c.dim() > out.dim() or (c.dim() > 0 and c.dtype != out.dtype) or c.is_complex():
        return None
    shape = (1,) * (out.dim() - c.dim()) + tuple(c.shape)
    if any(n != 1 for d, n in enumerate(shape) if d != 1) or shape[1] not in (1, channels):
        return None
    return c.reshape(-1).to(device=device, dtype=torch.float64).expand(channels).clone()


def _affine_step(gm: torch.fx.GraphModule, user: torch.fx.Node, node: torch.fx.Node, out: torch.Tensor,
                 scale: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, frozenset[int]] | None:
    """``(scale, shift)`` after ``user``, which applies a per-channel constant to ``node``'s
    value (``y * scale + shift`` so far), with that constant's origin; None when ``user`` is
    not such an op."""
    target = user.target
    if target not in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor) or user.kwargs:
        return None
    meta = user.meta.get("val")
    if not isinstance(meta, torch.Tensor) or meta.dtype != out.dtype or meta.shape != out.shape:
        return None
    if len(user.args) != 2 or node not in user.args or user.args[0] is user.args[1]:
        return None
    first = user.args[0] is node
    other = user.args[1] if first else user.args[0]
    origin: frozenset[int] = frozenset()
    if isinstance(other, torch.fx.Node):
        tensor = value_of(gm, other)
        if tensor is None:
            return None
        origin = other.meta[ORIGIN]
        other = tensor
    v = _per_channel(other, out, scale.numel(), scale.device)
    if v is None:
        return None
    if target is aten.mul.Tensor:
        return scale * v, shift * v, origin
    if target is aten.div.Tensor and first:
        return scale / v, shift / v, origin
    if target is aten.add.Tensor:
        return scale, shift + v, origin
    if target is aten.sub.Tensor:
        return (scale, shift - v, origin) if first else (-scale, v - shift, origin)
    return None


def fold_batch_norms(gm: torch.fx.GraphModule) -> int:
    """Fold the per-channel affine ops after each frozen convolution into it; returns how many
    convolutions absorbed some."""
    graph = gm.graph
    folded = 0
    for conv in list(graph.nodes):
        operands = frozen_operands(gm, conv)
        out = conv.meta.get("val")
        if operands is None or conv.args[6] or not isinstance(out, torch.Tensor) or out.dim() < 2:
            continue
        weight, bias, origin = operands
        if not out.dtype.is_floating_point or weight.dtype != out.dtype:
            continue
        channels = int(weight.shape[0])
        # on the weight's device: the constants the ops apply are there (a CUDA model's)
        scale = torch.ones(channels, dtype=torch.float64, device=weight.device)
        shift = (bias.to(device=weight.device, dtype=torch.float64) if bias is not None
                 else torch.zeros(channels, dtype=torch.float64, device=weight.device))
        node, last = conv, None
        while len(node.users) == 1:
            user = next(iter(node.users))
            step = _affine_step(gm, user, node, out, scale, shift)
            if step is None:
                break
            scale, shift, more = step
            origin = origin | more
            node = last = user
        if last is None:
            continue
        new_weight = torch.empty_like(weight)  # the weight's own layout (channels-last, say)
        new_weight.copy_(weight.to(torch.float64) * scale.view(-1, *[1] * (weight.dim() - 1)))
        w = add_constant(gm, new_weight, origin, conv)
        b = add_constant(gm, shift.to(weight.dtype), origin, conv)
        with graph.inserting_before(conv):
            new = graph.call_function(aten.convolution.default, (conv.args[0], w, b, *conv.args[3:]))
        new.meta["val"] = out
        last.replace_all_uses_with(new)
        folded += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return folded
