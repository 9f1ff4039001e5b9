"""The memory side of the scheduler's order: which ready group to run next so that fewer
bytes are alive at once (:meth:`coil.scheduler.Scheduler._topo_order` asks a
:class:`MemoryView` for each ready group's priority)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    from .scheduler import Scheduler


class MemoryView:
    """Bytes of the buffers a group would free (it is their last unscheduled reader) and
    allocate, for :meth:`Scheduler._topo_order`. Only buffers that nodes write, or inputs the
    wrapper frees (``Scheduler.freed_inputs``), and that are not graph outputs can be freed;
    symbolic sizes count as 0."""

    def __init__(self, sched: "Scheduler", alive: list[int], deferrable: set[int] = frozenset()) -> None:
        self.sched = sched
        self.deferrable = deferrable
        outputs = {sched._storage(o.name) for o in sched.graph.outputs if o.name}
        written = {sched._storage(o) for n in sched.nodes for o in n.outputs()} | sched.freed_inputs
        self.reads: dict[int, set[str]] = {}
        self.writes: dict[int, set[str]] = {}
        self.readers: dict[str, set[int]] = {}
        self._sizes: dict[str, int] = {}
        for g in alive:
            members = sched.groups[g].members
            self.reads[g] = {sched._storage(r) for i in members for r in sched.reads[i]} & (written - outputs)
            self.writes[g] = {sched._storage(o) for i in members for o in sched.nodes[i].outputs()}
            for name in self.reads[g]:
                self.readers.setdefault(name, set()).add(g)

    def _bytes(self, name: str) -> int:
        got = self._sizes.get(name)
        if got is None:
            buf = self.sched.graph.buffers.get(name)
            n = (sympy.Mul(*buf.layout.size) if buf.layout.size else sympy.Integer(1)) if buf else sympy.Integer(0)
            got = self._sizes[name] = int(n) * buf.layout.dtype.itemsize if buf and n.is_number else 0
        return got

    def priority(self, g: int) -> tuple[int, int]:
        """Groups that free more than they allocate first, the smallest allocation among them
        first (memory peaks while a group's outputs and inputs are both alive: a backward's
        weight gradient that frees a saved activation before the input gradient's matmul
        allocates the next one); then every other group in graph order, except that a group
        near the end of a chain (see :func:`deferrable`) that allocates more than it frees
        waits until nothing else is ready: what it writes would stay alive to the end anyway,
        so running it early only adds those bytes to every peak in between (a classifier's
        weight gradient, 1000 x 1280 in float32, computed first in MobileNetV2's backward and
        held through it; Inductor's order computes it last)."""
        freed = sum(self._bytes(b) for b in self.reads[g] if self.readers.get(b) == {g})
        allocated = sum(self._bytes(b) for b in self.writes[g] - self.reads[g])
        if freed > allocated:
            return (0, allocated)
        if self._leaves_last_reader(g, allocated):
            return (1, -1)
        return (2, 0) if g in self.deferrable and allocated > freed else (1, 0)

    def _leaves_last_reader(self, g: int, allocated: int) -> bool:
        """Whether ``g`` allocates little (an eighth or less) next to a buffer it reads that
        one other group still reads: run first, it leaves that group the buffer's last
        reader, whose outputs may then take the buffer's memory (in place, or reused later).
        A layer norm's backward reads its input in two kernels: the weight and bias gradients
        (two vectors) and the input gradient (a tensor of the input's size); run in graph
        order, the input gradient was allocated while the input still had a reader, so both
        were alive at the top of DeiT-tiny's backward (Inductor computes the vectors first and
        writes the gradient over the saved input)."""
        return any(len(self.readers.get(b, ())) == 2 and allocated * 8 <= self._bytes(b)
                   for b in self.reads[g])

    def scheduled(self, g: int) -> None:
        for name in self.reads[g]:
            self.readers[name].discard(g)


def deferrable(succ: dict[int, set[int]]) -> set[int]:
    """Groups that nothing follows (their outputs are graph outputs, or unread), and groups
    that one such group alone follows (a weight gradient's matmul before its cast to the
    parameter's dtype): running one later keeps its inputs alive longer, and its outputs
    shorter. A group that feeds two or more (an activation's gradient, read by a weight
    gradient and a bias gradient) is not one: deferring it would defer the whole chain
    behind it in the order of the graph, not of the bytes."""
    leaves = {g for g, after in succ.items() if not after}
    return leaves | {g for g, after in succ.items() if len(after) == 1 and after <= leaves}
