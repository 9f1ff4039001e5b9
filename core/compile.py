"""Compiles one functional ATen graph: lower -> schedule -> plan memory -> device codegen ->
wrapper. Records a ``GraphReport`` (kernels, fallbacks, peak, seconds per stage) and, with
``COIL_DEBUG_DIR`` set, writes the generated source and fusion decisions to disk."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import sympy
import torch

from . import (capture, collectives, donation, freezing, graph_cache, host_programs, plugins, progress, selfcheck,
               scalar_range, templates, zero_dim_operands)
from .sdk import versions
from .sdk.backend import ConvolutionInfo
from .config import Config
from .config import active as config_active
from .eager_only import eager_only
from .errors import LoweringError
from .graph import GraphLowering, LoweredGraph, generated_here
from .graph_key import GraphKey
from .graph_report import GraphReport, KernelReport, next_graph_name, notify
from .graph_report import add_observer, remove_observer  # noqa: F401 (coil.compile's API)
from .kernel import Kernel
from .lowering import GENERIC, LoweringRegistry
from .lowering.context import FallbackRecord, capability
from .inplace import InplacePolicy
from .memory import plan_memory, with_inplace
from .conv_bias import split_conv_bias
from .conv_layout import (Chooser, adopt_input_layouts, output_strides, saved_output_positions, static_output_strides,
                          to_channels_last, traced_outputs)
from .conv_matmul import matmul_convolutions
from .foreign_operands import bring_foreign_operands
from .matmul_bias import split_matmul_bias
from .pad_gemm import pad_gemms
from .report_text import format_graph
from .scheduler import schedule
from .wrapper import WrapperWriter

log = logging.getLogger(__name__)


def lowering_registry() -> LoweringRegistry:
    reg = GENERIC.copy()
    for op, fn, device_type in plugins.registry().lowerings:
        reg.register(op, fn, device_type)
    return reg


def _hint_fn(example_inputs: Sequence[Any]) -> Callable[[sympy.Expr], int]:
    shape_env = None
    from torch._guards import detect_fake_mode
    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is not None:
        shape_env = fake_mode.shape_env

    def hint(e: sympy.Expr) -> int:
        e = sympy.sympify(e)
        if e.is_number:
            return int(e)
        if shape_env is not None:
            try:
                return int(e.xreplace(getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val))
            except (TypeError, ValueError):
                pass
        return int(e.xreplace({s: 64 for s in e.free_symbols}))

    return hint


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config,
                  kind: str, on_key: Callable[[GraphKey], None] | None = None) -> Callable[[list[Any]], Any]:
    """Compile one ATen graph under ``config``, which is also the configuration plugins see
    (``DeviceBackend.options``) while it compiles; a long compile shows a progress line.
    ``on_key`` learns the graph's key in the graph cache (when it has one)."""
    with config_active(config), progress.shown(kind, config.progress) as line:
        return _compile_graph(gm, example_inputs, config, kind, line, on_key)


def pad_joint_gemms(joint: torch.fx.GraphModule) -> int:
    """Pad AOTAutograd's joint graph's matmuls (:mod:`coil.pad_gemm`) before it is partitioned:
    a padded matrix that the forward and the backward both read (a tied vocabulary
    projection's weight) is then one node, saved in place of the unpadded one, where padding
    each graph after partitioning would pad it again in the backward
    (:func:`coil.pad_gemm.shares_padding` says which matmuls)."""
    reg = plugins.registry()
    return pad_gemms(joint, lambda device: capability(device, "gemm_alignment_bytes", 0, reg), joint=True)


def _collective_impl(reg: Any, device: torch.device, op: Any) -> Any:
    """What a collective (or its wait) on ``device`` calls: its backend's own implementation
    (``DeviceBackend.collective``, SDK 0.11.0), else torch's op."""
    backend = reg.backends.get(device.type)
    supply = getattr(backend, "collective", None)
    return supply(op) if supply is not None else op


