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


def pad_gemms(gm: torch.fx.GraphModule, alignment_bytes: Callable[[torch.device], int]) -> int:
    """Pad the ``mm`` and ``addmm`` (1-D bias) nodes of ``gm`` in place; returns how many."""
    padded = 0
    pads: dict[tuple[torch.fx.Node, tuple[int, ...]], torch.fx.Node] = {}  # shared paddings
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        plan = _plan(node, alignment_bytes)
        if plan is not None:
            _rewrite(gm, node, *plan, pads)
            padded += 1
    return settled(gm, padded, log, "padded %d matmuls to the device's GEMM alignment")


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
        every later matmul can share it."""
        key = (t, tuple(widths))
        if key not in pads:
            after = t
            if t.op == "placeholder":  # after the last placeholder: they stay first
                after = [n for n in graph.nodes if n.op == "placeholder"][-1]
            with graph.inserting_after(after):
                pads[key] = caller(graph, node)(aten.constant_pad_nd.default, (t, widths))
        return pads[key]

    with graph.inserting_before(node):
        *bias, a, b = node.args
        if pad_m:
            base = _transposed_from(a)
            a = (call(aten.permute.default, (pad(base, [0, pad_m]), [1, 0])) if base is not None
                 else pad(a, [0, 0, 0, pad_m]))
        if pad_k:
            a = pad(a, [0, pad_k])
            b = pad(b, [0, 0, 0, pad_k])
        if pad_n:
            b = pad(b, [0, pad_n])
            bias = [pad(bias[0], [0, pad_n])] if bias else []
        wide = call(node.target, (*bias, a, b))
        out = wide
        if pad_n:
            out = call(aten.slice.Tensor, (out, 1, 0, node.meta["val"].shape[1]))
        if pad_m:
            out = call(aten.slice.Tensor, (out, 0, 0, node.meta["val"].shape[0]))
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    for operand in node.args[-2:]:  # a transpose only the matmul read: a second reader of its
        if (isinstance(operand, torch.fx.Node) and not operand.users  # base would realize the base
                and operand.target in (aten.permute.default, aten.t.default, aten.transpose.int)):
            graph.erase_node(operand)


def _transposed_from(a: torch.fx.Node) -> torch.fx.Node | None:
    """``t`` where ``a`` is ``t`` transposed (``permute(t, [1, 0])``, ``t(t)``, ``transpose``)
    and ``t`` is a row-major matrix node; else None."""
    if a.op != "call_function" or not a.args or not isinstance(a.args[0], torch.fx.Node):
        return None
    t = a.args[0]
    val = t.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or not val.is_contiguous():
        return None
    if a.target is aten.permute.default and list(a.args[1]) == [1, 0]:
        return t
    if a.target is aten.t.default:
        return t
    if a.target is aten.transpose.int and sorted(d % 2 for d in a.args[1:3]) == [0, 1]:
        return t
    return None
