"""Freezing (the ``freezing`` knob): an inference graph compiled while grad mode is off treats
the model's parameters and buffers as constants, as Inductor's ``freezing`` does.

:func:`compile_fx <coil.backend.compile_fx>` notes which of the Dynamo graph's inputs are
parameters or module buffers (:func:`candidates`), with their real tensors: the graphs Coil
compiles see fake ones. For the inference graph AOTAutograd then traces,
:func:`frozen_values` maps them to that graph's inputs, and :func:`freeze` (after the layout
pass) turns those placeholders into constants and runs the passes that use them: constant
folding (:mod:`coil.constant_fold`), batch norms folded into convolutions
(:mod:`coil.conv_fold`), and convolutions and linear layers handed to the device backend with
their weights (:mod:`coil.prepack`). Parameters that no
pass consumed go back to being inputs, read at their own address on every call.

What a pass consumed was baked into the compiled graph, so :func:`guarded` checks on every
call that each such parameter is the same tensor object, at the same address, with the same
version counter (any in-place write through the tensor bumps it: ``load_state_dict``, an
optimizer step); where one is not, it warns and compiles the graph again with the current
values. A write that bypasses the counter (``param.data.copy_(...)``) is not seen; that is the
promise the knob asks of its user. Frozen graphs skip the graph cache and the layers before
AOTAutograd (their constants are this process's tensors)."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx

from .constant_fold import ORIGIN, fold_constants
from .conv_fold import fold_batch_norms
from .prepack import FrozenCall, Packers, prepack_convolutions, prepack_linears

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Sources:
    """The real tensors of a Dynamo graph's inputs, and the positions of those that are
    parameters or module buffers."""

    inputs: tuple[Any, ...]
    frozen: frozenset[int]


_sources: contextvars.ContextVar[Sources | None] = contextvars.ContextVar("coil_freezing_sources", default=None)


def candidates(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Sources:
    """Which inputs of the Dynamo graph ``gm`` are parameters (``nn.Parameter``) or module
    buffers (by Dynamo's source of the input), as real tensors. Inputs marked static by the
    user (``mark_static_address``: a KV cache) are neither, and stay inputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    frozen = set()
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor) or isinstance(value, torch._subclasses.FakeTensor):
            continue
        grapharg = node.meta.get("grapharg")
        source = getattr(getattr(grapharg, "source", None), "name", "")
        source = source() if callable(source) else source
        if isinstance(value, torch.nn.Parameter) or "._buffers[" in str(source):
            frozen.add(i)
    return Sources(tuple(example_inputs), frozenset(frozen))


@contextlib.contextmanager
def sources(value: Sources | None) -> Iterator[None]:
    """Make ``value`` the sources the inference graph traced inside this block is frozen from."""
    token = _sources.set(value)
    try:
        yield
    finally:
        _sources.reset(token)


def frozen_values(example_inputs: Sequence[Any]) -> dict[int, torch.Tensor]:
    """The real tensors to freeze at the positions of the graph being compiled, whose inputs
    are ``example_inputs`` (fake): empty outside a freezing compile, or where the graph's
    inputs do not line up with Dynamo's (the log says why)."""
    found = _sources.get()
    if found is None:
        return {}
    context = torch._guards.TracingContext.try_get()
    lifted = list(getattr(context, "params_flat", None) or ()) if context is not None else []
    real = lifted + list(found.inputs)  # AOTAutograd lifts a module's own parameters first
    positions = set(range(len(lifted))) | {len(lifted) + i for i in found.frozen}
    if len(real) != len(example_inputs):
        log.info("coil: freezing skipped: the graph has %d inputs where Dynamo passed %d",
                 len(example_inputs), len(real))
        return {}
    values = {}
    for i in sorted(positions):
        r, f = real[i], example_inputs[i]
        if (not isinstance(r, torch.Tensor) or not isinstance(f, torch.Tensor) or r.shape != f.shape
                or r.stride() != f.stride() or r.dtype != f.dtype or r.device != f.device):
            log.info("coil: freezing skipped: input %d is not the parameter Dynamo passed", i)
            return {}
        values[i] = r
    return values


@dataclasses.dataclass(frozen=True)
class Baked:
    """A parameter whose value the compiled graph holds: which object, where, at which version."""

    position: int
    tensor: torch.Tensor
    address: int
    version: int

    def holds(self, value: Any) -> bool:
        return value is self.tensor and value._version == self.version and value.data_ptr() == self.address


@dataclasses.dataclass(frozen=True)
class Frozen:
    """What :func:`freeze` did: the parameters the graph now holds, and a line for the report."""

    baked: list[Baked]
    note: str


def freeze(gm: torch.fx.GraphModule, values: dict[int, torch.Tensor],
           packers: Packers) -> Frozen:
    """Make the placeholders at ``values``' positions constants, run the passes over them and
    say which parameters the graph now holds."""
    # AOTAutograd compiles its graphs inside its fake mode: constants are computed outside it
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        return _freeze(gm, values, packers)