def _inplace_policy(reg: Any, config: Config) -> InplacePolicy | None:
    """Which kernels may store outputs over their dying inputs: none with the
    ``inplace_buffers`` knob off; else pointwise kernels of backends whose plugin declares SDK
    0.7.0 or later (an older plugin may assume its pointers never alias: ``__restrict__``),
    and kernels with reduced dims where the backend also declares
    ``Capabilities.inplace_reductions``."""
    if not config.inplace_buffers:
        return None

    def device(k: Kernel) -> torch.device:
        return k.first_node.device

    def knows_aliasing(k: Kernel) -> bool:
        api = reg.api_version(device(k).type)
        return api is not None and versions.parse(api or "0.0.0") >= INPLACE_API

    return InplacePolicy(
        lambda k: knows_aliasing(k) and capability(device(k), "inplace_reductions", False, reg),
        pointwise=knows_aliasing)


#: The SDK release that introduced ``Kernel.inplace`` (input and output may share memory).
INPLACE_API = (0, 7, 0)


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config,
                   kind: str, line: progress.QuietLine,
                   on_key: Callable[[GraphKey], None] | None = None) -> Callable[[list[Any]], Any]:
    frozen = freezing.frozen_values(example_inputs) if kind == "inference" else {}
    if frozen and capture.mutates_inputs(gm):
        log.info("coil: freezing skipped: the graph writes into one of its inputs")
        frozen = {}
    if not frozen:
        return _compile_body(gm, example_inputs, config, kind, line, on_key, {}, [])
    original = _copy_graph(gm)
    baked: list[freezing.Baked] = []
    try:
        fn = _compile_body(gm, example_inputs, config, kind, line, None, frozen, baked)
    except Exception as exc:  # noqa: BLE001 - freezing is an optimisation: without it, or a loud error
        log.warning("coil: compiling a graph with frozen parameters failed (%s: %s); compiling it "
                    "without freezing", type(exc).__name__, exc)
        return _compile_body(_copy_graph(original), example_inputs, config, kind, line, on_key, {}, [])

    def recompile(args: list[Any], freeze: bool) -> tuple[Callable[[list[Any]], Any], list[freezing.Baked]]:
        values = {p: args[p] for p in frozen} if freeze else {}
        again: list[freezing.Baked] = []
        with config_active(config), progress.shown(kind, config.progress) as again_line:
            return _compile_body(_copy_graph(original), example_inputs, config, kind, again_line, None,
                                 values, again), again

    return freezing.guarded(fn, baked, recompile)


