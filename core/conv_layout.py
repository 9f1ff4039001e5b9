"""Channels-last convolutions for devices whose convolution library prefers them.

cuDNN runs 2-D convolutions on tensor cores in NHWC; given NCHW tensors it transposes around
each one or, for depthwise convolutions, falls back to a slow direct kernel (on the H200,
EfficientNet-B0's depthwise convolutions took 1.9 ms per call in NCHW against 0.5 ms in
NHWC; ResNet-18's training step spent 2.0 ms in those transposes). This pass gives every 2-D
convolution of an inference or training forward graph channels-last input and weight (a
``clone`` in that memory format, which fuses into the kernel that produces or casts the
operand), then propagates the new layouts through the graph with fake tensors, so the
pointwise kernels between convolutions read and write channels-last too. Clones that the
propagated layouts make redundant are dropped.

Graph outputs keep eager's strides, except a training forward graph's saved activations
(:func:`saved_output_positions`, from AOTAutograd's metadata), which only the backward graph
reads: the core reports their strides to AOTAutograd (``TracingContext.output_strides``),
which traces the backward graph's inputs with them, and :func:`adopt_input_layouts` then
propagates those layouts through the backward graph before it is lowered. A backward graph
that cannot be propagated is not lowered (it runs as traced, in eager), since its kernels
would read the saved activations with the wrong strides.

The choice is the backend's, per graph (:func:`describe` tells it the graph's convolutions;
``DeviceBackend.prefers_channels_last``, whose default answers
``Capabilities.conv_channels_last``): not per convolution, since ATen's convolution returns
channels-last when either operand is, so an NCHW convolution after a channels-last one would
need a transpose back. Static shapes only."""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import torch
import torch.fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from .sdk.backend import ConvolutionInfo

log = logging.getLogger(__name__)
aten = torch.ops.aten
CL = torch.channels_last


#: Asked once per device with the graph's 2-D convolutions on it: lay them out channels-last?
Chooser = Callable[[torch.device, Sequence[ConvolutionInfo]], bool]


def to_channels_last(gm: torch.fx.GraphModule, prefers: Chooser,
                     free_outputs: frozenset[int] = frozenset(),
                     frozen: frozenset[torch.fx.Node] = frozenset()) -> int:
    """Rewrite ``gm``'s 2-D convolutions to channels-last on the devices for which
    ``prefers`` says yes; returns how many. Outputs at the positions ``free_outputs`` keep the
    layout the propagation gives them; the others are copied back into eager's. ``frozen``:
    the placeholders that :mod:`coil.freezing` will make constants (the backend is told which
    convolutions' weights are among them)."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not all(_static(n.meta.get("val")) for n in placeholders):
        return 0
    by_device: dict[torch.device, list[torch.fx.Node]] = {}
    for n in graph.nodes:
        if (n.op == "call_function" and n.target is aten.convolution.default
                and _is_4d(n.args[0]) and _is_4d(n.args[1]) and _static(n.meta.get("val"))):
            by_device.setdefault(n.meta["val"].device, []).append(n)
    convs = [n for device, nodes in by_device.items()
             if prefers(device, [describe(n, frozen=_weight_frozen(n, frozen)) for n in nodes]) for n in nodes]
    if not convs:
        return 0
    output = _output(graph)
    eager_outputs = {id(a): a.meta.get("val") for a in _flat(output.args[0]) if isinstance(a, torch.fx.Node)}
    clones = []
    for conv in convs:
        for i in (0, 1):
            with graph.inserting_before(conv):
                clone = graph.call_function(aten.clone.default, (conv.args[i],), {"memory_format": CL})
            conv.update_arg(i, clone)
            clones.append(clone)
    fake = torch._guards.detect_fake_mode([n.meta["val"] for n in placeholders if "val" in n.meta])
    if fake is None:
        _undo(graph, clones)
        return 0
    before = {n: n.meta["val"] for n in graph.nodes if "val" in n.meta}
    try:
        _Propagation(gm, fake, set(clones)).propagate_dont_convert_inputs(*[n.meta["val"] for n in placeholders])
    except Exception as exc:  # noqa: BLE001 - an op the fake mode cannot run: keep eager's layouts
        log.debug("channels-last propagation failed (%s); convolutions left as they were", exc)
        _undo(graph, clones)
        for n, val in before.items():
            n.meta["val"] = val
        return 0
    kept = []
    for clone in clones:  # already channels-last: the clone would only copy
        src = clone.args[0]
        if isinstance(src, torch.fx.Node) and _is_channels_last(src.meta.get("val")):
            clone.replace_all_uses_with(src)
            graph.erase_node(clone)
        else:
            kept.append(clone)
    _save_channels_last(graph, output, kept, free_outputs)
    _keep_output_strides(graph, output, eager_outputs, free_outputs)
    graph.lint()
    gm.recompile()
    log.debug("%d convolutions in channels-last", len(convs))
    return len(convs)


def _weight_frozen(conv: torch.fx.Node, frozen: frozenset[torch.fx.Node]) -> bool:
    """Whether a convolution's weight and bias (if any) are placeholders in ``frozen``."""
    def source(a: object) -> object:  # through casts and copies of one value
        while (isinstance(a, torch.fx.Node) and a.op == "call_function" and len(a.all_input_nodes) == 1
               and isinstance(a.target, torch._ops.OpOverload) and not a.target._schema.is_mutable):
            a = a.all_input_nodes[0]
        return a

    bias = conv.args[2]
    return bool(frozen) and source(conv.args[1]) in frozen and (bias is None or source(bias) in frozen)


