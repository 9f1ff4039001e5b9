"""Self-check mode: every compiled graph runs beside eager, and a wrong result raises.

Turned on by ``COIL_CHECK=1``, ``torch.compile(..., options={"check": True})`` or
``coil.config.override(check=True)``. ``compile_graph`` then wraps the callable it returns
(:func:`checked`): each call copies the inputs, runs Coil's code on the originals and the ATen
graph eagerly on the copies, and compares every graph output, and every input afterwards (an
input the graph mutates must end up equal too; one it does not must be left alone). The first
difference beyond tolerance raises :class:`coil.errors.CheckError`, naming the output, how far
off it is, the scheduled step that wrote it (a kernel and the ATen ops it fused, or an ATen
fallback or library call) and a standalone repro script (:mod:`coil.repro`). When several
outputs differ, the one whose producer ran first is reported: later ones usually inherit its
error.

"Differs" means, per element, ``|coil - eager| > atol * max(1, max|eager|) + rtol * |eager|``
with ``(rtol, atol)`` from :data:`TOLERANCES` by dtype (the absolute term grows with the
output's magnitude, so a reordered float32 sum of large values does not trip it); NaN equals
NaN, infinities must match, integer and bool outputs must match exactly, and shapes and dtypes
must agree.

Graphs that draw random numbers (dropout, ``rand``: ATen ops tagged ``nondeterministic_seeded``,
unless their dropout probability is 0, as in attention at inference) are not checked, with one
logged note per graph: eager would draw different numbers. Outputs that hold nothing defined
(``empty``, an attention kernel's generator state) are not compared. The eager side leaves the
random generators as it found them. Off, nothing here runs (the callable is not wrapped); on,
each call costs a copy of the inputs and an eager run."""
from __future__ import annotations

import contextlib
import copy
import logging
import operator
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx

from . import ir, repro_writer
from .errors import CheckError
from .graph import LoweredGraph
from .kernel import Kernel

log = logging.getLogger(__name__)

#: ``dtype -> (rtol, atol)``; other floating types use float32's, complex types their real
#: type's. Looser than ``torch.testing.assert_close``'s per-op defaults, because a whole graph
#: is compared: fused kernels sum in another order and use vectorised math, and the difference
#: grows with depth (a training-mode EfficientNet-B0 forward graph on the CPU ends with a few
#: elements 7e-5 off, 1e-3 relative, with every kernel right). The bugs this mode is for are
#: off by far more than that.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-3, 1e-4),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (4e-2, 1e-2),
}


# ----------------------------------------------------------------------------- producers


@dataclass(frozen=True)
class Producer:
    """The scheduled step that wrote a buffer, as the error names it."""

    kind: str  # "kernel" | "fallback" | "library" | "input" | "constant" | "value"
    name: str
    ops: tuple[str, ...] = ()
    #: Position in the schedule (-1: not a step: a graph input, constant or plain value).
    step: int = -1
    #: The ATen view call the output was seen through, when it is a view of this step's buffer.
    via: str = ""
    #: For an ATen call: the Coil kernels that wrote its inputs (ATen itself is the reference,
    #: so a wrong result of an ATen call points at what fed it).
    fed_by: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind == "kernel":
            text = f"kernel {self.name} (fusing {', '.join(self.ops) or 'no ATen op'})"
        elif self.kind in ("fallback", "library"):
            text = f"the ATen {self.kind} call {self.name}"
            if self.fed_by:
                text += f" (ATen is the reference: suspect its inputs, from {'; '.join(self.fed_by)})"
        elif self.kind == "input":
            text = f"no step of the graph (graph input {self.name}, which Coil should not have changed)"
        else:
            text = f"the graph's {self.kind} {self.name}"
        return text + (f", seen through the ATen view {self.via}" if self.via else "")


@dataclass
class GraphProducers:
    """Who wrote each graph output, and each input the graph mutates (by position)."""

    outputs: list[Producer]
    inputs: dict[int, Producer]


