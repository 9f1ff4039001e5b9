"""Dynamo's own rewrites of ``addcdiv`` and ``addcmul``, undone before AOTAutograd.

Dynamo traces ``torch.addcdiv(a, b, c, value=v)`` as ``a + v * (b / c)`` (``torch.div``,
``torch.mul``, ``torch.add``), and the in-place methods ``a.addcdiv_(b, c, value=v)`` and
``a.addcmul_(b, c, value=v)`` as ``prims.fma(b / c, v, a)`` and ``prims.fma(b * c, v, a)``
copied into ``a``. Eager's kernels compute each of these ops in float32 for half types and
round once; the rewritten graph rounds after each op, as every compiler that keeps eager's
per-op rounding then computes it (bf16 ``addcdiv``: 679 of 4096 elements off eager, up to half
the value where the sum cancels, under ``aot_eager`` too; found by a hunt, session 38). These
are the optimizers' updates (Adam's ``addcmul_`` of the squared gradient and ``addcdiv_`` of the
step), so bf16 optimizer states took them.

:func:`restore_fused_updates` turns each such chain back into the op the user called, so that
AOTAutograd traces the op (``coil.decompositions`` decomposes it computing in float32 and
rounding once). A chain is recognised by its marks: an ``fma`` prim (which only Dynamo's
rewrites put in a graph) fed by a division or product used nowhere else; or a ``div`` ->
``mul`` -> ``add`` of ``torch`` functions, each used only by the next, traced from one
expression of the user's code that calls ``addcdiv``. Anything else is left as it is."""
from __future__ import annotations

import logging

import torch
import torch.fx

from .dynamo_ops import Emitter
from .graph_edit import settled

log = logging.getLogger(__name__)

_FN = "call_function"


def restore_fused_updates(gm: torch.fx.GraphModule) -> int:
    """Rewrite the chains in ``gm``'s graph; the number rewritten."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        found = _from_fma(node) or _from_addcdiv(node)
        if found is None:
            continue
        op, base, first, second, value, chain = found
        with graph.inserting_before(node):
            try:
                emitter = Emitter(graph, node)
            except Exception:  # noqa: BLE001 - no fake value recorded: leave the chain as traced
                continue
            try:
                fused = emitter.function(op, base, first, second, value=value)
            except Exception:  # noqa: BLE001 - an argument the op refuses: leave the chain as traced
                emitter.undo()
                continue
        if fused.meta["example_value"].dtype != node.meta["example_value"].dtype:
            emitter.undo()
            continue
        node.replace_all_uses_with(fused)
        for dead in (node, *chain):  # each used only by the one before it
            graph.erase_node(dead)
        count += 1
    return settled(gm, count, log, "%d addcdiv/addcmul chains restored from Dynamo's rewrites")


def _from_fma(node: torch.fx.Node) -> tuple | None:
    """``prims.fma(b / c, v, a)`` -> ``addcdiv``; ``prims.fma(b * c, v, a)`` -> ``addcmul``."""
    if node.op != _FN or node.target is not torch.ops.prims.fma.default or len(node.args) != 3 or node.kwargs:
        return None
    inner, value, base = node.args
    if not _only_feeds(inner, node) or not isinstance(value, (int, float)) or len(inner.args) != 2 or inner.kwargs:
        return None
    if inner.target is torch.div:
        return torch.addcdiv, base, inner.args[0], inner.args[1], value, (inner,)
    if inner.target is torch.mul:
        return torch.addcmul, base, inner.args[0], inner.args[1], value, (inner,)
    return None


def _from_addcdiv(node: torch.fx.Node) -> tuple | None:
    """``torch.add(a, torch.mul(torch.div(b, c), v))`` from one ``addcdiv(...)`` expression."""
    if node.op != _FN or node.target is not torch.add or len(node.args) != 2 or node.kwargs:
        return None
    base, product = node.args
    if not _only_feeds(product, node) or product.target is not torch.mul or len(product.args) != 2 \
            or product.kwargs or not isinstance(product.args[1], (int, float)):
        return None
    quotient = product.args[0]
    if not _only_feeds(quotient, product) or quotient.target is not torch.div or len(quotient.args) != 2 \
            or quotient.kwargs:
        return None
    trace = node.meta.get("stack_trace")
    if not trace or any(n.meta.get("stack_trace") != trace for n in (product, quotient)) \
            or "addcdiv" not in _last_frame(trace):
        return None
    return torch.addcdiv, base, quotient.args[0], quotient.args[1], product.args[1], (product, quotient)


def _only_feeds(node: object, user: torch.fx.Node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == _FN and list(node.users) == [user]


def _last_frame(trace: str) -> str:
    """The innermost frame of a stack trace Dynamo recorded: its ``File`` line and the code."""
    at = trace.rfind('File "')
    return trace[at:] if at >= 0 else trace


__all__ = ["restore_fused_updates"]
