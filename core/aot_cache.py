"""The graph cache's first layer: an inference graph as Dynamo hands it over, mapped to the
compiled graph it became, so that a later process skips AOTAutograd too.

Coil's graph cache (:mod:`coil.graph_cache`) is keyed by the ATen graph that AOTAutograd
traces, so every process pays that trace (0.7-0.9 s of a warm first call of the GPT block on
the H200) before the cache is asked. This layer keys the Dynamo graph itself, with
everything the trace depends on beyond it, and on a hit calls the cached compiled graph the
way AOTAutograd's inference wrapper would.

Only graphs whose AOTAutograd wrapper is a plain call are kept, and both ends check it:

* before the trace (:func:`refusal`): an inference graph (no input requires grad, or grad
  mode is off), its inputs plain tensors of static sizes with no two sharing storage, no
  parameters, attributes or submodules of its own, every target a function of ``torch``
  (outside ``torch.distributed``), ``operator`` or ``math`` or an ``aten``/``prims`` op (not
  a custom op, not a higher-order op), every output a tensor; not
  under ``torch.distributed``, self-check mode or a graph that flattens its inputs;
* after the trace (:func:`plain_wrapper`): AOTAutograd's view-and-mutation metadata says
  the graph mutates no input, returns no alias of an input or of another output, carries
  no effect tokens, subclasses or functionalised random state, and does not change grad
  mode.

Then the wrapper is what :func:`call_like_aot` does: the compiled graph runs with grad mode
off, and with autocast off when any autocast is on while it is loaded, as AOTAutograd
decides at compile time (its casts are in the graph). The key (:func:`key`) is the graph cache's key of the Dynamo graph (its nodes,
inputs, Coil's config, plugins, versions and sources) plus :func:`state_text`: grad mode,
autocast on the graph's device types, the default dtype, deterministic algorithms and the backend flags that
decide how torch decomposes an op while tracing (SDPA's kernels, TF32, cuDNN), and
AOTAutograd's own knobs (``torch._functorch.config``, those that save portably). An entry
holds the ATen graph's key; a hit loads that entry from the graph cache, and an entry gone
from it (evicted, refused) is a miss. The ``graph_cache`` knob turns both layers off."""
from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch._functorch import config as functorch_config
from torch._functorch._aot_autograd.schemas import OutputType
from torch.multiprocessing.reductions import StorageWeakRef

from . import plugins
from .graph_key import GraphKey, Uncacheable, devices_of, graph_key
from .sdk.diskcache import DiskCache

log = logging.getLogger(__name__)

NAMESPACE = "aot"
SUFFIX = ".aot"
#: Enters every key; raise it when what an entry holds or means changes.
FORMAT = "coil-aot-cache-2"

#: Modules whose functions may be targets of a cached Dynamo graph (their code is versioned
#: with torch and Python); user functions are not, since their code is not in the key.
_SAFE_MODULES = ("torch", "operator", "_operator", "math", "builtins")
_UNSAFE_MODULES = ("torch.distributed", "torch._C._distributed")


@dataclass(frozen=True)
class Entry:
    """What a hit needs: the ATen graph's key in the graph cache and the inputs whose
    address stays fixed (for graph capture)."""

    graph: GraphKey
    static_inputs: tuple[int, ...]


def _target_module(target: Any) -> str:
    module = getattr(target, "__module__", None) or ""
    if not module and getattr(target, "__self__", None) is not None:  # a builtin method
        module = type(target.__self__).__module__
    return module


#: Operator namespaces whose ops are torch's own; a custom op's Python (its implementation or
#: decomposition, which AOTAutograd may trace into the graph) is not in the key.
_TORCH_OP_NAMESPACES = ("aten", "prims")


def _safe_target(target: Any) -> bool:
    if isinstance(target, torch._ops.HigherOrderOperator):
        return False
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        qualified = getattr(target, "_qualified_op_name", None) or target.name()  # "ns::op[.overload]"
        return qualified.split("::")[0] in _TORCH_OP_NAMESPACES
    module = _target_module(target)
    if module.startswith(_UNSAFE_MODULES):
        return False
    return any(module == m or module.startswith(m + ".") for m in _SAFE_MODULES)