def _freeze(gm: torch.fx.GraphModule, values: dict[int, torch.Tensor],
            packers: Packers) -> Frozen:
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    attrs: dict[torch.fx.Node, torch.fx.Node] = {}
    for position, tensor in values.items():
        placeholder = placeholders[position]
        if not placeholder.users:
            continue
        name = f"_coil_parameter{position}"
        gm.register_buffer(name, tensor.detach(), persistent=False)  # the same storage and version counter
        with graph.inserting_before(first):
            attr = graph.get_attr(name)
        attr.meta.update(placeholder.meta)
        attr.meta[ORIGIN] = frozenset({position})
        placeholder.replace_all_uses_with(attr)
        attrs[attr] = placeholder
    if not attrs:
        return Frozen([], f"freezing: none of the {len(values)} parameters is read")
    folded = fold_constants(gm)
    batch_norms = fold_batch_norms(gm)
    packed, pointwise = prepack_convolutions(gm, packers)
    linears = prepack_linears(gm, packers)
    baked: set[int] = set()
    for node in list(graph.nodes):
        if node in attrs:  # a parameter read as it is: an input again
            node.replace_all_uses_with(attrs[node])
            graph.erase_node(node)
        elif ORIGIN not in node.meta:
            continue
        elif node.op == "get_attr" or isinstance(node.target, FrozenCall):
            baked |= node.meta[ORIGIN]  # a value computed from parameters, held by the graph
        else:  # a view of parameters, taken on each call from the inputs it reads
            del node.meta[ORIGIN]
    held = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_buffers()):  # constants the passes consumed
        if name.startswith("_coil_") and name not in held:
            delattr(gm, name)
    graph.lint()
    gm.recompile()
    note = (f"freezing: {len(baked)} of {len(values)} parameters held as constants (checked on each "
            f"call), {folded} op(s) on them run once, {batch_norms} convolution(s) with the "
            f"batch norm or bias after them folded in, {packed} convolution(s) "
            f"{f'({pointwise} of them 1x1, as linear layers) ' if pointwise else ''}and {linears} "
            f"linear layer(s) to the backend's packed calls")
    log.debug("%s", note)
    return Frozen([Baked(p, values[p], values[p].data_ptr(), values[p]._version) for p in sorted(baked)], note)


Recompile = Callable[[list[Any], bool], "tuple[Callable[[list[Any]], Any], list[Baked]]"]


#: Frozen copies of one graph kept for different parameter objects (instances of one model
#: class share Dynamo's compiled frame, so each instance's parameters reach the same graph);
#: instances beyond these run the graph unfrozen.
FROZEN_COPIES = 4


def guarded(fn: Callable[[list[Any]], Any], baked: list[Baked], recompile: Recompile) -> Callable[[list[Any]], Any]:
    """``fn``, checking before each call that every baked parameter is unchanged.

    Parameters that are other objects (another instance of the model) get a frozen copy of
    their own (``recompile(args, True)``: the new callable and its baked parameters), up to
    :data:`FROZEN_COPIES`; further instances share one unfrozen compile. A parameter changed in
    place (an optimizer step, ``load_state_dict``) is frozen again the first time and, the
    second time, the graph runs unfrozen from then on (parameters that keep changing are
    inputs). Both say so in a warning."""
    if not baked:
        return fn
    copies: list[tuple[Callable[[list[Any]], Any], list[Baked]]] = [(fn, baked)]  # last used first
    state: dict[str, Any] = {"unfrozen": None, "changes": 0}

    def holds(held: list[Baked], args: list[Any]) -> bool:
        for b in held:
            if not b.holds(args[b.position]):
                return False
        return True

    def call(args: list[Any]) -> Any:
        if holds(copies[0][1], args):
            return copies[0][0](args)
        for i in range(1, len(copies)):
            if holds(copies[i][1], args):
                copies.insert(0, copies.pop(i))
                return copies[0][0](args)
        if state["unfrozen"] is None:
            _compile_for(list(args))
        return (state["unfrozen"] or copies[0][0])(args)

    def _compile_for(args: list[Any]) -> None:
        changed = next((i for i, (_, held) in enumerate(copies)
                        if all(args[b.position] is b.tensor for b in held)), None)
        if changed is not None:  # the same parameters, changed in place
            state["changes"] += 1
            again = state["changes"] == 1
            log.warning("coil: a parameter frozen into a compiled graph changed after the graph "
                        "compiled (the freezing knob assumes parameters do not change); compiling "
                        "the graph again%s", "" if again else ", without freezing, since they changed again")
            if again:
                copies.pop(changed)
                copies.insert(0, recompile(args, True))
            else:
                copies.clear()
                copies.append((recompile(args, False)[0], []))
                state["unfrozen"] = copies[0][0]
        elif len(copies) < FROZEN_COPIES:
            log.info("coil: another set of parameters reached a frozen graph (another instance of "
                     "the model): compiling a frozen copy for it")
            copies.insert(0, recompile(args, True))
        else:
            log.warning("coil: more than %d sets of parameters reached one frozen graph (instances "
                        "of the model): compiling it without freezing for the others", FROZEN_COPIES)
            state["unfrozen"] = recompile(args, False)[0]

    return call
