"""The Dynamo backend: ``torch.compile(model, backend="coil")`` lands in :func:`compile_fx`,
which runs AOTAutograd with Coil's decompositions so forward and backward graphs both reach
Coil's compiler."""
from __future__ import annotations

import functools
import logging
from typing import Any, Sequence

import torch
from torch._functorch import config as functorch_config
from torch._functorch.aot_autograd import aot_module_simplified

from . import aot_cache, aot_training, capture, collect, compile_agreement, freezing, joint_aliases, output_check, plugins
from . import config as config_mod
from .attention import rewrite_attention
from .compile import compile_graph, load_compiled, pad_joint_gemms, report_eager
from .eager_only import overlapping_input
from .cse import eliminate_common_subexpressions
from .decompositions import table
from .dynamo_rewrites import restore_fused_updates
from .embedding_partition import partition_smaller
from .errors import ConfigError
from .full_masks import simplify_masks
from .kept_whole import keep_whole
from .mutated_inputs import partition_safely
from .pool_offsets import narrow_saved_indices

log = logging.getLogger(__name__)

#: ``torch.compile(mode=...)`` values Coil accepts; "reduce-overhead" turns on graph capture.
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _partition_fn() -> Any:
    """AOTAutograd's min-cut partitioner, after Coil's joint-graph rewrites: aliases taken out
    (:mod:`coil.joint_aliases`), common subexpressions merged (:mod:`coil.cse`, in place of
    the partitioner's own pass, which imports most of Inductor) and max-pool indices saved as
    int8 window offsets (:mod:`coil.pool_offsets`), matmuls padded to the GEMM alignment
    (:mod:`coil.pad_gemm`, once for forward and backward); a graph with embeddings is partitioned with
    them whole and as index gathers, and the smaller saved set kept
    (:mod:`coil.embedding_partition`); a backward that reads an input the forward writes is
    partitioned again with that input read through a saved copy (:mod:`coil.mutated_inputs`)."""
    try:
        from torch._functorch.partitioners import min_cut_rematerialization_partition as base
    except ImportError:  # pragma: no cover - older torch
        from torch._functorch.partitioners import default_partition as base

    @functools.wraps(base)
    def partition(joint_module: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        joint_aliases.drop_aliases(joint_module)
        if functorch_config.cse:  # unless the user turned it off: Coil's pass, not the partitioner's
            eliminate_common_subexpressions(joint_module)
        narrow_saved_indices(joint_module)
        pad_joint_gemms(joint_module)
        with functorch_config.patch(cse=False, activation_memory_budget=_memory_budget(joint_module)):
            return partition_safely(functools.partial(partition_smaller, base), joint_module, *args, **kwargs)

    return partition


def _memory_budget(joint_module: torch.fx.GraphModule) -> float:
    """The partitioner's ``activation_memory_budget``, but 1.0 where the joint graph draws
    random numbers: below 1 torch's solver may recompute a random op in the backward graph,
    which then draws other numbers than the forward did (dropout's gradient through another
    mask, on every backend; pytorch/pytorch#190758, found by a hunt in session 38)."""
    budget = functorch_config.activation_memory_budget
    if budget >= 1.0:
        return budget
    seeded = torch.Tag.nondeterministic_seeded
    if not any(n.op == "call_function" and seeded in getattr(n.target, "tags", ())
               for n in joint_module.graph.nodes):
        return budget
    log.warning("coil: activation_memory_budget=%s ignored for a graph with random ops (torch's partitioner "
                "would recompute them in the backward with other numbers); partitioned with 1.0", budget)
    return 1.0


_warmed: set[str] = set()


def _warm_up(example_inputs: Sequence[Any]) -> None:
    """Let the backend of each device among the inputs start what its first compile needs
    (``DeviceBackend.warm_up``), once per process, while AOTAutograd traces."""
    for t in example_inputs:
        device_type = getattr(getattr(t, "device", None), "type", None)
        if device_type is None or device_type in _warmed:
            continue
        _warmed.add(device_type)
        backend = plugins.registry().backends.get(device_type)
        if backend is not None and hasattr(backend, "warm_up"):
            try:
                backend.warm_up()
            except Exception as exc:  # noqa: BLE001 - a head start, never a failure
                log.debug("warm-up of the %s backend failed: %s", device_type, exc)


def _aot_cache_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any) -> Any:
    """The Dynamo graph's key in :mod:`coil.aot_cache`, or None where that layer does not
    apply (the log says why)."""
    why = aot_cache.refusal(gm, example_inputs, cfg)
    if why is not None:
        log.debug("aot cache: not used: %s", why)
        return None
    return aot_cache.key(gm, example_inputs, cfg, plugins.registry())