def _static_tensor(x: Any) -> bool:
    return (type(x) in (torch.Tensor, torch.nn.Parameter)
            and not any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride(), x.storage_offset())))


def refusal(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> str | None:
    """Why the Dynamo graph ``gm`` cannot use this layer; None when it can."""
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs):
        return "a training graph (an input requires grad)"
    return graph_refusal(gm, example_inputs, config)


def graph_refusal(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> str | None:
    """Why the Dynamo graph ``gm`` has no key of its own in either layer before AOTAutograd
    (this one and :mod:`coil.aot_training`); None when it has."""
    if not config.graph_cache or config.check:
        return "the graph cache is off or self-check mode is on"
    if config.freezing and not torch.is_grad_enabled():
        return "freezing: the graph's constants are this process's parameters"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "torch.distributed is initialised (compiles agree across ranks)"
    if isinstance(gm, torch._dynamo.utils.GmWrapper):
        return "the graph flattens its inputs"
    if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
        return "the graph module holds parameters or buffers"
    if any(True for _ in gm.children()):  # saved-tensor hooks arrive as submodules
        return "the graph module holds submodules"
    if not all(_static_tensor(x) for x in example_inputs):
        return "an input is not a tensor of static size"
    storages = {StorageWeakRef(x.untyped_storage()) for x in example_inputs}
    if len(storages) != len(example_inputs):
        return "two inputs share storage"
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            return f"a {node.op} node ({node.target})"
        if node.op == "call_function" and not _safe_target(node.target):
            return f"target {node.target!r} is not a torch function"
        if node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
            if not all(isinstance(o, torch.fx.Node)
                       and isinstance(o.meta.get("example_value"), torch.Tensor) for o in outs):
                return "an output is not a tensor"
    return None


def state_text(device_types: Sequence[str]) -> str:
    """Global state AOTAutograd's trace reads beyond the graph and its inputs (autocast: for
    the ``device_types`` the graph's values live on)."""
    parts = [f"grad={torch.is_grad_enabled()}", f"inference_mode={torch.is_inference_mode_enabled()}",
             f"default_dtype={torch.get_default_dtype()}",
             f"deterministic={torch.are_deterministic_algorithms_enabled()}"
             f"/{torch.is_deterministic_algorithms_warn_only_enabled()}",
             f"autocast_cache={torch.is_autocast_cache_enabled()}",
             f"matmul_precision={torch.get_float32_matmul_precision()}"]
    # every served device type's autocast, not only those of the graph's values: a graph that
    # makes its tensors (no tensor input) or moves them by a string device is no less under
    # autocast (a graph of ``torch.ones(8, 8) @ ...`` hit its float32 entry under bf16 autocast: a hunt)
    for device_type in sorted({*device_types, *plugins.registry().backends}):
        try:
            enabled, dtype = torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
        except (RuntimeError, TypeError):  # a device type without autocast
            enabled, dtype = False, None
        parts.append(f"autocast.{device_type}={enabled}/{dtype}")
    try:  # AOTAutograd's own knobs (those that save portably)
        parts.append(f"functorch={sorted(functorch_config.save_config_portable().items())!r}")
    except (AttributeError, TypeError):
        parts.append("functorch=?")
    backends = torch.backends
    flags = {
        "cuda.flash": backends.cuda.flash_sdp_enabled, "cuda.mem_efficient": backends.cuda.mem_efficient_sdp_enabled,
        "cuda.math": backends.cuda.math_sdp_enabled, "cuda.cudnn": backends.cuda.cudnn_sdp_enabled,
        "cuda.tf32": lambda: backends.cuda.matmul.allow_tf32,
        "cuda.bf16_reduced": lambda: backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cuda.fp16_reduced": lambda: backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cudnn": lambda: (backends.cudnn.enabled, backends.cudnn.allow_tf32, backends.cudnn.deterministic,
                          backends.cudnn.benchmark),
        "mkldnn": lambda: backends.mkldnn.enabled,
    }
    for name, read in flags.items():
        try:
            parts.append(f"{name}={read()}")
        except (AttributeError, RuntimeError):  # not in this build of torch
            parts.append(f"{name}=?")
    return "\n".join(parts)


def key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any, reg: Any) -> GraphKey | None:
    """The layer's key of the Dynamo graph ``gm``; None when it has no canonical form."""
    try:
        return graph_key(gm, example_inputs, config, "aot-inference", reg,
                         extra={"format_aot": FORMAT, "state": state_text(devices_of(gm, example_inputs))})
    except Uncacheable as why:
        log.debug("aot cache: not keyed: %s", why)
        return None


