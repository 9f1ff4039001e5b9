"""Functional collectives (``torch.ops._c10d_functional``) as asynchronous library calls.

A graph traced under ``torch.distributed`` holds a collective (``all_reduce``,
``all_gather_into_tensor``, ``reduce_scatter_tensor``...) whose call starts the communication
and returns its output at once, and a ``wait_tensor`` of that output that blocks until it is
done. Both lower as ATen calls (``ExternNode``); this module gives them the roles the rest of
the core needs:

* :func:`mark` (a pass over the lowered graph) turns them into :class:`CollectiveNode` and
  :class:`WaitNode`. A wait *reads* every buffer its collective reads or writes (its
  "in-flight" buffers), so the scheduler orders an input mutation of such a buffer after the
  wait, and the memory planner keeps each of them alive, unreused and never written in place,
  until the wait has run;
* :func:`order_class` tells the scheduler's topological order to start collectives as soon
  as their inputs exist and to run a wait only when nothing else is ready: it lands just
  before the first step that needs its result, after all the work that does not (the
  ``collective_overlap`` knob off puts it right after its collective, for comparison);
  :func:`order_edges` keeps collectives in the order the graph gives them, the order every
  rank issues them in;
* :func:`bind` lets the device's backend supply its own implementation
  (``DeviceBackend.collective``, SDK 0.11.0; torch's op by default);
* :func:`describe` writes where each wait landed into the graph's report (``coil.explain``).

Nothing here names a device; the collective runs on whatever ``torch.distributed`` backend
its process group has (gloo, NCCL, a vendor's)."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from . import ir

log = logging.getLogger(__name__)

#: Namespaces of torch's functional collectives (``c10d_functional`` is the older spelling).
NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d_functional")
WAIT = "wait_tensor"


def _parts(op: Any) -> tuple[str, str] | None:
    """(namespace, op name) of an ATen overload, or None for anything else."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    return op.namespace, op._schema.name.split("::")[-1]


def is_collective_op(op: Any) -> bool:
    """Whether ``op`` starts a functional collective (not its wait)."""
    parts = _parts(op)
    return parts is not None and parts[0] in NAMESPACES and parts[1] != WAIT


def is_wait_op(op: Any) -> bool:
    parts = _parts(op)
    return parts is not None and parts[0] in NAMESPACES and parts[1] == WAIT


def in_graph(gm: torch.fx.GraphModule) -> bool:
    """Whether an FX graph calls a functional collective."""
    return any(n.op == "call_function" and (is_collective_op(n.target) or is_wait_op(n.target))
               for n in gm.graph.nodes)


def without_capture(config: Any) -> Any:
    """``config`` with graph capture off, for a graph holding collectives: a recording runs
    the graph more than once on its first call (and decides per rank whether to keep the
    replay), so its collectives would run more often on this rank than on the others."""
    if config.graph_capture in ("off", False):
        return config
    log.debug("coil: a graph with collectives is not recorded for replay")
    return dataclasses.replace(config, graph_capture="off")


@dataclass
class CollectiveNode(ir.ExternNode):
    """A collective's start: the call returns its outputs at once, and they hold the result
    only once the wait has run. Its outputs' strides are checked after the wait instead (a
    copy of a tensor in flight would copy what is not there yet)."""

    #: The ATen op, as the graph has it (``op`` may become the backend's implementation).
    aten_op: Any = None
    #: Its record in the graph's report (``FallbackRecord``, kind "collective").
    record: Any = None

    def in_flight(self) -> tuple[str, ...]:
        """Buffers the collective may read or write until its wait: its tensor arguments (a
        gather or a scatter reads its input while it runs) and its outputs."""
        return tuple(sorted(self.reads() | set(self.aliases))) + tuple(self.output_names)


@dataclass
class WaitNode(ir.ExternNode):
    """``wait_tensor`` of a collective's output: its result holds the collective's result.
    It reads the collective's in-flight buffers too, which is how the scheduler and the
    memory planner learn that they are in use until here."""

    #: The collective it waits for (None: one started outside this graph).
    collective: str | None = None
    in_flight: tuple[str, ...] = ()
    aten_op: Any = None
    record: Any = None

    def reads(self) -> set[str]:
        return super().reads() | set(self.in_flight)


def _recast(node: ir.ExternNode, cls: type, **extra: Any) -> Any:
    fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    return cls(**fields, aten_op=node.op, **extra)


def _op_label(op: Any) -> str:
    return f"{op.namespace}.{op._schema.name.split('::')[-1]}.{op._overloadname}"


def mark(graph: Any) -> int:
    """Give the collectives and waits of a lowered graph (``coil.graph.LoweredGraph``) their
    node types, and their records in the report the kind ``"collective"``. Returns how many
    collectives the graph starts."""
    nodes: list[ir.Node] = graph.nodes
    records: dict[str, list[Any]] = {}
    for record in graph.fallbacks:  # one per ATen call the lowering made, in graph order
        records.setdefault(record.op, []).append(record)
    producer: dict[str, ir.ExternNode] = {}
    started = 0
    for i, node in enumerate(nodes):
        if isinstance(node, ir.ExternNode) and (is_collective_op(node.op) or is_wait_op(node.op)):
            queue = records.get(_op_label(node.op))
            record = queue.pop(0) if queue else None
            if is_collective_op(node.op):
                nodes[i] = node = _recast(node, CollectiveNode, record=record)
                started += 1
                reason = "asynchronous library call"
            else:
                source = _source(node, producer)
                in_flight = source.in_flight() if source is not None else tuple(sorted(node.reads()))
                nodes[i] = node = _recast(node, WaitNode, collective=source.name if source else None,
                                          in_flight=in_flight, record=record)
                reason = f"waits for {source.name if source else 'a collective started before this graph'}"
            if record is not None:
                record.kind, record.reason = "collective", reason
        if isinstance(node, ir.ExternNode):
            for out in node.output_names:
                producer[out] = node
    return started


