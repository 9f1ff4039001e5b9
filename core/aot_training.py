"""The layer before AOTAutograd for training graphs: a Dynamo graph whose inputs require
grad, compiled once, is loaded by a later process without AOTAutograd's trace.

:mod:`coil.aot_cache` keeps inference graphs, whose AOTAutograd wrapper is a plain call.
A training graph's wrapper is an ``autograd.Function`` with much behaviour of its own
(non-differentiable outputs, materialised gradients, donated buffers and the error on a
second backward, compiled autograd, input mutations and aliased outputs replayed outside
the graph), so this layer does not rebuild it: it keeps what AOTAutograd's own cache keeps
(its view-and-mutation metadata, its wrappers, the partition's counts, the backward graph
for compiled autograd, its sanitised config) with the graph cache's keys of the compiled
forward and backward graphs, and on a hit hands them to torch's
``GenericAOTAutogradResult.wrap_post_compile``, the function torch's own AOTAutograd cache
calls on a hit: the wrapper is torch's, built from torch's metadata.

* Recording (:class:`Recorder`): while AOTAutograd runs for a keyed graph, its
  ``_cache_autograd_info`` step (where torch's cache saves) is wrapped to learn those values;
  the entry is written once the backward graph has compiled (at the first backward, as
  AOTAutograd compiles backwards lazily) and both graphs' keys are known.
* Key (:func:`key`): :mod:`coil.aot_cache`'s key of the Dynamo graph (graph, inputs with
  requires_grad, Coil's config, plugins, versions, sources, grad mode, autocast, AOTAutograd's
  knobs) plus each input's leaf-ness, parameter-ness and Dynamo's static marking.
* Refusals (:func:`refusal`): everything :func:`coil.aot_cache.graph_refusal` refuses, graph
  capture ``on`` (its recording needs the graphs' example inputs), saved-tensor hooks or
  fakified first calls at compile time; after the trace, subclasses, symbolic sizes saved for
  the backward, graph-safe random states, effect tokens or an entry that does not pickle.

A hit needs both graphs in the graph cache; a missing one is a miss (AOTAutograd traces
again). The ``graph_cache`` knob turns this layer off with the others."""
from __future__ import annotations

import dataclasses
import inspect
import logging
import pickle
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from . import aot_cache
from .graph_key import GraphKey, Uncacheable, devices_of, graph_key

log = logging.getLogger(__name__)

#: Enters every key; raise it when what an entry holds or means changes.
FORMAT = "coil-aot-training-2"


@dataclasses.dataclass(frozen=True)
class Entry:
    """What a hit needs: the compiled graphs' keys in the graph cache and AOTAutograd's
    values for ``GenericAOTAutogradResult`` (``fields``: its dataclass fields other than the
    compiled graphs). The backward's own two values are always none: an entry has no
    backward state input and saves no symbolic size for the backward (both are refused)."""

    forward: GraphKey
    backward: GraphKey
    fields: dict[str, Any]


def _saved_tensor_hooks_active() -> bool:
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    try:
        return top is not None and top(True) is not None
    except (RuntimeError, TypeError):  # pragma: no cover - a torch without the query
        return True


def refusal(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> str | None:
    """Why the Dynamo graph ``gm`` cannot use this layer; None when it can."""
    if not (torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs)):
        return "not a training graph"
    if config.graph_capture == "on":
        return "graph capture is on"
    if _saved_tensor_hooks_active():
        return "saved-tensor hooks are active"
    context = torch._guards.TracingContext.try_get()
    if context is not None and getattr(context, "fakify_first_call", False):
        return "the first call is fakified"
    return aot_cache.graph_refusal(gm, example_inputs, config)


def _inputs_text(example_inputs: Sequence[Any]) -> str:
    """What AOTAutograd reads of an input beyond its metadata in the graph key."""
    return ";".join(f"leaf={x.is_leaf},param={isinstance(x, torch.nn.Parameter)},"
                    f"static={getattr(x, '_dynamo_static_input_type', None)}" for x in example_inputs)