def _op_name(op: Any) -> str:
    return str(getattr(op, "__name__", op)) if not hasattr(op, "_schema") else str(op)


def _written(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments an op writes in place, by its schema (``copy_``'s destination, ...)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    out = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            out.append(args[i] if i < len(args) else kwargs.get(arg.name))
    return out


def _mutated_args(node: ir.ExternNode) -> list[str]:
    """Buffers an extern call writes in place (``copy_``, ``index_put_`` falling back)."""
    return [v.name for v in _written(node.op, node.args, node.kwargs) if isinstance(v, ir.BufferRef)]


def _feeders(step: ir.ExternNode, writer: dict[str, Producer]) -> tuple[str, ...]:
    """The kernels whose buffers an extern call reads, looking through earlier ATen calls."""
    found: dict[str, None] = {}
    for name in sorted(step.reads()):
        who = writer.get(name)
        if who is None:
            continue
        if who.kind == "kernel":
            found[str(replace(who, via=""))] = None
        found.update(dict.fromkeys(who.fed_by))
    return tuple(found)


def producers(lowered: LoweredGraph, steps: Sequence[object]) -> GraphProducers:
    """Map every graph output (and mutated input) to the last step that wrote its buffer."""
    writer: dict[str, Producer] = {}
    for i, step in enumerate(steps):
        if isinstance(step, Kernel):
            who = Producer("kernel", step.name, step.origins, i)
            names = set(step.outputs)
            for kn in step.nodes:
                names |= set(kn.node.outputs()) | set(kn.stores)
            if step.special is not None:
                names |= set(step.special.outputs())
            if step.template is not None:
                names.add(step.template.output)
        elif isinstance(step, ir.ExternNode):
            op = _op_name(step.op)
            who = Producer(step.kind, op, (op,), i, fed_by=_feeders(step, writer))
            base = writer.get(step.aliases[0]) if len(step.aliases) == 1 else None
            if base is not None:  # an ATen view: its values are those its base's writer wrote
                who = replace(base, via=op)
            names = set(step.output_names) | set(_mutated_args(step))
        else:
            continue
        for name in names:
            writer[name] = who
            buf = lowered.buffers.get(name)
            if buf is not None and buf.storage:
                writer[buf.storage] = who  # a write into a graph input's memory
    input_names = {gi.name: gi.position for gi in lowered.inputs if gi.name}
    outputs = []
    for out in lowered.outputs:
        if out.name is None:
            value = out.expr if out.expr is not None else out.constant
            outputs.append(Producer("value", repr(value)))
            continue
        buf = lowered.buffers.get(out.name)
        storage = buf.storage if buf is not None and buf.storage else out.name
        who = writer.get(out.name) or writer.get(storage)
        if who is None:
            kind = "input" if storage in input_names else "constant"
            who = Producer(kind, storage)
        outputs.append(who)
    inputs = {pos: writer[name] for name, pos in input_names.items() if name in writer}
    return GraphProducers(outputs, inputs)


# ----------------------------------------------------------------------------- graph facts


def _seeded(node: torch.fx.Node) -> bool:
    tags = getattr(node.target, "tags", ()) if node.op == "call_function" else ()
    return torch.Tag.nondeterministic_seeded in tags


def _argument(node: torch.fx.Node, name: str) -> Any:
    """The value of ``node``'s argument ``name`` (its default when not given), or None."""
    schema = node.target._schema
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            if i < len(node.args) and not arg.kwarg_only:
                return node.args[i]
            return node.kwargs.get(name, arg.default_value if arg.has_default_value() else None)
    return None


def random_ops(gm: torch.fx.GraphModule) -> list[str]:
    """The ops of ``gm`` that draw random numbers (eager would draw others). Ops tagged
    ``nondeterministic_seeded`` whose dropout probability is 0 (attention, dropout with p=0 or
    not training) draw nothing that reaches their results."""
    found: list[str] = []
    for node in gm.graph.nodes:
        if not _seeded(node):
            continue
        names = {a.name for a in node.target._schema.arguments}
        p = _argument(node, "dropout_p") if "dropout_p" in names else _argument(node, "p")
        inert = (("dropout_p" in names or "p" in names) and p == 0) or _argument(node, "train") is False
        if not inert and str(node.target) not in found:
            found.append(str(node.target))
    return found


#: Results of ops that hold random-generator state or nothing defined (with dropout off): not
#: compared.
_STATE_RESULT = re.compile(r"seed|offset|rng|unused|debug")
_UNINITIALIZED = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}


def unchecked_outputs(gm: torch.fx.GraphModule) -> dict[int, str]:
    """Graph outputs whose values mean nothing (uninitialized memory, an attention kernel's
    generator state): position -> why."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    reasons = {i: _meaningless(node) for i, node in enumerate(_flat(output.args[0]))}
    return {i: why for i, why in reasons.items() if why}


def _meaningless(node: Any) -> str | None:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    name = getattr(getattr(node.target, "_schema", None), "name", "").split("::")[-1]
    if name in _UNINITIALIZED:
        return f"uninitialized memory from {node.target}"
    source, index = (node.args + (None, None))[:2]
    if node.target is not operator.getitem or not isinstance(source, torch.fx.Node) or not _seeded(source):
        return None
    returns = source.target._schema.returns
    if isinstance(index, int) and index < len(returns) and _STATE_RESULT.search(returns[index].name or ""):
        return f"{returns[index].name} of {source.target}"
    return None


def seeded_ops(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` calls an op that may consume random numbers (even if its result does not
    depend on them): the eager side then runs with the generators' state saved and restored."""
    return any(_seeded(node) for node in gm.graph.nodes)


def mutated_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the placeholders ``gm`` writes in place (``copy_`` epilogues and the like)."""
    positions = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    out: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            out.update(positions[v] for v in _written(node.target, node.args, node.kwargs) if v in positions)
    return sorted(out)


def reference_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` as it reached Coil, before plugin graph passes rewrite it in place:
    the eager side of the check, and what a repro script holds."""
    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name="CoilReference")