def describe(conv: torch.fx.Node, *, frozen: bool = False) -> ConvolutionInfo:
    """What a backend is told about one ``aten.convolution`` node with 4-D operands;
    ``frozen``: its weight and bias are frozen parameters."""
    x, w, out = (a.meta["val"] for a in (conv.args[0], conv.args[1], conv))
    stride, padding, dilation, transposed, _, groups = conv.args[3:9]

    def four(t: torch.Tensor) -> tuple[int, int, int, int]:
        n, c, h, wd = (int(s) for s in t.shape)
        return n, c, h, wd

    def pair(v: Sequence[int]) -> tuple[int, int]:
        return (int(v[0]), int(v[-1]))

    return ConvolutionInfo(input=four(x), weight=four(w), output=four(out), stride=pair(stride),
                           padding=pair(padding), dilation=pair(dilation), groups=int(groups),
                           transposed=bool(transposed), dtype=x.dtype, frozen=frozen)


def saved_output_positions(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Positions among a training forward graph's outputs of the activations it saves for
    the backward graph (AOTAutograd's ``fw_metadata``); empty when that cannot be told."""
    context = torch._guards.TracingContext.try_get()
    try:
        where = context.fw_metadata.tensors_saved_for_backwards_slice  # type: ignore[union-attr]
        output = _output(gm.graph)
        outs = output.args[0]
        if not isinstance(outs, (list, tuple)):
            return frozenset()
        return frozenset(range(len(outs))[where])
    except Exception:  # noqa: BLE001 - another torch's metadata: no output may change layout
        return frozenset()


def static_output_strides(gm: torch.fx.GraphModule) -> list[tuple[int, ...] | None] | None:
    """:func:`output_strides`, or None where any output's strides are symbolic (reading one
    as an int would add a guard)."""
    output = _output(gm.graph)
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in _flat(output.args[0])]
    if any(isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.stride()) for v in vals):
        return None
    return output_strides(gm)


def traced_outputs(gm: torch.fx.GraphModule) -> list[object]:
    """Each output's value as the graph's metadata holds it (None: not a node)."""
    return [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in _flat(_output(gm.graph).args[0])]


def output_strides(gm: torch.fx.GraphModule) -> list[tuple[int, ...] | None]:
    """Each output's strides as the graph's metadata holds them (None: not a tensor)."""
    output = _output(gm.graph)
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in _flat(output.args[0])]
    return [tuple(int(s) for s in v.stride()) if isinstance(v, torch.Tensor) else None for v in vals]