def key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any, reg: Any) -> GraphKey | None:
    """The layer's key of the training graph ``gm``; None when it has no canonical form."""
    try:
        return graph_key(gm, example_inputs, config, "aot-training", reg,
                         extra={"format_aot": FORMAT,
                                "state": aot_cache.state_text(devices_of(gm, example_inputs)),
                                "training_inputs": _inputs_text(example_inputs)})
    except Uncacheable as why:
        log.debug("aot training cache: not keyed: %s", why)
        return None


# ----------------------------------------------------------------------------- recording


def _graph_compile() -> Any:
    from torch._functorch._aot_autograd import graph_compile
    return graph_compile


def _result_class() -> Any:
    from torch._functorch._aot_autograd.aot_autograd_result import GenericAOTAutogradResult
    return GenericAOTAutogradResult


def _sanitized(aot_config: Any) -> Any:
    """The config torch's own cache keeps (compilers, partitioner and tables dropped)."""
    to_cacheable = getattr(aot_config, "to_cacheable", None)
    if to_cacheable is not None:  # torch 2.13
        return to_cacheable()
    return _graph_compile().sanitize_aot_config(aot_config)  # torch 2.11-2.12


def _serialized(bw_module: torch.fx.GraphModule) -> Any:
    """The backward graph as torch's cache keeps it (for compiled autograd), leaving the
    live module's meta alone."""
    from torch._functorch._aot_autograd.aot_autograd_result import SerializedGraphModule
    kept = bw_module.meta
    bw_module.meta = {}
    try:
        return SerializedGraphModule(bw_module)
    finally:
        bw_module.meta = kept


_active: list["Recorder"] = []


class Recorder:
    """Learns, while AOTAutograd compiles a keyed training graph, what :class:`Entry` holds,
    and writes the entry under ``layer_key`` once the backward graph has compiled."""

    def __init__(self, layer_key: GraphKey) -> None:
        self.layer_key = layer_key
        self.graphs: dict[str, GraphKey] = {}
        self.values: dict[str, Any] | None = None
        self.written = False

    def on_key(self, kind: str) -> Callable[[GraphKey], None]:
        """``compile_graph``'s ``on_key`` for the forward or backward graph."""
        return lambda graph: self.graphs.__setitem__(kind, graph)

    @contextmanager
    def tracing(self) -> Iterator[None]:
        """AOTAutograd's ``_cache_autograd_info`` wrapped for the block."""
        module = _graph_compile()
        original = getattr(module, "_cache_autograd_info", None)
        if original is None:  # a torch without that step: nothing to record
            yield
            return
        signature = inspect.signature(original)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            saver, entry = original(*args, **kwargs)
            if saver is not None or entry is not None or not _active:
                return saver, entry  # torch's own cache is on (or a nested compile): its business
            return _active[-1].learned(signature.bind(*args, **kwargs).arguments), None

        module._cache_autograd_info = wrapped
        _active.append(self)
        try:
            yield
        finally:
            _active.pop()
            module._cache_autograd_info = original

    def learned(self, values: dict[str, Any]) -> Callable[..., None] | None:
        """AOTAutograd's values at its cache step; the saver it calls once the backward has
        compiled (None when it has already: the entry is written now)."""
        self.values = dict(values)
        if values.get("compiled_bw_func") is not None:
            self.save(values["compiled_bw_func"], values.get("bw_module"), values["fw_metadata"],
                      values["aot_config"])
            return None
        return self.save

    def save(self, compiled_bw: Any, bw_module: Any, fw_metadata: Any, aot_config: Any) -> None:
        """Write the entry (AOTAutograd's ``try_save_cache_entry`` signature); a refusal is
        logged, never raised: the compile already succeeded."""
        if self.written:
            return
        self.written = True
        try:
            entry = self._entry(bw_module, fw_metadata, aot_config)
        except Exception as exc:  # noqa: BLE001 - an entry is an optimisation
            log.debug("aot training cache: not kept: %s", exc)
            return
        aot_cache.remember(self.layer_key, entry)

    def _entry(self, bw_module: Any, fw_metadata: Any, aot_config: Any) -> Entry:
        values = self.values or {}
        if set(self.graphs) != {"forward", "backward"}:
            raise ValueError(f"graph cache keys for {sorted(self.graphs)} only")
        if values.get("maybe_subclass_meta") is not None:
            raise ValueError("tensor subclass inputs or outputs")
        if values.get("num_symints_saved_for_bw"):
            raise ValueError("symbolic sizes saved for the backward")
        if not all(isinstance(a, torch.Tensor) for a in values.get("flat_args", ())):
            raise ValueError("an input that is not a tensor (a backward state)")
        if getattr(fw_metadata, "num_graphsafe_rng_states", 0) or getattr(fw_metadata, "tokens", None):
            raise ValueError("graph-safe random states or effect tokens")
        if bw_module is None:
            raise ValueError("no backward graph")
        fields = {
            "aot_joint_graph_str": None, "aot_forward_graph_str": None, "aot_backward_graph_str": None,
            "min_cut_info_str": None, "runtime_metadata": fw_metadata,
            "dispatch_wrappers": values["wrappers"], "maybe_subclass_meta": None,
            "num_fw_outs_saved_for_bw": values["num_fw_outs_saved_for_bw"],
            "indices_of_inps_to_detach": list(values["_indices_of_inps_to_detach"]),
            "forward_time_taken_ns": 0, "backward_time_taken_ns": 0,
            "sanitized_aot_config": _sanitized(aot_config), "guards_expr": None,
            "serialized_bw_module": _serialized(bw_module),
        }
        known = {f.name for f in dataclasses.fields(_result_class())} - {"compiled_fw", "compiled_bw"}
        if not set(fields) >= known:
            raise ValueError(f"this torch's AOTAutograd result has fields {sorted(known - set(fields))} "
                             f"the layer does not know")
        entry = Entry(self.graphs["forward"], self.graphs["backward"],
                      {k: v for k, v in fields.items() if k in known})
        pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)  # refuse here what would not load
        return entry