def _from_aot_cache(layer_key: Any, example_inputs: Sequence[Any], cfg: Any) -> Any:
    """The compiled graph an earlier process made of this Dynamo graph, called as
    AOTAutograd would call it; None on a miss."""
    entry = aot_cache.lookup(layer_key)
    if entry is None:
        return None
    fn = load_compiled(entry.graph, example_inputs, cfg, "inference", frozenset(entry.static_inputs))
    if fn is None:
        log.debug("aot cache: the graph cache no longer holds entry %s", entry.graph.digest[:16])
        return None
    return collect.collecting(aot_cache.call_like_aot(torch._disable_dynamo(fn)))


def _training_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any) -> Any:
    """The training graph's key in :mod:`coil.aot_training`, or None where that layer does
    not apply (the log says why)."""
    why = aot_training.refusal(gm, example_inputs, cfg)
    if why is not None:
        log.debug("aot training cache: not used: %s", why)
        return None
    return aot_training.key(gm, example_inputs, cfg, plugins.registry())


def _from_training_cache(layer_key: Any, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                         cfg: Any) -> Any:
    """The training graph an earlier process compiled, in AOTAutograd's wrapper rebuilt by
    torch; None on a miss."""
    entry = aot_cache.lookup(layer_key)
    if not isinstance(entry, aot_training.Entry):
        return None
    forward = load_compiled(entry.forward, (), cfg, "forward", frozenset())
    backward = load_compiled(entry.backward, (), cfg, "backward", frozenset()) if forward is not None else None
    if backward is None:
        log.debug("aot training cache: the graph cache no longer holds a graph of entry %s", layer_key.digest[:16])
        return None
    try:
        return collect.collecting(aot_training.wrap(entry, forward, backward, gm, example_inputs))
    except Exception as exc:  # noqa: BLE001 - an entry torch cannot rebuild: trace again
        log.warning("coil: aot training cache entry %s could not be used (%s: %s)", layer_key.digest[:16],
                    type(exc).__name__, exc)
        return None