# ----------------------------------------------------------------------------- comparison


@dataclass
class Mismatch:
    """One output (or input after the call) that differs from eager."""

    index: int
    what: str
    max_abs: float
    max_rel: float
    detail: str
    producer: Producer


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype.is_complex:
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


def compare(actual: Any, expected: Any) -> tuple[float, float, str] | None:
    """``(max abs diff, max rel diff, detail)`` when ``actual`` differs from ``expected``
    beyond tolerance, else None."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return _compare_plain(actual, expected)
    if actual.shape != expected.shape:
        return float("inf"), float("inf"), f"shape {tuple(actual.shape)}, eager's {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return float("inf"), float("inf"), f"dtype {actual.dtype}, eager's {expected.dtype}"
    a, e = actual.detach(), expected.detach()
    if a.layout != torch.strided:
        a, e = a.to_dense(), e.to_dense()
    if a.device != e.device:
        a = a.to(e.device)
    if a.is_complex():
        a, e = torch.view_as_real(a), torch.view_as_real(e)
    if not a.is_floating_point() and not a.is_complex():
        bad = a != e
        diff = (a.to(torch.float64) - e.to(torch.float64)).abs()
        return _summary(bad, diff, e.to(torch.float64))
    a64, e64 = a.to(torch.float64), e.to(torch.float64)
    rtol, atol = tolerance(expected.dtype)
    finite = e64[torch.isfinite(e64)]
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    diff = (a64 - e64).abs()
    close = torch.isfinite(a64) & torch.isfinite(e64) & (diff <= atol * scale + rtol * e64.abs())
    ok = (a64 == e64) | (a64.isnan() & e64.isnan()) | close
    diff = torch.where(a64 == e64, torch.zeros_like(diff), diff).nan_to_num(nan=float("inf"))
    return _summary(~ok, diff, e64)


def _compare_plain(actual: Any, expected: Any) -> tuple[float, float, str] | None:
    """Outputs that are not both tensors: Python numbers (SymInt results), None."""
    inf = float("inf")
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        return inf, inf, f"got {type(actual).__name__}, eager gave {type(expected).__name__}"
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        as_tensor = lambda v: torch.tensor(float(v), dtype=torch.float64)  # noqa: E731
        return compare(as_tensor(actual), as_tensor(expected))
    return None if actual == expected else (inf, inf, f"{actual!r} != {expected!r}")


def _summary(bad: torch.Tensor, diff: torch.Tensor, e: torch.Tensor) -> tuple[float, float, str] | None:
    count = int(bad.sum().item())
    if count == 0:
        return None
    diff = torch.where(bad, diff, torch.zeros_like(diff))
    rel = diff / e.abs()
    rel = torch.where(bad, rel.nan_to_num(nan=float("inf"), posinf=float("inf")), torch.zeros_like(rel))
    return diff.max().item(), rel.max().item(), f"{count} of {bad.numel()} elements"


def _flat(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _copy(value: Any) -> Any:
    """A copy of a tensor with the same sizes, strides and storage offset (in fresh storage)."""
    if not isinstance(value, torch.Tensor):
        return value
    with torch.no_grad():
        if value.layout != torch.strided or type(value) not in (torch.Tensor, torch.nn.Parameter):
            return value.detach().clone()
        out = torch.empty(0, dtype=value.dtype, device=value.device)
        return out.set_(value.untyped_storage().clone(), value.storage_offset(), value.size(), value.stride())


# ----------------------------------------------------------------------------- the checked callable


@dataclass
class CheckedGraph:
    """What the check needs to know about one compiled graph."""

    name: str
    kind: str
    reference: torch.fx.GraphModule
    producers: GraphProducers
    mutated: list[int]
    #: Symbolic sizes/strides of each input at compile time (None for a static input), for
    #: the repro script.
    symbolic: list[Any]
    debug_dir: str
    #: Outputs not compared (position -> why), see :func:`unchecked_outputs`.
    unchecked: dict[int, str] = field(default_factory=dict)
    #: Whether the eager run must leave the random generators as it found them.
    seeded: bool = False
    #: Inputs whose memory the compiled graph may reuse (:mod:`coil.donation`): not compared
    #: after the call.
    donated: tuple[int, ...] = ()

    @classmethod
    def of(cls, name: str, kind: str, reference: torch.fx.GraphModule, lowered: LoweredGraph,
           steps: Sequence[object], example_inputs: Sequence[Any], debug_dir: str,
           donated: tuple[int, ...] = ()) -> "CheckedGraph":
        return cls(name, kind, reference, producers(lowered, steps), mutated_inputs(reference),
                   [_symbolic_spec(v) for v in example_inputs], debug_dir,
                   unchecked_outputs(reference), seeded_ops(reference), donated)


def _symbolic_spec(value: Any) -> Any:
    """An input's symbolic sizes and strides as strings (``("s0", "8")``), or its SymInt's
    expression; None when nothing about it is symbolic."""
    if isinstance(value, torch.SymInt):
        return str(value.node.expr)
    if not isinstance(value, torch.Tensor):
        return None
    dims = [*value.size(), *value.stride(), value.storage_offset()]
    if not any(isinstance(d, torch.SymInt) for d in dims):
        return None
    text = [str(d.node.expr) if isinstance(d, torch.SymInt) else str(d) for d in dims]
    n = value.dim()
    return {"size": tuple(text[:n]), "stride": tuple(text[n:2 * n]), "offset": text[-1]}


def checked(fn: Callable[[list[Any]], Any], graph: CheckedGraph) -> Callable[[list[Any]], Any]:
    """``fn`` (boxed: takes the argument list and clears it) checked against eager on every call;
    ``fn`` itself for graphs that draw random numbers."""
    randoms = random_ops(graph.reference)
    if randoms:
        log.info("coil self-check: %s (%s) is not checked: it draws random numbers (%s), so eager "
                 "would compute with other values", graph.name, graph.kind, ", ".join(randoms))
        return fn

    def call(args: list[Any]) -> Any:
        values = list(args)
        args.clear()
        eager_inputs = [_copy(v) for v in values]
        before = {i: _copy(values[i]) for i in graph.mutated}  # eager_inputs[i] gets mutated
        result = fn(list(values))
        with torch.no_grad(), torch._C._DisableAutocast(), _generators_kept(values, graph.seeded):
            expected = graph.reference(*eager_inputs)
        mismatches = _mismatches(graph, _flat(result), _flat(expected), values, eager_inputs)
        if mismatches:
            inputs = [before.get(i, v) for i, v in enumerate(eager_inputs)]
            _raise(graph, mismatches, inputs)
        log.debug("coil self-check: %s (%s) matches eager", graph.name, graph.kind)
        return result

    return call


@contextlib.contextmanager
def _generators_kept(values: list[Any], enabled: bool) -> Iterator[None]:
    """The random generators of every device the inputs live on, restored afterwards (the
    eager side must not move the user's random stream)."""
    with contextlib.ExitStack() as stack:
        if enabled:
            stack.enter_context(torch.random.fork_rng(devices=[]))
            devices: dict[str, set[int]] = {}
            for v in values:
                if isinstance(v, torch.Tensor) and v.device.type not in ("cpu", "meta"):
                    devices.setdefault(v.device.type, set()).add(v.device.index or 0)
            for device_type, indices in sorted(devices.items()):
                stack.enter_context(torch.random.fork_rng(devices=sorted(indices), device_type=device_type))
        yield


def _mismatches(graph: CheckedGraph, actual: list[Any], expected: list[Any], inputs: list[Any],
                eager_inputs: list[Any]) -> list[Mismatch]:
    out = []
    if len(actual) != len(expected):
        who = Producer("value", "output list")
        return [Mismatch(0, "output list", float("inf"), float("inf"),
                         f"{len(actual)} outputs, eager gave {len(expected)}", who)]
    for i, (a, e) in enumerate(zip(actual, expected)):
        if i in graph.unchecked:
            continue
        diff = compare(a, e)
        if diff is not None:
            who = graph.producers.outputs[i] if i < len(graph.producers.outputs) else Producer("value", "?")
            out.append(Mismatch(i, f"output {i}", *diff, who))
    for i, (a, e) in enumerate(zip(inputs, eager_inputs)):
        if not isinstance(a, torch.Tensor) or i in graph.donated:
            continue
        diff = compare(a, e)
        if diff is not None:
            who = graph.producers.inputs.get(i, Producer("input", f"arg{i}"))
            verb = "mutated in place" if i in graph.mutated else "which the graph does not mutate"
            out.append(Mismatch(i, f"input {i} after the call ({verb})", *diff, who))
    return out


def _raise(graph: CheckedGraph, mismatches: list[Mismatch], inputs: list[Any]) -> None:
    first = min(mismatches, key=lambda m: (m.producer.step if m.producer.step >= 0 else 1 << 30))
    detail = first.detail
    if len(mismatches) > 1:
        detail += f"; {len(mismatches) - 1} more output(s) differ, this one was produced first"
    path = repro_writer.replaying()
    if path is None:
        try:
            path = str(repro_writer.write(graph, inputs, f"{first.what}: {detail}; produced by {first.producer}"))
        except Exception as exc:  # the error must still reach the user without a repro
            log.warning("coil self-check: could not write a repro script: %s", exc)
    raise CheckError(graph.name, first.index, first.max_abs, first.max_rel, str(first.producer),
                     path, what=first.what, detail=detail)


__all__ = ["CheckedGraph", "GraphProducers", "Mismatch", "Producer", "TOLERANCES", "checked",
           "compare", "mutated_inputs", "producers", "random_ops", "reference_graph", "seeded_ops",
           "unchecked_outputs"]