# ----------------------------------------------------------------------------- a hit


class _Loaded:
    """A loaded compiled graph in the shape torch's result expects of its forward and
    backward (``load``, ``post_compile``, the backward's two counts)."""

    def __init__(self, fn: Callable[[list[Any]], Any]) -> None:
        self.fn = fn
        self.backward_state_indices: list[int] = []  # none: refused when recording
        self.num_symints_saved_for_bw_ = 0

    def pre_save(self) -> None:
        pass

    def load(self, example_inputs: Sequence[Any]) -> Callable[[list[Any]], Any]:
        return self.fn

    def post_compile(self, result: Any, fx_config: Any) -> Any:
        return result


def _boxed(fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    fn = torch._disable_dynamo(fn)
    fn._boxed_call = True  # type: ignore[attr-defined]
    return fn


def wrap(entry: Entry, forward: Callable[[list[Any]], Any], backward: Callable[[list[Any]], Any],
         gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The Dynamo graph's compiled function: AOTAutograd's wrapper around the loaded
    ``forward`` and ``backward``, built by torch from the entry's values, called as
    ``aot_module_simplified``'s result is."""
    result = _result_class()(
        compiled_fw=_Loaded(_boxed(forward)),
        compiled_bw=_Loaded(_boxed(backward)),
        **entry.fields)
    compiled = result.wrap_post_compile(list(example_inputs), entry.fields["sanitized_aot_config"], {})

    def forward_call(*args: Any) -> Any:
        return compiled(list(args))

    forward_call.zero_grad = gm.zero_grad  # type: ignore[attr-defined]
    forward_call.named_parameters = gm.named_parameters  # type: ignore[attr-defined]
    forward_call.named_buffers = gm.named_buffers  # type: ignore[attr-defined]
    return forward_call


__all__ = ["Entry", "Recorder", "refusal", "key", "wrap", "FORMAT"]
