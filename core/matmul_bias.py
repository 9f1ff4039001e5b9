"""Linear layers' biases as pointwise adds that fuse, for devices whose GEMM library does not
add the bias in its epilogue (``Capabilities.gemm_bias_epilogue`` False).

ATen's CPU ``addmm(bias, a, b)`` copies the broadcast bias over its output and then runs the
product with ``beta = 1``: a pass over the output of its own, before the product. This pass
calls ``mm(a, b)`` instead and adds the bias as a graph op, which fuses into the kernel that
consumes the product (a GELU, a residual add, a layer norm). On the 2-core CPU machine
(float32, one thread, inference, one process per run) that took Swin-tiny's step (small
size, frozen) from 1.87 to 1.76 ms, GPT-2's from 0.31 to 0.28 and BERT's from 0.35 to 0.34.

The values are those of a library that adds the bias after the product (cuBLAS without
its epilogue): the product rounded to its dtype, plus the bias, which is within an ulp of
ATen's single rounding in float32 and float64; 16-bit products keep ``addmm``
(:data:`SPLIT_DTYPES`). Only ``addmm`` with a 1-D bias of the product's dtype, ``beta`` and
``alpha`` 1 (a linear layer) is rewritten; Coil's own
decomposition leaves every other ``addmm`` as ``mm`` and adds already
(:mod:`coil.decompositions`)."""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.fx

from .graph_edit import caller, settled

log = logging.getLogger(__name__)
aten = torch.ops.aten


def split_matmul_bias(gm: torch.fx.GraphModule, fused: Callable[[torch.device], bool]) -> int:
    """Rewrite ``gm``'s linear-layer ``addmm`` nodes whose device's GEMM library does not add
    the bias itself (``fused(device)`` False) in place; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.addmm.default and _splittable(node) \
                and not fused(node.meta["val"].device):
            call = caller(gm.graph, node)
            bias, a, b = node.args
            with gm.graph.inserting_before(node):
                added = call(aten.add.Tensor, (call(aten.mm.default, (a, b)), bias))
            node.replace_all_uses_with(added)
            gm.graph.erase_node(node)
            count += 1
    return settled(gm, count, log, "%d linear-layer biases moved into pointwise adds")


def _splittable(node: torch.fx.Node) -> bool:
    if len(node.args) != 3 or any(node.kwargs.get(k, 1) != 1 for k in ("alpha", "beta")) \
            or set(node.kwargs) - {"alpha", "beta"}:
        return False
    bias, out = node.args[0], node.meta.get("val")
    b = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
    return (isinstance(out, torch.Tensor) and isinstance(b, torch.Tensor) and b.dim() == 1
            and b.dtype == out.dtype and out.dtype in SPLIT_DTYPES)


#: Dtypes whose product may be rounded before the bias is added. A 16-bit ``addmm`` adds the
#: bias to the float32 accumulator and rounds once; rounding the product to bf16 first, then
#: the sum, moved 15% of a bf16 linear layer's outputs by one ulp (0.003 at 0.5) under CPU
#: autocast. In float32 the two roundings differ by at most an ulp of float32.
SPLIT_DTYPES = (torch.float32, torch.float64)
