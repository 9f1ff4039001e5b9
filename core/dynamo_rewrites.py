"""Dynamo's own rewrites of ``addcdiv`` and ``addcmul``, undone before AOTAutograd.

Dynamo traces ``torch.addcdiv(a, b, c, value=v)`` as ``a + v * (b / c)`` (``torch.div``,
``torch.mul``, ``torch.add``), and the in-place methods ``a.addcdiv_(b, c, value=v)`` and
``a.addcmul_(b, c, value=v)`` as ``prims.fma(b / c, v, a)`` and ``prims.fma(b * c, v, a)``
copied into ``a`` (torch 2.13), or as ``a.add_(v * (b / c))`` and ``a.add_(b * c * v)``
(torch 2.11, with ``operator.mul`` for the products of ``addcmul_``). Eager's kernels compute
each of these ops in float32 for half types and round once; the rewritten graph rounds after
each op, as every compiler that keeps eager's
per-op rounding then computes it (bf16 ``addcdiv``: 679 of 4096 elements off eager, up to half
the value where the sum cancels, under ``aot_eager`` too; found by a hunt, session 38). These
are the optimizers' updates (Adam's ``addcmul_`` of the squared gradient and ``addcdiv_`` of the
step), so bf16 optimizer states took them.

:func:`restore_fused_updates` turns each such chain back into the op the user called, so that
AOTAutograd traces the op (``coil.decompositions`` decomposes it computing in float32 and
rounding once). A chain is recognised by its marks: an ``fma`` prim (which only Dynamo's
rewrites put in a graph) fed by a division or product used nowhere else; or a division or
product -> ``mul`` by a number -> ``add`` (or the method ``add_``), each used only by the
next, traced from one expression of the user's code that calls ``addcdiv`` or ``addcmul``
(so an update the user wrote op by op keeps its per-op rounding). Anything else is left as
it is."""
from __future__ import annotations

import logging
import operator

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
        found = _from_fma(node) or _from_written_out(node)
        if found is None:
            continue
        op, base, first, second, value, chain = found
        with graph.inserting_before(node):
            try:
                emitter = Emitter(graph, node)
            except Exception:  # noqa: BLE001 - no fake value recorded: leave the chain as traced
                continue
            try:
                if isinstance(op, str):  # the in-place method, on the tensor add_ updated
                    fused = emitter.method(op, base, first, second, value=value)
                else:
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


#: Targets of a traced division and product.
_DIV = (torch.div, operator.truediv)
_MUL = (torch.mul, operator.mul)


def _from_written_out(node: torch.fx.Node) -> tuple | None:
    """``torch.add(a, torch.mul(torch.div(b, c), v))`` -> ``addcdiv``, and ``a.add_(v * (b /
    c))`` -> ``a.addcdiv_`` (``addcmul`` and ``addcmul_`` with a product for the division),
    from one expression of the user's code that calls that op."""
    functional = node.op == _FN and node.target is torch.add
    if not (functional or (node.op == "call_method" and node.target == "add_")) \
            or len(node.args) != 2 or node.kwargs:
        return None
    base, scaled = node.args
    if not _only_feeds(scaled, node) or scaled.target not in _MUL or len(scaled.args) != 2 or scaled.kwargs:
        return None
    inner, value = scaled.args
    if not isinstance(value, (int, float)) or not _only_feeds(inner, scaled) or len(inner.args) != 2 \
            or inner.kwargs:
        return None
    name = "addcdiv" if inner.target in _DIV else "addcmul" if inner.target in _MUL else None
    origin = _origin(node)
    if name is None or not origin or any(_origin(n) != origin for n in (scaled, inner)) or name not in origin:
        return None
    op = getattr(torch, name) if functional else f"{name}_"
    return op, base, inner.args[0], inner.args[1], value, (scaled, inner)


def _only_feeds(node: object, user: torch.fx.Node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == _FN and list(node.users) == [user]


def _origin(node: torch.fx.Node) -> str:
    """The line of user code ``node`` was traced from: the innermost frame of the stack trace
    Dynamo recorded (its ``File`` line and the code), without the carets under the code,
    which mark each sub-expression's own span; "" when none was recorded."""
    trace = node.meta.get("stack_trace") or ""
    at = trace.rfind('File "')
    lines = (trace[at:] if at >= 0 else trace).splitlines()
    return "\n".join(line for line in lines if line.strip(" ^~"))


__all__ = ["restore_fused_updates"]