def _store() -> DiskCache:
    return DiskCache.in_namespace(NAMESPACE, fanout=True, layer="graph")


def lookup(layer_key: GraphKey) -> Entry | None:
    """The entry under ``layer_key``; None on a miss or an unreadable entry."""
    payload = _store().read(layer_key.digest, SUFFIX)
    if payload is None:
        return None
    try:
        data = pickle.loads(payload)
        if data.get("format") != FORMAT or data.get("key") != layer_key.digest:
            raise ValueError("an entry of another format or key")
        return data["entry"]
    except Exception as exc:  # noqa: BLE001 - an unusable entry means: trace and compile again
        log.warning("coil: aot cache entry %s could not be used (%s: %s)", layer_key.digest[:16],
                    type(exc).__name__, exc)
        return None


def remember(layer_key: GraphKey, entry: Entry) -> None:
    """Write the entry (a full or read-only cache folder is logged, never raised)."""
    payload = pickle.dumps({"format": FORMAT, "key": layer_key.digest, "entry": entry},
                           protocol=pickle.HIGHEST_PROTOCOL)
    try:
        _store().write(layer_key.digest, SUFFIX, payload)
    except OSError as exc:
        log.warning("coil: could not write aot cache entry: %s", exc)


def plain_wrapper() -> str | None:
    """Why AOTAutograd's wrapper of the graph being compiled is more than a call (read from
    its view-and-mutation metadata); None when it is a plain call."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    if meta is None:
        return "no AOTAutograd metadata"
    if any(i.mutates_data or i.mutates_metadata for i in meta.input_info):
        return "the graph mutates an input"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return "an output aliases an input or another output"
    checks = {"intermediate bases": meta.num_intermediate_bases, "effect tokens": len(meta.tokens or ()),
              "subclass inputs or outputs": any(type(m).__name__ == "SubclassCreationMeta" for m in
                                                [*(getattr(meta, "subclass_inp_meta", None) or ()),
                                                 *(getattr(meta, "subclass_fw_graph_out_meta", None) or ())]),
              "functionalised random state": meta.is_rng_op_functionalized,
              "a grad-mode change": meta.grad_enabled_mutation is not None,
              "dynamic outputs": bool(getattr(meta, "dynamic_outputs", False))}
    return next((f"the graph has {what}" for what, present in checks.items() if present), None)


def call_like_aot(fn: Callable[[list[Any]], Any]) -> Callable[..., Any]:
    """``fn`` (a compiled inference graph, boxed) called as AOTAutograd's inference wrapper
    calls it: grad mode off, autocast off when any is on now, at compile time (its casts are
    in the graph)."""
    disable_amp = torch._C._is_any_autocast_enabled()

    set_grad = torch._C._set_grad_enabled  # a plain switch: ``no_grad()`` costs microseconds a call

    def forward(*args: Any) -> Any:
        grad_was = torch.is_grad_enabled()
        set_grad(False)
        try:
            if disable_amp:
                with torch._C._DisableAutocast():
                    return fn(list(args))
            return fn(list(args))
        finally:
            set_grad(grad_was)

    return forward


__all__ = ["Entry", "refusal", "graph_refusal", "key", "lookup", "remember", "plain_wrapper", "call_like_aot", "state_text",
           "NAMESPACE", "SUFFIX", "FORMAT"]
