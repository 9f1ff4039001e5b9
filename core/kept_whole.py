"""Torch ops whose decomposition under AOTAutograd gives wrong results, kept whole.

A decomposition table passed to AOTAutograd can leave an op alone, but not one whose Python
decomposition PyTorch registers as the op's kernel for the Autograd key: tracing takes that
one whatever the table says. ``multilabel_margin_loss``'s counts the classes after a row's
-1 terminator (the op's documented padding): 2.05 for eager's 0.85 on targets
``[3, 0, -1, 1]``, under ``aot_eager`` and Inductor too (found by a hunt against eager,
session 30). So before AOTAutograd, :func:`keep_whole` replaces each such call in the Dynamo
graph with a custom op (``coil::...``) that runs ATen's kernel, with ATen's backward as its
gradient: the compiled graph calls the library, as eager does."""
from __future__ import annotations

import operator

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor
from torch.nn import _reduction

from .dynamo_ops import Emitter


@torch.library.custom_op("coil::multilabel_margin_loss", mutates_args=())
def multilabel_margin_loss(x: Tensor, target: Tensor, reduction: int) -> tuple[Tensor, Tensor]:
    """ATen's ``multilabel_margin_loss_forward``: the loss and the targets' mask."""
    loss, is_target = torch.ops.aten.multilabel_margin_loss_forward(x, target, reduction)
    return loss, is_target


@multilabel_margin_loss.register_fake
def _(x: Tensor, target: Tensor, reduction: int) -> tuple[Tensor, Tensor]:
    size = (x.shape[0],) if reduction == 0 and x.dim() == 2 else ()
    return x.new_empty(size), x.new_empty(target.shape)


def _setup(ctx: object, inputs: tuple, output: tuple) -> None:
    x, target, reduction = inputs
    ctx.save_for_backward(x, target, output[1])  # type: ignore[attr-defined]
    ctx.reduction = reduction  # type: ignore[attr-defined]


def _backward(ctx: object, grad: Tensor, _grad_mask: Tensor) -> tuple[Tensor, None, None]:
    x, target, is_target = ctx.saved_tensors  # type: ignore[attr-defined]
    return (torch.ops.aten.multilabel_margin_loss_backward(grad, x, target, ctx.reduction, is_target),  # type: ignore[attr-defined]
            None, None)


multilabel_margin_loss.register_autograd(_backward, setup_context=_setup)

def _multilabel_margin_loss_args(node: torch.fx.Node) -> tuple | None:
    """``(input, target, reduction as ATen's enum)`` of a call of ``F.multilabel_margin_loss``
    (as Dynamo records it) or of ``torch._C._nn.multilabel_margin_loss``; None for another
    spelling or a reduction the graph computes."""
    if node.target is torch._C._nn.multilabel_margin_loss:
        bound = dict(zip(("input", "target", "reduction"), node.args), **node.kwargs)
        reduction = bound.get("reduction", 1)
    else:
        bound = dict(zip(("input", "target", "size_average", "reduce", "reduction"), node.args), **node.kwargs)
        size_average, reduce = bound.get("size_average"), bound.get("reduce")
        if isinstance(size_average, torch.fx.Node) or isinstance(reduce, torch.fx.Node) or \
                not isinstance(bound.get("reduction", "mean"), str):
            return None
        reduction = (_reduction.legacy_get_enum(size_average, reduce) if size_average is not None or
                     reduce is not None else _reduction.get_enum(bound.get("reduction", "mean")))
    if "input" not in bound or "target" not in bound or not isinstance(reduction, int):
        return None
    return bound["input"], bound["target"], reduction


#: Torch-level functions of a Dynamo graph -> (the custom op that keeps each whole, the
#: custom op's arguments from the call's node).
KEPT = {F.multilabel_margin_loss: (torch.ops.coil.multilabel_margin_loss.default, _multilabel_margin_loss_args),
        torch._C._nn.multilabel_margin_loss: (torch.ops.coil.multilabel_margin_loss.default,
                                              _multilabel_margin_loss_args)}


def keep_whole(gm: torch.fx.GraphModule) -> int:
    """Replace each call in :data:`KEPT` with its custom op; the number replaced."""
    count = 0
    for node in list(gm.graph.nodes):
        kept = KEPT.get(node.target) if node.op == "call_function" else None
        args = kept[1](node) if kept is not None else None
        if args is None:
            continue
        with gm.graph.inserting_before(node):
            emit = Emitter(gm.graph, node)
            both = emit.function(kept[0], *args)
            loss = emit.function(operator.getitem, both, 0)
        node.replace_all_uses_with(loss)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count
