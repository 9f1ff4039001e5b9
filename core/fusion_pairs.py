"""The pairs of IR nodes the scheduler tries to fuse, in the order it tries them.

First each node with the nodes it reads from (vertical fusion), then nodes that read the
same buffer (horizontal: the buffer is read once), then tiny pointwise nodes over the same
space that share nothing: a training forward graph of a conv net bumps each batch norm's
``num_batches_tracked`` by one in a one-element node of its own (ResNet-18: 20 of them, each
a launch of its own on the GPU and a call across the host's boundary on the CPU), and a
kernel holding all of them costs one. Each pair still passes the scheduler's checks
(devices, size limit, cycles, dependencies, the device's veto)."""
from __future__ import annotations

from typing import Sequence

import sympy

from . import ir

#: Elements up to which independent pointwise nodes over one space share a kernel: there the
#: launch costs more than the work, and one program or thread does all of it.
TINY_NUMEL = 1024


def fusion_pairs(nodes: Sequence[ir.Node], preds: Sequence[set[int]], reads: Sequence[set[str]],
                 fusable: tuple[type, ...]) -> list[tuple[int, int]]:
    """``(a, b)`` index pairs into ``nodes``: producers with consumers, then co-readers of a
    buffer, then tiny nodes over one space, each kind in node order."""
    pairs: list[tuple[int, int, int]] = []
    readers: dict[str, list[int]] = {}
    tiny: dict[tuple, list[int]] = {}
    for i, node in enumerate(nodes):
        if not isinstance(node, fusable):
            continue
        for p in preds[i]:
            if isinstance(nodes[p], fusable):
                pairs.append((0, p, i))
        for name in reads[i]:
            readers.setdefault(name, []).append(i)
        if _tiny(node):
            tiny.setdefault((node.device, tuple(node.ranges)), []).append(i)  # type: ignore[union-attr]
    for rs in readers.values():
        pairs += [(1, a, b) for a, b in zip(rs, rs[1:])]
    for ts in tiny.values():
        pairs += [(2, a, b) for a, b in zip(ts, ts[1:])]
    pairs.sort()
    return [(a, b) for _, a, b in pairs]


def _tiny(node: ir.Node) -> bool:
    if not isinstance(node, ir.PointwiseNode):
        return False
    numel = sympy.Mul(*node.ranges)
    return bool(numel.is_number and int(numel) <= TINY_NUMEL)
