"""The pairs of IR nodes the scheduler tries to fuse, in the order it tries them.

First each node with the nodes it reads from (vertical fusion), then nodes that read the
same buffer (horizontal: the buffer is read once), then tiny pointwise nodes over the same
space that share nothing: a training forward graph of a conv net bumps each batch norm's
``num_batches_tracked`` by one in a one-element node of its own (ResNet-18: 20 of them, each
a launch of its own on the GPU and a call across the host's boundary on the CPU), and a
kernel holding all of them costs one. A tiny pair joins two fusion groups only when every
node of both is tiny (:func:`tiny`): a tiny cast of a bias gradient fused into the large sum
that makes it is not, and joining such groups had put the twelve bias-gradient sums of a
ViT's attention layers in one kernel of a few programs, which took 0.6 ms on the H200. Each
pair still passes the scheduler's checks (devices, size limit, cycles, dependencies, the
device's veto)."""
from __future__ import annotations

from typing import Sequence

import sympy

from . import ir

#: Elements up to which independent pointwise nodes over one space share a kernel: there the
#: launch costs more than the work, and one program or thread does all of it.
TINY_NUMEL = 1024


def fusion_pairs(nodes: Sequence[ir.Node], preds: Sequence[set[int]], reads: Sequence[set[str]],
                 fusable: tuple[type, ...]) -> list[tuple[int, int, bool]]:
    """``(a, b, tiny_only)`` index pairs into ``nodes``: producers with consumers, then
    co-readers of a buffer, then tiny nodes over one space (``tiny_only``: fuse only groups of
    tiny nodes), each kind in node order."""
    pairs: list[tuple[int, int, int]] = []
    readers: dict[str, list[int]] = {}
    small: dict[tuple, list[int]] = {}
    for i, node in enumerate(nodes):
        if not isinstance(node, fusable):
            continue
        for p in preds[i]:
            if isinstance(nodes[p], fusable):
                pairs.append((0, p, i))
        for name in reads[i]:
            readers.setdefault(name, []).append(i)
        if tiny(node):
            small.setdefault((node.device, tuple(node.ranges)), []).append(i)  # type: ignore[union-attr]
    for rs in readers.values():
        pairs += [(1, a, b) for a, b in zip(rs, rs[1:])]
    for ts in small.values():
        pairs += [(2, a, b) for a, b in zip(ts, ts[1:])]
    pairs.sort()
    return [(a, b, kind == 2) for kind, a, b in pairs]


def tiny(node: ir.Node) -> bool:
    """A pointwise node of at most :data:`TINY_NUMEL` elements."""
    if not isinstance(node, ir.PointwiseNode):
        return False
    numel = sympy.Mul(*node.ranges)
    return bool(numel.is_number and int(numel) <= TINY_NUMEL)
