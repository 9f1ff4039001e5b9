"""Padding matmuls to the device's GEMM alignment.

A GEMM library picks its fast kernels only when every matrix's rows start on its alignment
(tensor cores: 16 bytes). A 16-bit matmul whose inner (K) or output (N) width is not a
multiple of that -- BERT's and GPT-2's vocabulary projections, 30522 and 50257 wide -- runs
a kernel for 2-element alignment instead: on the H200, BERT's output layer took 1.6 ms as
given and 0.55 ms padded to 30528. This pass widens such a matmul's operands with zeros (the
padding fuses into the kernel that casts or writes the operand) and slices the result back:
the same values, a strided view of a wider buffer.

Which width must be aligned depends on how each matrix is stored: a row-major ``a`` (M x K)
needs K, a column-major one (a transposed view, stride (1, M)) needs M; a row-major ``b``
(K x N) needs N, a column-major one K; the result is row-major and needs N. The backward of
a vocabulary projection multiplies the transposed logits' gradient (column-major, M = 50257):
GPT-2's weight gradient took 4.3 ms on the H200 in a 2-element-aligned kernel. A column-major
``a`` that is a transpose of ``t`` is padded as ``t`` widened and transposed again, so it
stays column-major (no transposing copy) and shares its padding with a matmul that reads
``t`` itself, as the input gradient of the same projection does.

Driven by ``Capabilities.gemm_alignment_bytes`` of the device's backend (0: never pad)."""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.fx

from .graph_edit import caller, settled

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: Matmuls smaller than this (M*N*K) are left alone: the copies would cost more than they save.
MIN_FLOPS = 1 << 24
#: Only these dtypes run on tensor cores with an alignment requirement worth padding for.
PADDED_DTYPES = (torch.bfloat16, torch.float16)


def pad_gemms(gm: torch.fx.GraphModule, alignment_bytes: Callable[[torch.device], int], *,
              joint: bool = False) -> int:
    """Pad the ``mm`` and ``addmm`` (1-D bias) nodes of ``gm`` in place; returns how many.

    ``joint``: ``gm`` is AOTAutograd's joint graph, before partitioning (see
    :func:`shares_padding`); matmuls it leaves are padded in the forward and backward graphs."""
    plans = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (aten.mm.default, aten.addmm.default):
            plan = _plan(node, alignment_bytes)
            if plan is not None:
                plans[node] = plan
    if joint and plans:
        plans = shares_padding(gm.graph, plans)
    pads: dict[tuple[torch.fx.Node, tuple[int, ...]], torch.fx.Node] = {}  # shared paddings
    for node, plan in plans.items():
        _rewrite(gm, node, *plan, pads)
    return settled(gm, len(plans), log, "padded %d matmuls to the device's GEMM alignment")


def shares_padding(graph: torch.fx.Graph, plans: dict[torch.fx.Node, tuple[int, int, int]]
                   ) -> dict[torch.fx.Node, tuple[int, int, int]]:
    """The matmuls of a joint graph worth padding before it is partitioned.

    Padding the joint graph lets the forward and the backward read one padded matrix: under
    autocast, a tied vocabulary projection's bf16 weight was saved for the backward and
    padded again there (GPT-2: a second 74 MiB copy). But the partitioner never recomputes
    what a backward matmul reads: it saves it. So a padded matrix the backward reads must
    replace what the forward would have saved anyway. A matmul is kept when each matrix it
    widens is computed in the backward, or is read by the backward only through matmuls
    padding it the same way and is not a graph input (an input is free to keep; a padded copy
    of it would be saved besides). The others are padded after partitioning, graph by graph."""
    backward = _tangent_dependent(graph)
    plans = dict(plans)
    while True:
        targets = {node: _targets(node, *plan) for node, plan in plans.items()}
        dropped = [node for node, ts in targets.items()
                   if not all(_shareable(t, backward, targets) for t in ts)]
        if not dropped:
            return plans
        for node in dropped:
            del plans[node]