def _copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` that passes may rewrite without touching ``gm`` (nodes and their meta
    dicts copied; the values in them shared)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    old_output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    graph.output(out).meta = dict(old_output.meta)
    return torch.fx.GraphModule(gm, graph)


#: The SDK release that introduced ``DeviceBackend.frozen_convolution`` and ``frozen_linear``.
FROZEN_CALLS_API = (1, 5, 0)


def _packer(reg: Any, method: str, device: torch.device,
            since: tuple[int, int, int] = FROZEN_CALLS_API) -> Any:
    """``device``'s backend's ``method`` (``frozen_convolution``, ``frozen_linear``: SDK
    1.5.0; ``convolution_as_matmul``: :data:`MATMUL_API`) where its plugin declares SDK
    ``since`` or later; None elsewhere."""
    backend = reg.backends.get(device.type)
    api = reg.api_version(device.type)
    if backend is None or api is None or versions.parse(api) < since:
        return None
    return getattr(backend, method, None)


#: The SDK release that introduced ``DeviceBackend.convolution_as_matmul``.
MATMUL_API = (1, 6, 0)
#: The release from which it is asked about backward graphs' ``convolution_backward`` too.
MATMUL_BACKWARD_API = (1, 7, 0)
#: The graphs whose 1x1 convolutions may become matrix products (:mod:`coil.conv_matmul`).
MATMUL_KINDS = ("inference", "forward", "backward")


def _compile_body(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config,
                  kind: str, line: progress.QuietLine, on_key: Callable[[GraphKey], None] | None,
                  frozen: dict[int, torch.Tensor], baked: list[Any]) -> Callable[[list[Any]], Any]:
    """Compile ``gm``; with ``frozen`` (position -> parameter), freeze those inputs
    (:mod:`coil.freezing`) and append the parameters baked into the graph to ``baked``."""
    reg = plugins.registry()
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    donated = donation.donated_positions(kind, example_inputs, config)
    # before passes rewrite gm; a frozen graph's constants are this process's: no cache entry
    key = graph_cache.key_for(gm, example_inputs, config, kind, reg, donated) if not frozen else None
    hit = graph_cache.load(key, reg, kind, next_graph_name) if key else None
    if key is not None and on_key is not None:
        on_key(key.key)
    mutates = capture.mutates_inputs(gm)  # before passes rewrite gm
    traced_strides = static_output_strides(gm) if kind == "forward" else None  # as AOTAutograd traced them
    static = capture.static_input_indices()
    if collectives.in_graph(gm):  # recording runs a graph more than once: its collectives too
        config = collectives.without_capture(config)
    if hit is not None and hit[1].output_strides is not None and not report_strides_possible(gm):
        hit = None  # its saved activations' layouts could not be reported: compile afresh
    if hit is not None:
        report_output_strides(hit[1].output_strides)
        return _loaded(hit, config, kind, mutates, example_inputs, static, reg)
    left = eager_only(gm)
    if left is not None:
        return _eager_graph(gm, kind, LoweringError(*left))
    eager_outputs = traced_outputs(gm)  # the outputs as traced (before passes): returned in these strides
    # self-check mode (coil.selfcheck) runs the graph as it arrived, before passes rewrite it
    reference = selfcheck.reference_graph(gm) if config.check else None
    scalar_range.check_scalar_ranges(gm)  # eager's overflow checks of scalars written into integer tensors
    zero_dim_operands.cast_zero_dim_operands(gm, lambda dev: capability(dev, "zero_dim_operands_cast", False, reg))
    for graph_pass in reg.graph_passes:
        graph_pass(gm)
    bring_foreign_operands(gm, lambda node, device: generated_here(node, device, lowering_registry()))
    split_conv_bias(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    strides = _lay_out_convolutions(gm, example_inputs, kind, reg, config.training_channels_last,
                                    frozenset(placeholders[p] for p in frozen))
    if isinstance(strides, Exception):
        return _eager_graph(gm, kind, strides)
    frozen_note = ""
    if frozen:
        done = freezing.freeze(gm, frozen, functools.partial(_packer, reg))
        baked += done.baked
        frozen_note = done.note
        split_conv_bias(gm)  # the biases batch norms folded into, of convolutions left to the core
    if kind in MATMUL_KINDS:
        matmul_convolutions(gm, lambda device: _packer(reg, "convolution_as_matmul", device, MATMUL_API),
                            backward=(lambda device: _packer(reg, "convolution_as_matmul", device,
                                                             MATMUL_BACKWARD_API)) if kind == "backward" else None)
    split_matmul_bias(gm, lambda device: capability(device, "gemm_bias_epilogue", True, reg))
    pad_gemms(gm, lambda device: capability(device, "gemm_alignment_bytes", 0, reg))
    try:
        lowered = GraphLowering(gm, example_inputs, lowering_registry(), config,
                                templates.offers(reg, config.templates),
                                eager_outputs=eager_outputs,
                                free_outputs=saved_output_positions(gm) if kind == "forward" else frozenset()).run()
    except LoweringError as exc:
        report_output_strides(strides)  # the graph as rewritten runs in eager: its layouts
        return _eager_graph(gm, kind, exc)
    if strides is not None or (traced_strides is not None and report_strides_possible(gm)):
        returned = _returned_strides(lowered)  # what the compiled graph returns (its outputs' layouts)
        if strides is not None or (returned is not None and _saved_layouts_changed(gm, traced_strides, returned)):
            strides = returned
            report_output_strides(strides)
    collectives.mark(lowered)
    t1 = time.perf_counter()
    stages["lower"] = t1 - t0
    line.stage("schedule")
    policies = {dev: b.scheduling for dev, b in reg.backends.items()}
    # a backward's inputs (saved activations, gradients) die with their last reader
    freed = frozenset(i.name for i in lowered.inputs if i.name) if kind == "backward" else frozenset()
    sched = schedule(lowered, policies, freed_inputs=freed)
    kernels = [s for s in sched.steps if isinstance(s, Kernel)]
    for k in kernels:  # a library call a template computes is no library call in the report
        record = k.template.node.record if k.template is not None else None
        if record is not None:
            record.kind, record.reason = "template", f"computed by template {k.template.template.name}"
    name = next_graph_name()
    sched.steps = _name_kernels(sched.steps)
    collectives.bind(sched.steps, lambda device, op: _collective_impl(reg, device, op))
    collectives.describe(sched.steps)
    t2 = time.perf_counter()
    stages["schedule"] = t2 - t1
    line.stage("codegen+compile", graph=name)
    keep = {o.name for o in lowered.outputs if o.name} | collectives.unwaited(sched.steps)
    inputs = {i.name for i in lowered.inputs if i.name} | set(lowered.constants)
    written = {b.storage for b in lowered.buffers.values() if b.storage}  # input mutations
    plan = plan_memory(sched.steps, lowered.buffers, keep, inputs, _hint_fn(example_inputs),
                       _inplace_policy(reg, config), release={i.name for i in lowered.inputs if i.name},
                       donated={i.name for i in lowered.inputs
                                if i.name and i.position in donated and i.name not in written})
    sched.steps = with_inplace(sched.steps, plan)
    kernels = [s for s in sched.steps if isinstance(s, Kernel)]
    by_device: dict[str, list[Kernel]] = {}
    for k in kernels:
        by_device.setdefault(_kernel_device(k, lowered), []).append(k)
    launchers: dict[str, tuple[Any, str]] = {}
    compiled_modules: dict[str, tuple[Any, Any]] = {}
    device_of = {k.name: device_type for device_type, ks in by_device.items() for k in ks}
    programs = host_programs.plan(sched.steps, plan, keep, lowered.buffers,
                                  lambda k: reg.backend_for(device_of[k.name])) \
        if config.host_programs and not config.profile_kernels else []
    for device_type, ks in by_device.items():
        backend = reg.backend_for(device_type)
        offered = [p.program for p in programs if device_of[p.program.launches[0].kernel.name] == device_type]
        module = backend.compile(ks, name, programs=offered) if offered else backend.compile(ks, name)
        var = f"mod_{device_type}"
        compiled_modules[device_type] = (backend, module)
        for k in ks:
            launchers[k.name] = (backend, var)
    t3 = time.perf_counter()
    stages["codegen+compile"] = t3 - t2
    line.stage("wrapper")
    writer = WrapperWriter(lowered, sched.steps, plan, launchers, check_layouts=config.check_extern_layouts,
                           check_inputs=config.check_extern_layouts and kind == "backward",
                           profile_kernels=config.profile_kernels, programs=programs,
                           modules={f"mod_{d}": m for d, (_, m) in compiled_modules.items()})
    wrapper = writer.write()
    for device_type, (_, module) in compiled_modules.items():
        wrapper.namespace[f"mod_{device_type}"] = module
    fn = _first_call_timed(wrapper.build(), stages, "first run")
    mutates = mutates or any(getattr(n, "mutates", None) for n in lowered.nodes)
    captured, capture_note = _captured(fn, config, kind, mutates, compiled_modules, example_inputs, static, reg)
    fn = _first_call_timed(captured, stages, "capture") if captured is not fn else fn
    stages["wrapper"] = time.perf_counter() - t3
    kernel_reports = []
    for device_type, ks in by_device.items():
        backend, module = compiled_modules[device_type]
        kernel_reports += [KernelReport(k.name, device_type, backend.kernel_source(module, k),
                                        k.origins, len(k.nodes) or 1, *_template_report(backend, module, k))
                           for k in ks]
    report = GraphReport(
        name, kind, kernel_reports,
        lowered.fallbacks, plan.peak_bytes, stages, sched.decisions, wrapper.source,
        len(lowered.inputs), bool(lowered.symbol_sources), plan.reused, plan.inplace,
        capture=capture_note, output_strides=strides, frozen=frozen_note,
        programs=tuple(writer.written_programs))
    log.debug("compiled %s: %d kernels, %d fallbacks", name, len(kernels), len(lowered.fallbacks))
    if key is not None:  # once the first call has run: builds and tuning finish in it
        fn = _after_first_call(fn, functools.partial(graph_cache.store, key, report, wrapper, sched.steps,
                                                     compiled_modules))
    if config.debug_dir:
        _dump(report, config.debug_dir, compiled_modules)
    notify(report)
    if reference is not None:
        fn = selfcheck.checked(fn, selfcheck.CheckedGraph.of(
            name, kind, reference, lowered, sched.steps, example_inputs, config.debug_dir, donated))
    return fn


def _loaded(hit: tuple[Callable, GraphReport, dict], config: Config, kind: str, mutates: bool,
            example_inputs: Sequence[Any], static: frozenset[int], reg: Any) -> Callable[[list[Any]], Any]:
    """A graph the graph cache loaded, timed, captured and reported as a compiled one is."""
    fn, report, modules = hit
    fn = _first_call_timed(fn, report.stage_seconds, "first run")
    captured, report.capture = _captured(fn, config, kind, mutates, modules, example_inputs, static, reg)
    fn = _first_call_timed(captured, report.stage_seconds, "capture") if captured is not fn else fn
    if config.debug_dir:
        _dump(report, config.debug_dir, modules)
    notify(report)
    return fn


def load_compiled(key: GraphKey, example_inputs: Sequence[Any], config: Config, kind: str,
                  static: frozenset[int]) -> Callable[[list[Any]], Any] | None:
    """The graph the graph cache holds under ``key`` (an ATen graph's key that
    :mod:`coil.aot_cache` kept), loaded for ``example_inputs`` without its ATen graph; None
    when the entry is gone or unusable. Only for graphs of static sizes that mutate no input
    (what that layer keeps)."""
    reg = plugins.registry()
    with config_active(config):
        hit = graph_cache.load(graph_cache.Ticket(key, None, 0), reg, kind, next_graph_name)
        if hit is None:  # (no AOTAutograd to tell the outputs' strides: none needed at run time)
            return None
        return _loaded(hit, config, kind, False, example_inputs, static, reg)


def _first_call_timed(fn: Callable[[list[Any]], Any], stages: dict[str, float],
                      stage: str) -> Callable[[list[Any]], Any]:
    """``fn``, adding the seconds of its first call to ``stages[stage]`` (the report's
    compile stages, which ``coil.explain`` shows once the graph has run). The first call of
    a compiled graph loads and tunes its kernels and measures its templates (``first run``);
    a recorded graph's first call also records and measures the recording (``capture``: the
    seconds beyond the first run)."""
    pending = [True]

    def call(args: list[Any]) -> Any:
        if not pending:
            return fn(args)
        pending.clear()
        before = stages.get("first run", 0.0)
        t0 = time.perf_counter()
        try:
            return fn(args)
        finally:
            spent = time.perf_counter() - t0
            if stage == "capture":  # the first run inside it counts as its own stage
                spent -= stages.get("first run", 0.0) - before
            stages[stage] = stages.get(stage, 0.0) + spent

    return call


def _after_first_call(fn: Callable[[list[Any]], Any], action: Callable[[], None]) -> Callable[[list[Any]], Any]:
    """``fn``, running ``action`` once, after its first call returns. A backend may finish
    building and tuning a graph's kernels during its first run (the Triton plugin's builds
    overlap it), so the graph cache stores the entry then, with every binary in it."""
    pending = [True]

    def call(args: list[Any]) -> Any:
        if not pending:
            return fn(args)
        out = fn(args)
        if pending:
            pending.clear()
            action()
        return out

    return call


def _captured(fn: Callable[[list[Any]], Any], config: Config, kind: str, mutates: bool,
              modules: dict[str, tuple[Any, Any]], example_inputs: Sequence[Any],
              static: frozenset[int], reg: Any) -> tuple[Callable[[list[Any]], Any], Any]:
    """``fn`` recorded for replay where the ``graph_capture`` knob asks and the graph allows
    (:mod:`coil.capture`), with the note ``coil.explain`` shows."""
    return capture.captured(fn, config.graph_capture, kind, mutates, modules, example_inputs, static,
                            lambda backend: reg.api_version(backend.device_type))


def _lay_out_convolutions(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str,
                          reg: Any, training: bool, frozen: frozenset[torch.fx.Node] = frozenset()
                          ) -> list[tuple[int, ...] | None] | Exception | None:
    """Channels-last convolutions (:mod:`coil.conv_layout`) where the device's backend prefers
    them for the graph's convolutions (forward graphs only with ``training``: the
    ``training_channels_last`` knob). Returns a training forward graph's output strides when
    its saved activations changed layout (to report to AOTAutograd), or the exception that
    keeps a backward graph whose inputs changed layout from being lowered. A backward graph
    adopts its inputs' layouts whatever the knob says (a cached forward graph may have saved
    them channels-last)."""
    if kind == "inference":
        to_channels_last(gm, _channels_last_chooser(reg, training=False), frozen=frozen)
    elif kind == "forward" and training:
        saved = saved_output_positions(gm)  # nothing saved, or no way to report: eager's layouts
        if (saved and report_strides_possible(gm)
                and to_channels_last(gm, _channels_last_chooser(reg, training=True), saved)):
            return output_strides(gm)
    elif kind == "backward":
        try:
            adopt_input_layouts(gm, list(example_inputs))
        except Exception as exc:  # noqa: BLE001 - kernels would read the inputs with wrong strides
            return LoweringError("the backward graph", f"the saved activations' layouts could not be propagated ({exc})")
    return None


def _channels_last_chooser(reg: Any, training: bool) -> Chooser:
    """Asks the device's backend about a graph's convolutions (``prefers_channels_last``,
    SDK 1.1.0); a backend without that method answers with ``Capabilities.conv_channels_last``."""
    def prefers(device: torch.device, convolutions: Sequence[ConvolutionInfo]) -> bool:
        backend = reg.backends.get(device.type)
        ask = getattr(backend, "prefers_channels_last", None)
        if ask is None:
            return bool(capability(device, "conv_channels_last", False, reg))
        return bool(ask(convolutions, training=training))
    return prefers


def _returned_strides(lowered: Any) -> list[tuple[int, ...] | None] | None:
    """The strides of what the lowered graph returns; None where any is symbolic."""
    out: list[tuple[int, ...] | None] = []
    for o in lowered.outputs:
        if o.layout is None:
            out.append(None)
        elif not all(sympy.sympify(x).is_Integer for x in o.layout.stride):
            return None
        else:
            out.append(tuple(int(x) for x in o.layout.stride))
    return out


def _saved_layouts_changed(gm: torch.fx.GraphModule, traced: list[tuple[int, ...] | None],
                           returned: list[tuple[int, ...] | None]) -> bool:
    """Whether a training forward graph returns an activation it saves for the backward in
    other strides than AOTAutograd traced (``traced``): a product padded to the GEMM alignment
    (:mod:`coil.pad_gemm`) returns a view of its wider buffer (BERT's logits, 30522 wide in
    rows of 30528). Reported, the backward graph is compiled for those strides; unreported,
    it copied the saved tensor into the traced strides on every step (0.62 ms of BERT-base's
    training step on an H100)."""
    values = traced_outputs(gm)

    def differ(i: int) -> bool:
        if i >= len(traced) or i >= len(returned) or traced[i] is None or returned[i] is None:
            return False
        sizes = values[i].shape if i < len(values) and isinstance(values[i], torch.Tensor) else None
        if sizes is None or len(sizes) != len(traced[i]) or len(sizes) != len(returned[i]):
            return traced[i] != returned[i]
        # a dim of size 1 may have any stride (linalg.tensorinv's [12, 1, 2, 2, 3] view)
        return any(n != 1 and a != b for n, a, b in zip(sizes, traced[i], returned[i]))  # type: ignore[arg-type]
    return any(differ(i) for i in saved_output_positions(gm))


def report_strides_possible(gm: torch.fx.GraphModule) -> bool:
    """Whether AOTAutograd is listening for the forward graph's output strides, and would
    read them at the right positions: with effect tokens in the graph (``with_effects``, of
    ``torch.linalg``'s error checks, say) torch 2.13 reads the saved activations' strides
    shifted by the tokens, and restrided one with another's strides (a wrong rank there
    failed ``linalg.tensorinv``'s backward compile)."""
    context = torch._guards.TracingContext.try_get()
    if context is None or context.output_strides is None:
        return False
    effects = getattr(torch.ops.higher_order, "with_effects", None)
    return effects is None or not gm.graph.find_nodes(op="call_function", target=effects)


def report_output_strides(strides: list[tuple[int, ...] | None] | None) -> None:
    """Tell AOTAutograd the strides of the forward graph's outputs (the backward graph's
    saved inputs are traced with them); nothing when ``strides`` is None."""
    if strides is None:
        return
    context = torch._guards.TracingContext.try_get()
    assert context is not None and context.output_strides is not None, "checked before the layouts changed"
    context.output_strides[:] = list(strides)


def report_eager(gm: torch.fx.GraphModule, kind: str, why: str) -> None:
    """Warn and report that ``gm`` runs as it is, uncompiled, and why."""
    log.warning("coil: running the %s graph without compiling it: %s", kind, why)
    report = GraphReport(next_graph_name(), kind, [],
                         [FallbackRecord("<whole graph>", why, "fallback")], 0, {}, [], gm.code)
    notify(report)


def _eager_graph(gm: torch.fx.GraphModule, kind: str, exc: Exception) -> Callable[[list[Any]], Any]:
    """The last resort when a graph holds something Coil cannot even call (say, a node kind
    it does not know): run the graph as it is, and say so in the report."""
    report_eager(gm, kind, str(exc))

    def call(args: list[Any]) -> Any:
        values = list(args)
        args.clear()
        return gm(*values)

    return call


def _template_report(backend: Any, module: Any, k: Kernel) -> tuple[str, Callable[[], str] | None]:
    """A template kernel's description ("" for other kernels) and what the backend chose for
    the kernel at run time (a template or the library; a launch configuration, tuned or not)."""
    call = k.template
    choice = getattr(backend, "kernel_choice", None)
    if call is None:
        return "", (lambda: choice(module, k)) if choice is not None else None
    node = call.node
    p = call.problem
    sizes = "x".join(str(s) for s in (p.batch, p.m, p.n, p.k))
    bias = f" + {'%g * ' % call.beta if call.beta != 1 else ''}bias" if call.bias is not None else ""
    epilogue = ", ".join(dict.fromkeys(o for kn in k.nodes for o in kn.node.origins)) or "-"
    how = ("measured against the library (GEMM, then the epilogue as its own kernel) on the first launch"
           if call.measure else "forced" if node.force else "the template's heuristic chose it over the library")
    text = (f"{call.template.name} ({call.template.dialect}): {p.op} BxMxNxK {sizes}, {p.a.dtype} -> "
            f"{p.out_dtype}{bias}; epilogue: {epilogue}; {how}")
    return text, (lambda: choice(module, k)) if choice is not None else None


def _kernel_device(k: Kernel, graph: LoweredGraph) -> str:
    return k.first_node.device.type


#: Ops left out of kernel names (they move no data once fused).
_DATA_MOVEMENT = {"view", "unsafe_view", "permute", "expand", "clone", "unsqueeze", "squeeze", "alias",
                  "split_with_sizes", "split", "slice", "select", "t", "transpose", "to_copy",
                  "scalar_tensor", "full", "full_like"}


def _name_kernels(steps: list[object]) -> list[object]:
    """``steps`` with each kernel renamed after what it fuses: ``k3_amax_sub_exp_sum_div``
    (``Kernel`` is frozen: a renamed copy)."""
    numbers = itertools.count()
    return [dataclasses.replace(s, name=_kernel_name(next(numbers), s)) if isinstance(s, Kernel) else s
            for s in steps]


def _kernel_name(i: int, k: Kernel) -> str:
    ops: list[str] = []
    for origin in k.origins:
        parts = origin.split(".")  # "aten.add.Tensor", "coil.max_pool2d_offsets.default"
        short = re.sub(r"\W", "_", parts[1] if len(parts) > 1 else origin).strip("_")
        if short not in ops and short not in _DATA_MOVEMENT:
            ops.append(short)
    suffix = "_".join(ops)[:48].rstrip("_")
    return f"k{i}_{suffix}" if suffix else f"k{i}"


def _dump(report: GraphReport, folder: str, modules: dict[str, tuple[Any, Any]]) -> None:
    path = Path(folder) / report.name
    path.mkdir(parents=True, exist_ok=True)
    (path / "wrapper.py").write_text(report.wrapper_source)
    for device_type, (_, module) in modules.items():
        source = getattr(module, "source", None)
        if source:
            (path / f"kernels_{device_type}.txt").write_text(source)
    lines = [f"{'FUSED  ' if d.fused else 'REFUSED'} {d.a} + {d.b}: {d.reason}" for d in report.decisions]
    (path / "fusion.txt").write_text("\n".join(lines) + "\n")
    (path / "report.txt").write_text(format_graph(report))


__all__ = ["compile_graph", "GraphReport", "KernelReport", "add_observer", "remove_observer"]