def _source(wait: ir.ExternNode, producer: dict[str, ir.ExternNode]) -> CollectiveNode | None:
    """The collective whose output ``wait`` waits for, through ATen view ops in between."""
    seen: set[str] = set()
    todo = sorted(wait.reads())
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if isinstance(node, CollectiveNode):
            return node
        if node is not None:
            todo.extend(node.aliases)
    return None


def order_class(node: ir.Node, overlap: bool) -> int:
    """Where a ready step goes in the scheduler's topological order, lowest first: a
    collective as soon as it can start (0), ordinary work (1), a wait when nothing else is
    ready (2) -- or, with ``overlap`` off, a wait as soon as it can run (-1)."""
    if isinstance(node, CollectiveNode):
        return 0
    if isinstance(node, WaitNode):
        return 2 if overlap else -1
    return 1


def order_edges(nodes: Sequence[ir.Node]) -> list[tuple[int, int]]:
    """(earlier, later) index pairs that keep the collectives in graph order: every rank
    must issue a process group's collectives in the same order, and the graph's order is the
    one they all traced."""
    starts = [i for i, n in enumerate(nodes) if isinstance(n, CollectiveNode)]
    return list(zip(starts, starts[1:]))


def unwaited(steps: Sequence[object]) -> set[str]:
    """In-flight buffers of collectives that no step of this graph waits for (their wait is
    in another graph): they must outlive the call."""
    waited = {s.collective for s in steps if isinstance(s, WaitNode)}
    out: set[str] = set()
    for s in steps:
        if isinstance(s, CollectiveNode) and s.name not in waited:
            out |= set(s.in_flight())
    return out


def bind(steps: Sequence[object], implementation: Callable[[torch.device, Any], Any]) -> None:
    """Let each collective and wait call what its device's backend supplies:
    ``implementation(device, aten_op)`` returns the callable (the op itself by default)."""
    for s in steps:
        if isinstance(s, (CollectiveNode, WaitNode)):
            chosen = implementation(s.device, s.aten_op)
            if chosen is not None and chosen is not s.aten_op:
                log.debug("%s: %s calls %r", s.name, _op_label(s.aten_op), chosen)
                s.op = chosen


def comment(node: ir.ExternNode) -> str:
    """A note for the wrapper line of a collective or a wait ("" for other calls)."""
    if isinstance(node, CollectiveNode):
        return f"  # start {_op_label(node.aten_op)}"
    if isinstance(node, WaitNode):
        return f"  # wait for {node.collective or 'a collective started before this graph'}"
    return ""


@dataclass(frozen=True)
class Placement:
    """Where a collective started and where its waits landed, in the graph's steps."""

    op: str
    start: int
    waits: tuple[int, ...]
    #: The steps that run while it is in flight (between the start and the first wait).
    overlapped: tuple[str, ...]

    def text(self) -> str:
        if not self.waits:
            return f"started at step {self.start}; waited after this graph"
        where = ", ".join(str(w) for w in self.waits)
        work = f"{len(self.overlapped)} step(s) in flight: {', '.join(self.overlapped)}" \
            if self.overlapped else "nothing in flight"
        return f"started at step {self.start}, waited at step {where}; {work}"


def step_label(step: object) -> str:
    """A step as reports name it: a kernel's name, an ATen call's op."""
    if isinstance(step, ir.ExternNode):
        op = getattr(step, "aten_op", None) or step.op
        return _op_label(op) if isinstance(op, torch._ops.OpOverload) else getattr(op, "__name__", str(op))
    return getattr(step, "name", type(step).__name__)


def describe(steps: Sequence[object]) -> list[Placement]:
    """Each collective's placement in ``steps``, also written as the reason of its record in
    the graph's report."""
    out = []
    for i, s in enumerate(steps):
        if not isinstance(s, CollectiveNode):
            continue
        waits = tuple(j for j, w in enumerate(steps) if isinstance(w, WaitNode) and w.collective == s.name)
        end = waits[0] if waits else i + 1
        between = tuple(step_label(t) for t in steps[i + 1:end] if not isinstance(t, WaitNode))
        placement = Placement(step_label(s), i, waits, between)
        if s.record is not None:
            s.record.reason = placement.text()
        for j in waits:
            if steps[j].record is not None:
                steps[j].record.reason = f"at step {j}, for {placement.op} (step {i})"
        out.append(placement)
    return out


__all__ = ["CollectiveNode", "WaitNode", "Placement", "mark", "order_class", "order_edges",
           "unwaited", "bind", "describe", "is_collective_op", "is_wait_op"]