def _tangent_dependent(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The joint graph's backward: the nodes that depend on a tangent."""
    out: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if ((node.op == "placeholder" and str(node.target).startswith("tangents"))
                or any(arg in out for arg in node.all_input_nodes)):
            out.add(node)
    return out


def _targets(node: torch.fx.Node, pad_m: int, pad_k: int, pad_n: int
             ) -> list[tuple[torch.fx.Node, tuple[int, ...]]]:
    """(the matrix node padded, its widths) for each operand of ``node`` the plan widens."""
    a, b = node.args[-2:]
    out = []
    if pad_m or pad_k:
        out.append(_target(a, pad_m, pad_k)[:2])
    if pad_k or pad_n:
        out.append(_target(b, pad_k, pad_n)[:2])
    return out


def _shareable(target: tuple[torch.fx.Node, tuple[int, ...]], backward: set[torch.fx.Node],
               targets: dict[torch.fx.Node, list[tuple[torch.fx.Node, tuple[int, ...]]]]) -> bool:
    source = target[0]
    if source in backward:
        return True
    readers = [r for r in _readers(source) if r in backward]
    if not readers:
        return True
    return source.op != "placeholder" and all(target in targets.get(r, ()) for r in readers)


def _readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes that read ``node``, looking through transposes of it."""
    out = []
    for user in node.users:
        out += _readers(user) if _transpose_arg(user) is node else [user]
    return out


def _column_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(0) == 1 and t.shape[1] > 1 and t.stride(1) >= t.shape[0]


def _plan(node: torch.fx.Node, alignment_bytes: Callable[[torch.device], int]
          ) -> tuple[int, int, int] | None:
    """(M, K and N padding) for ``node``, or None to leave it."""
    a_node, b_node = node.args[-2], node.args[-1]
    if node.kwargs or not isinstance(a_node, torch.fx.Node) or not isinstance(b_node, torch.fx.Node):
        return None
    a, b = a_node.meta.get("val"), b_node.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dtype not in PADDED_DTYPES:
        return None
    if node.target is aten.addmm.default:
        bias = node.args[0]
        bias_val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
        if not isinstance(bias_val, torch.Tensor) or bias_val.dim() != 1:
            return None
    sizes = (*a.shape, b.shape[1])
    if not all(isinstance(s, int) for s in sizes) or not all(isinstance(s, int) for s in (*a.stride(), *b.stride())):
        return None  # symbolic sizes: left to the library
    m, k, n = sizes
    align = alignment_bytes(a.device) // a.element_size()
    if align <= 1 or m * n * k < MIN_FLOPS:
        return None
    a_cols, b_cols = _column_major(a), _column_major(b)
    pad_m = -m % align if a_cols else 0
    pad_k = -k % align if (not a_cols or b_cols) else 0
    pad_n = -n % align
    return (pad_m, pad_k, pad_n) if pad_m or pad_k or pad_n else None


def _rewrite(gm: torch.fx.GraphModule, node: torch.fx.Node, pad_m: int, pad_k: int, pad_n: int,
             pads: dict[tuple[torch.fx.Node, tuple[int, ...]], torch.fx.Node]) -> None:
    graph = gm.graph
    call = caller(graph, node)

    def pad(t: torch.fx.Node, widths: list[int]) -> torch.fx.Node:
        """``t`` widened with zeros, one node per (t, widths), placed right after ``t`` so
        every later matmul can share it (an earlier pass's, on the joint graph, too)."""
        key = (t, tuple(widths))
        for user in t.users:
            if (user.target is aten.constant_pad_nd.default and user.args[0] is t
                    and list(user.args[1]) == list(widths) and not user.args[2:] and _before(user, node)):
                pads.setdefault(key, user)
        if key not in pads:
            after = t
            if t.op == "placeholder":  # after the last placeholder: they stay first
                after = [n for n in graph.nodes if n.op == "placeholder"][-1]
            with graph.inserting_after(after):
                pads[key] = caller(graph, node)(aten.constant_pad_nd.default, (t, widths))
        return pads[key]

    def padded(x: torch.fx.Node, rows: int, cols: int) -> torch.fx.Node:
        source, widths, transposed = _target(x, rows, cols)
        widened = pad(source, list(widths))
        return call(aten.permute.default, (widened, [1, 0])) if transposed else widened

    with graph.inserting_before(node):
        *bias, a, b = node.args
        if pad_m or pad_k:
            a = padded(a, pad_m, pad_k)
        if pad_k or pad_n:
            b = padded(b, pad_k, pad_n)
        if pad_n:
            bias = [pad(bias[0], [0, pad_n])] if bias else []
        wide = call(node.target, (*bias, a, b))
        out = wide
        if pad_n:
            out = call(aten.slice.Tensor, (out, 1, 0, node.meta["val"].shape[1]))
        if pad_m:
            out = call(aten.slice.Tensor, (out, 0, 0, node.meta["val"].shape[0]))
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    for operand in node.args[-2:]:  # transposes only the matmul read: a second reader of
        while (isinstance(operand, torch.fx.Node) and not operand.users  # one would realize
               and _transpose_arg(operand) is not None):  # the matrix transposed
            graph.erase_node(operand)
            operand = operand.args[0]


def _before(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Whether ``a`` comes before ``b`` in their graph."""
    n = a.next
    while n.op != "root":
        if n is b:
            return True
        n = n.next
    return False


def _target(x: torch.fx.Node, rows: int, cols: int) -> tuple[torch.fx.Node, tuple[int, ...], bool]:
    """How the matrix ``x`` is widened by ``rows`` and ``cols``: (the node padded, the
    ``constant_pad_nd`` widths, whether the result is transposed back). A transpose of a
    row-major matrix is that matrix widened and transposed again: its layout kept (no
    transposing copy), its padding shared with every matmul that reads the matrix either way."""
    x = _canonical(x)
    base = _transposed_from(x)
    if base is not None:
        return base, _widths(cols, rows), True
    return x, _widths(rows, cols), False


def _widths(rows: int, cols: int) -> tuple[int, ...]:
    """``constant_pad_nd``'s widths that add ``rows`` and ``cols`` to a matrix at its ends."""
    return (0, cols, 0, rows) if rows else (0, cols)


def _transpose_arg(n: torch.fx.Node) -> torch.fx.Node | None:
    """``t`` where ``n`` is a 2-D transpose of the node ``t`` (``permute(t, [1, 0])``,
    ``t(t)``, ``transpose``); else None."""
    if n.op != "call_function" or not n.args or not isinstance(n.args[0], torch.fx.Node):
        return None
    t = n.args[0]
    val = t.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 2:
        return None
    if (n.target is aten.t.default or (n.target is aten.permute.default and list(n.args[1]) == [1, 0])
            or (n.target is aten.transpose.int and sorted(d % 2 for d in n.args[1:3]) == [0, 1])):
        return t
    return None


def _canonical(n: torch.fx.Node) -> torch.fx.Node:
    """``n`` with transposes of transposes taken off (the same view): a backward reads the
    forward's weight as ``permute(permute(w))``, and shares ``w``'s padding through this."""
    while True:
        t = _transpose_arg(n)
        u = _transpose_arg(t) if t is not None else None
        if u is None:
            return n
        n = u


def _transposed_from(a: torch.fx.Node) -> torch.fx.Node | None:
    """``t`` where ``a`` is ``t`` transposed and ``t`` is a row-major matrix node; else None."""
    t = _transpose_arg(a)
    if t is None:
        return None
    t = _canonical(t)
    return t if t.meta["val"].is_contiguous() else None