def _remembering(layer_key: Any) -> Any:
    """``compile_graph``'s ``on_key`` for an inference graph: keep the ATen graph's key under
    the Dynamo graph's when AOTAutograd's wrapper is a plain call."""

    def on_key(graph: Any) -> None:
        why = aot_cache.plain_wrapper()
        if why is not None:
            log.debug("aot cache: not kept: %s", why)
            return
        aot_cache.remember(layer_key, aot_cache.Entry(graph, tuple(sorted(capture.static_input_indices()))))

    return on_key


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
               options: dict[str, Any] | None = None, **unused: Any) -> Any:
    """Dynamo backend entry point: the compiled graph, its first call's outputs checked
    against what Dynamo traced (:mod:`coil.output_check`)."""
    captured = gm.gm if isinstance(gm, torch._dynamo.utils.GmWrapper) else gm
    return output_check.checked(_compile(gm, example_inputs, mode, options), captured)


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str | None,
             options: dict[str, Any] | None) -> Any:
    if mode not in MODES:
        raise ConfigError(str(mode), [str(m) for m in MODES if m], "unknown mode")
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        # a graph taking a list (compiled autograd's boxed inputs): Dynamo's helper flattens
        # the inputs and hands back a GmWrapper, which AOTAutograd calls boxed
        return torch._dynamo.utils.flatten_graph_inputs(
            gm, example_inputs, functools.partial(compile_fx, mode=mode, options=options))
    cfg = config_mod.with_options(config_mod.get(), options)  # this call's knobs and plugin options
    captured = gm.gm if isinstance(gm, torch._dynamo.utils.GmWrapper) else gm  # flattened inputs
    overlap = overlapping_input(captured, example_inputs)
    if overlap is not None:  # runs as captured, before AOTAutograd's functional graph (coil.eager_only)
        report_eager(captured, "captured", overlap)
        return gm.forward
    if mode == "reduce-overhead":
        cfg.graph_capture = "on"
    layer_key = _aot_cache_key(gm, example_inputs, cfg)
    if layer_key is not None:
        loaded = _from_aot_cache(layer_key, example_inputs, cfg)
        if loaded is not None:
            return loaded
    training_key = _training_key(gm, example_inputs, cfg) if layer_key is None else None
    if training_key is not None:
        loaded = _from_training_cache(training_key, gm, example_inputs, cfg)
        if loaded is not None:
            return loaded
    recorder = aot_training.Recorder(training_key) if training_key is not None else None
    _warm_up(example_inputs)
    graph_module = gm.gm if isinstance(gm, torch._dynamo.utils.GmWrapper) else gm  # flattened inputs
    keep_whole(graph_module)  # ops whose decomposition is wrong stay ATen calls (coil.kept_whole)
    restore_fused_updates(graph_module)  # Dynamo's addcdiv/addcmul rewrites undone (coil.dynamo_rewrites)
    if cfg.attention_rewrite:  # on the torch-level graph: the backward then comes from autograd
        rewrite_attention(graph_module)
        simplify_masks(graph_module)

    @torch._disable_dynamo
    def compiler(kind: str, graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
        # Dynamo must not trace Coil itself (the backward graph compiles lazily, possibly
        # while a compiled frame runs), nor the wrapper it returns.
        # a backward graph compiles lazily, on its own: ranks agree on it alone
        if kind == "inference" and functorch_config.cse:
            # a training graph's repeats are merged in the joint graph (``_partition_fn``);
            # an inference graph's here (BERT's padding mask, made anew by each layer's SDPA)
            eliminate_common_subexpressions(graph)
        on_key = _remembering(layer_key) if kind == "inference" and layer_key is not None else None
        if recorder is not None and kind != "inference":
            on_key = recorder.on_key(kind)
        fn = compile_agreement.guarded(f"a {kind} graph", lambda: compile_agreement.graph_digest(graph, inputs),
                                       cfg.compile_agreement, lambda: compile_graph(graph, inputs, cfg, kind, on_key))
        fn = torch._disable_dynamo(fn)
        fn._boxed_call = True  # the wrapper takes the argument list (AOTAutograd's boxed convention)
        if kind == "backward":
            collect.after_backward_compile()
        return fn

    # the freezing knob: parameters become constants of an inference graph (coil.freezing)
    frozen = freezing.candidates(graph_module, example_inputs) if cfg.freezing and not torch.is_grad_enabled() else None

    # DDPOptimizer (Dynamo's graph splitting under DDP) reads this counter to learn that
    # AOTAutograd compiled a bucket's graph, whose first call then returns fake outputs at
    # compile time; without it that first call comes at run time and returns fakes to the user
    torch._dynamo.utils.counters["aot_autograd"]["total"] += 1
    # under torch.distributed, one rank's failed compile fails every rank (coil.compile_agreement)
    with freezing.sources(frozen):
        return _aot_compiled(gm, graph_module, example_inputs, cfg, recorder, compiler)


def _aot_compiled(gm: torch.fx.GraphModule, graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  cfg: Any, recorder: Any, compiler: Any) -> Any:
    """AOTAutograd over the Dynamo graph, its graphs compiled by ``compiler``."""
    return collect.collecting(compile_agreement.guarded(
        "a Dynamo graph", lambda: compile_agreement.graph_digest(graph_module, example_inputs), cfg.compile_agreement,
        lambda: _traced(recorder, lambda: aot_module_simplified(
            gm, example_inputs,
            fw_compiler=functools.partial(compiler, "forward"),
            bw_compiler=functools.partial(compiler, "backward"),
            inference_compiler=functools.partial(compiler, "inference"),
            decompositions=table(),
            partition_fn=_partition_fn(),
            keep_inference_input_mutations=True,
        ))))


def _traced(recorder: Any, trace: Any) -> Any:
    """``trace()`` (AOTAutograd), watched by the training layer's recorder when there is one."""
    if recorder is None:
        return trace()
    with recorder.tracing():
        return trace()