def adopt_input_layouts(gm: torch.fx.GraphModule, example_inputs: list[object]) -> bool:
    """Give a backward graph's placeholders the strides of ``example_inputs`` where they
    differ (saved activations a forward graph laid out channels-last) and propagate them
    through the graph; its outputs keep the strides they were traced with. Returns whether
    anything changed; raises when the propagation fails."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not any(isinstance(traced, torch.Tensor) and isinstance(example, torch.Tensor)
               and traced.stride() != example.stride()
               for traced, example in ((n.meta.get("val"), e) for n, e in zip(placeholders, example_inputs))):
        return False
    fake = torch._guards.detect_fake_mode([e for e in example_inputs if isinstance(e, torch.Tensor)])
    if fake is None:
        raise RuntimeError("the backward graph's inputs are not fake tensors")
    output = _output(gm.graph)
    traced_outputs = {id(a): a.meta.get("val") for a in _flat(output.args[0]) if isinstance(a, torch.fx.Node)}
    # every node again: the example inputs are other tensors than the traced ones (their
    # storages too), so no node's traced value can stand
    FakeTensorProp(gm, fake).propagate_dont_convert_inputs(*example_inputs)
    _keep_output_strides(gm.graph, output, traced_outputs, frozenset())
    gm.graph.lint()
    gm.recompile()
    return True


class _Propagation(FakeTensorProp):
    """Fake propagation of the nodes that ``changed`` reach, in graph order: every other
    ``call_function`` node keeps the value it has, which the same op on the same values
    would give again (the placeholders keep theirs: the graph's inputs are the same).
    Most nodes of a conv net do not depend on a convolution (parameter casts, batch norm's
    per-channel factors: 495 of MobileNetV3's 877); skipping them took this pass from
    1.4-1.6 s to 0.85 s on MobileNetV3 here."""

    def __init__(self, gm: torch.fx.GraphModule, mode: object, changed: set[torch.fx.Node]) -> None:
        super().__init__(gm, mode)
        self.changed = set(changed)

    def run_node(self, n: torch.fx.Node) -> object:
        if (n.op == "call_function" and "val" in n.meta and n not in self.changed
                and not any(a in self.changed for a in n.all_input_nodes)):
            return n.meta["val"]
        if n.op == "call_function":
            self.changed.add(n)
        return super().run_node(n)


def _save_channels_last(graph: torch.fx.Graph, output: torch.fx.Node, clones: list[torch.fx.Node],
                        free: frozenset[int]) -> None:
    """A convolution operand that the forward graph also saves for the backward graph (a
    graph input cast to bf16, a weight cast) is saved as its channels-last copy: saved as it
    was, the backward's ``convolution_backward`` got it in eager's layout beside a
    channels-last gradient, and cuDNN converted the gradient back (ResNet-18's first
    convolution: 0.34 ms per step on the H200 for a 64x64x112x112 bf16 transpose). The copy
    holds the same values; the backward graph adopts the saved layouts it is given."""
    copy_of = {c.args[0]: c for c in clones if isinstance(c.args[0], torch.fx.Node)}
    outs = output.args[0]
    if not free or not copy_of or not isinstance(outs, (list, tuple)):
        return
    output.args = (type(outs)(copy_of.get(a, a) if i in free else a for i, a in enumerate(outs)),)


def _keep_output_strides(graph: torch.fx.Graph, output: torch.fx.Node, eager: dict[int, object],
                         free: frozenset[int]) -> None:
    """Outputs whose layout the propagation changed are copied back into eager's (contiguous),
    but for those at the positions ``free``."""
    def fix(position: int, a: object) -> object:
        if not isinstance(a, torch.fx.Node) or position in free:
            return a
        before, after = eager.get(id(a)), a.meta.get("val")
        if (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
                and before.stride() != after.stride() and before.is_contiguous()):
            with graph.inserting_before(output):
                copy = graph.call_function(aten.clone.default, (a,), {"memory_format": torch.contiguous_format})
            copy.meta["val"] = before
            return copy
        return a
    outs = output.args[0]
    if isinstance(outs, (list, tuple)):
        output.args = (type(outs)(fix(i, a) for i, a in enumerate(outs)),)
    else:
        output.args = (fix(0, outs),)


def _output(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in graph.nodes if n.op == "output")


def _undo(graph: torch.fx.Graph, clones: list[torch.fx.Node]) -> None:
    for clone in clones:
        clone.replace_all_uses_with(clone.args[0])
        graph.erase_node(clone)


def _is_4d(a: object) -> bool:
    return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dim() == 4


def _static(v: object) -> bool:
    if isinstance(v, torch.Tensor):
        return all(isinstance(s, int) for s in (*v.shape, *v.stride()))
    return not isinstance(v, torch.SymInt)


def _is_channels_last(v: object) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_contiguous(memory_format=CL)


def _flat(a: object) -> list[object]:
    return list(a) if isinstance(a, (list, tuple)) else [a]
