"""Padding matmuls to the device's GEMM alignment.

A GEMM library picks its fast kernels only when every matrix's rows start on its alignment
(tensor cores: 16 bytes). A 16-bit matmul whose inner (K) or output (N) width is not a
multiple of that -- BERT's and GPT-2's vocabulary projections, 30522 and 50257 wide -- runs
a kernel for 2-element alignment instead: on the H200, BERT's output layer took 1.6 ms as
given and 0.55 ms padded to 30528. This pass widens such a matmul's operands with zeros (the
padding fuses into the kernel that casts or writes the operand) and slices the result back:
the same values, a strided view of a wider buffer.

Driven by ``Capabilities.gemm_alignment_bytes`` of the device's backend (0: never pad)."""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.fx

from .graph_edit import caller

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: Matmuls smaller than this (M*N*K) are left alone: the copies would cost more than they save.
MIN_FLOPS = 1 << 24
#: Only these dtypes run on tensor cores with an alignment requirement worth padding for.
PADDED_DTYPES = (torch.bfloat16, torch.float16)


def pad_gemms(gm: torch.fx.GraphModule, alignment_bytes: Callable[[torch.device], int]) -> int:
    """Pad the ``mm`` and ``addmm`` (1-D bias) nodes of ``gm`` in place; returns how many."""
    padded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        plan = _plan(node, alignment_bytes)
        if plan is not None:
            _rewrite(gm, node, *plan)
            padded += 1
    if padded:
        gm.graph.lint()
        gm.recompile()
        log.debug("padded %d matmuls to the device's GEMM alignment", padded)
    return padded


def _plan(node: torch.fx.Node, alignment_bytes: Callable[[torch.device], int]) -> tuple[int, int] | None:
    """(K padding, N padding) for ``node``, or None to leave it."""
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
    if not all(isinstance(s, int) for s in sizes):
        return None  # symbolic sizes: left to the library
    m, k, n = sizes
    align = alignment_bytes(a.device) // a.element_size()
    if align <= 1 or m * n * k < MIN_FLOPS:
        return None
    pad_k, pad_n = -k % align, -n % align
    return (pad_k, pad_n) if pad_k or pad_n else None


def _rewrite(gm: torch.fx.GraphModule, node: torch.fx.Node, pad_k: int, pad_n: int) -> None:
    graph = gm.graph
    call = caller(graph, node)

    with graph.inserting_before(node):
        *bias, a, b = node.args
        if pad_k:
            a = call(aten.constant_pad_nd.default, (a, [0, pad_k]))
            b = call(aten.constant_pad_nd.default, (b, [0, 0, 0, pad_k]))
        if pad_n:
            b = call(aten.constant_pad_nd.default, (b, [0, pad_n]))
            bias = [call(aten.constant_pad_nd.default, (bias[0], [0, pad_n]))] if bias else []
        wide = call(node.target, (*bias, a, b))
        out = call(aten.slice.Tensor, (wide, 1, 0, node.meta["val"].shape[1])) if pad_n else wide
    node.replace_all_uses_with(out)
    graph.erase_node(node)
