"""Coil's graph cache: a compiled graph kept on disk so that a later process loads it
without lowering, scheduling, memory planning or codegen.

``compile_graph`` asks for the graph's key (:mod:`coil.graph_key`) before its graph passes
run. On a hit (:func:`load`) each device's module comes back through its backend's
``import_module``, the wrapper's Python source is executed in a namespace rebuilt from its
recorded constants, and the graph's report is the recorded one marked ``cached``. On a miss
the graph compiles as before and :func:`store` writes the entry: the wrapper source, its
namespace constants (dtypes, devices, ATen ops by name, tensors by value), each device's
``export_module`` bytes, and the report's fields.

Entries live in the ``graphs`` namespace of :class:`coil.sdk.DiskCache` (checked before use,
written atomically, LRU-evicted with the rest); an entry that fails its check is quarantined
and the graph compiles again. Entries are pickles holding Python source that runs and
shared libraries that load: like the libraries the CPU plugin caches, they are trusted as
code (load artifacts only from where you would take code).

Not cached, with the reason at debug level: the ``graph_cache`` knob off, self-check mode,
graph capture, a graph with no canonical form (:class:`coil.graph_key.Uncacheable`), a
wrapper constant of an unknown kind, a backend whose ``export_module`` returns None."""
from __future__ import annotations

import logging
import math
import pickle
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import _disable_current_modes as _no_modes

from . import wrapper as wrapper_mod
from .config import Config
from .graph_key import FORMAT, GraphKey, Uncacheable, graph_key
from .graph_report import GraphReport, KernelReport
from .sdk.diskcache import DiskCache

log = logging.getLogger(__name__)

NAMESPACE = "graphs"
SUFFIX = ".graph"

#: Names every wrapper's namespace starts with (``WrapperWriter``), restored by name.
_WRAPPER_GLOBALS: dict[str, Any] = {
    "torch": torch, "math": math, "empty_strided": torch.empty_strided, "reinterpret": wrapper_mod.reinterpret,
    "restride": wrapper_mod.restride, "allocator": wrapper_mod.allocator}


@dataclass(frozen=True)
class Ticket:
    """A graph's key with what its compile may add to the shape environment: the guards
    Coil's lowering adds (a size it specialises on) are kept with the entry, checked against
    the sizes of a later graph and installed again on a hit, so Dynamo guards the loaded code
    as it guarded the compiled one."""

    key: GraphKey
    shape_env: Any
    guards_before: int

    def new_guards(self) -> list[Any]:
        return [g.expr for g in self.shape_env.guards[self.guards_before:]] if self.shape_env else []


@dataclass(frozen=True)
class KernelName:
    """What ``kernel_choice`` gets on a hit: the kernel by its name (a ``coil.sdk.backend.KernelRef``)."""

    name: str


def _store() -> DiskCache:
    return DiskCache.in_namespace(NAMESPACE, fanout=True, layer="graph")


def key_for(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config, kind: str,
            reg: Any, donated: tuple[int, ...] = ()) -> Ticket | None:
    """The graph's key, or None when it is not to be cached (the log says why); ``donated``:
    the inputs whose memory the graph may take over (:mod:`coil.donation`)."""
    reason = ("the graph_cache knob is off" if not config.graph_cache else
              "self-check mode" if config.check else None)
    if reason is None:
        try:
            key = graph_key(gm, example_inputs, config, kind, reg, donated)
        except Uncacheable as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - the cache never fails a compile
            reason = f"no key ({type(exc).__name__}: {exc})"
        else:
            from torch._guards import detect_fake_mode
            shape_env = getattr(detect_fake_mode(example_inputs), "shape_env", None)
            return Ticket(key, shape_env, len(shape_env.guards) if shape_env is not None else 0)
    log.debug("graph cache: %s graph not cached: %s", kind, reason)
    return None


# ----------------------------------------------------------------------------- namespace constants


def _op_names(steps: Sequence[Any]) -> dict[int, str]:
    """id of each ATen op (and of its bound C++ callable) the steps call -> its name."""
    out = {}
    for step in steps:
        op = getattr(step, "op", None)
        if isinstance(op, torch._ops.OpOverload):
            out[id(op)] = op.name()
            out[id(op._op)] = op.name() + "#bound"
    return out


def _encode(value: Any, ops: dict[int, str]) -> tuple[str, Any]:
    if isinstance(value, torch.dtype):
        return "dtype", str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return "device", str(value)
    if isinstance(value, (torch.layout, torch.memory_format)):
        return "torch", str(value).removeprefix("torch.")
    if id(value) in ops:
        return "op", ops[id(value)]
    if isinstance(value, torch.Tensor):
        return "tensor", _tensor_bytes(value)
    if _plain(value):
        return "value", value
    if getattr(value, "coil_cacheable", False):  # a library call of the core's own (coil.conv_matmul)
        return "pickled", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    raise Uncacheable(f"a wrapper constant of type {type(value).__qualname__}")


def _tensor_bytes(t: torch.Tensor) -> tuple[str, tuple[int, ...], tuple[int, ...], str, bytes]:
    """A constant tensor's layout and bytes. Not ``torch.save``: ``torch.load`` inside
    AOTAutograd's tracing context makes fake tensors."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
    if t.requires_grad or not is_non_overlapping_and_dense(t):
        raise Uncacheable("a constant tensor that requires grad, or overlaps or has gaps")
    with _no_modes():  # AOTAutograd calls Coil inside its fake mode
        flat = t.detach().cpu().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return (str(t.dtype).removeprefix("torch."), tuple(t.size()), tuple(t.stride()), str(t.device), data)


def _tensor_from(dtype: str, size: tuple[int, ...], stride: tuple[int, ...], device: str,
                 data: bytes) -> torch.Tensor:
    with _no_modes():
        out = torch.empty_strided(size, stride, dtype=getattr(torch, dtype), device=device)
        if data:
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(out.dtype)
            out.copy_(flat.view(size))
    return out


def _plain(v: Any) -> bool:
    if v is None or v is Ellipsis or isinstance(v, (bool, int, float, complex, str, bytes)):
        return True
    if isinstance(v, (tuple, list, frozenset, set)):
        return all(_plain(x) for x in v)
    if isinstance(v, slice):
        return _plain((v.start, v.stop, v.step))
    return False


def _decode(kind: str, data: Any) -> Any:
    if kind == "dtype":
        return getattr(torch, data)
    if kind == "device":
        return torch.device(data)
    if kind == "torch":
        return getattr(torch, data)
    if kind == "op":
        name, bound = data.removesuffix("#bound"), data.endswith("#bound")
        namespace, rest = name.split("::")
        op_name, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")
        return op._op if bound else op
    if kind == "tensor":
        return _tensor_from(*data)
    if kind == "value":
        return data
    if kind == "pickled":
        return pickle.loads(data)
    raise ValueError(f"unknown constant kind {kind!r}")


def _namespace(ns: dict[str, Any], steps: Sequence[Any]) -> dict[str, tuple[str, Any]]:
    ops = _op_names(steps)
    out = {}
    for name, value in ns.items():
        if name in ("__builtins__", "call") or name.startswith("mod_"):
            continue
        if name in _WRAPPER_GLOBALS and _WRAPPER_GLOBALS[name] is value:
            out[name] = ("global", name)
        else:
            out[name] = _encode(value, ops)
    return out


# ----------------------------------------------------------------------------- store and load


def store(ticket: Ticket, report: Any, wrapper: Any, steps: Sequence[Any],
          modules: dict[str, tuple[Any, Any]]) -> None:
    """Write the entry of a graph just compiled (``report``: its ``GraphReport``;
    ``wrapper``: its ``Wrapper``; ``modules``: device type -> (backend, compiled module));
    nothing when a part cannot be kept (logged at debug level)."""
    key = ticket.key
    try:
        exported = {}
        for device_type, (backend, module) in modules.items():
            data = backend.export_module(module)
            if data is None:
                raise Uncacheable(f"backend {backend.name} exports no module")
            exported[device_type] = (backend.name, data)
        entry = {
            "format": FORMAT, "key": key.digest, "environment": key.environment,
            "kind": report.kind, "wrapper": wrapper.source, "namespace": _namespace(wrapper.namespace, steps),
            "modules": exported, "report": _report_fields(report), "guards": ticket.new_guards()}
        payload = pickle.dumps(_variants(key, entry), protocol=pickle.HIGHEST_PROTOCOL)
    except Uncacheable as exc:
        log.debug("graph cache: %s not cached: %s", report.name, exc)
        return
    except Exception as exc:  # noqa: BLE001 - the cache never fails a compile
        log.debug("graph cache: %s not cached (%s: %s)", report.name, type(exc).__name__, exc)
        return
    try:
        _store().write(key.digest, SUFFIX, payload)
    except OSError as exc:  # a full or read-only cache folder
        log.warning("coil: could not write graph cache entry for %s: %s", report.name, exc)


def _report_fields(report: Any) -> dict[str, Any]:
    return {
        "kernels": [(k.name, k.device, k.source, tuple(k.ops), k.num_nodes, k.template) for k in report.kernels],
        "fallbacks": list(report.fallbacks), "peak_bytes": report.peak_bytes,
        "decisions": list(report.decisions), "num_inputs": report.num_inputs,
        "symbolic": report.symbolic, "reused": report.reused, "inplace": report.inplace,
        "output_strides": report.output_strides}


def load(ticket: Ticket, reg: Any, kind: str, name: Callable[[], str]) -> tuple[Callable, Any, dict] | None:
    """On a hit: the graph's callable, its report (``cached``) and its modules (device type
    -> (backend, module)); None on a miss or an unusable entry (compiled again)."""
    t0 = time.perf_counter()
    key = ticket.key
    payload = _store().read(key.digest, SUFFIX)
    if payload is None:
        return None
    try:
        variants = pickle.loads(payload)
        if not isinstance(variants, list) or any(v.get("format") != FORMAT or v.get("key") != key.digest
                                                 for v in variants):
            raise ValueError("an entry of another format or key")
        entry = next((v for v in variants if _guards_hold(ticket, v["guards"])), None)
        if entry is None:
            log.debug("graph cache: entry %s was compiled for other sizes", key.digest[:16])
            return None
        graph_name = name()
        modules = {}
        for device_type, (backend_name, data) in entry["modules"].items():
            backend = reg.backend_for(device_type)
            if backend.name != backend_name:
                raise ValueError(f"made by backend {backend_name}, {device_type} is served by {backend.name}")
            module = backend.import_module(data, graph_name)
            if module is None:
                raise ValueError(f"backend {backend.name} could not import its module")
            modules[device_type] = (backend, module)
        ns = {n: _WRAPPER_GLOBALS[d] if k == "global" else _decode(k, d) for n, (k, d) in entry["namespace"].items()}
        for device_type, (_, module) in modules.items():
            ns[f"mod_{device_type}"] = module
        t1 = time.perf_counter()
        fn = wrapper_mod.Wrapper(entry["wrapper"], ns).build()
    except Exception as exc:  # noqa: BLE001 - any unusable entry means: compile it again
        log.warning("coil: graph cache entry %s could not be used (%s: %s); compiling the graph",
                    key.digest[:16], type(exc).__name__, exc)
        return None
    seconds = {"lower": 0.0, "schedule": 0.0, "codegen+compile": 0.0,
               "wrapper": time.perf_counter() - t1, "graph cache": t1 - t0}
    return fn, _report(entry, graph_name, kind, seconds, modules), modules


#: Most variants (compiles of one key specialised on different sizes) an entry keeps.
MAX_VARIANTS = 8


def _variants(key: GraphKey, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The entry's variants with ``entry`` added: one key compiled under different size
    guards (sizes the compile specialised on) keeps one variant per guard set, newest first."""
    try:
        old = pickle.loads(_store().read(key.digest, SUFFIX, remote=False, count=False) or pickle.dumps([]))
    except Exception:  # noqa: BLE001 - an unreadable entry is replaced
        old = []
    if not isinstance(old, list):
        old = []
    kept = [v for v in old if isinstance(v, dict) and v.get("format") == FORMAT and v.get("guards") != entry["guards"]]
    return [entry, *kept][:MAX_VARIANTS]


def _guards_hold(ticket: Ticket, guards: list[Any]) -> bool:
    """Whether the size guards the entry's compile added hold for this graph's sizes; if so
    they are installed in its shape environment (Dynamo then guards the loaded code)."""
    if not guards:
        return True
    env = ticket.shape_env
    if env is None:
        return False
    hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
    if not all(bool(g.xreplace(hints)) for g in guards):
        return False
    for g in guards:
        env.evaluate_expr(g)
    return True


def _report(entry: dict[str, Any], graph_name: str, kind: str, seconds: dict[str, float],
            modules: dict[str, tuple[Any, Any]]) -> GraphReport:
    fields = entry["report"]
    kernels = []
    for kname, device, source, ops, num_nodes, template in fields["kernels"]:
        backend, module = modules.get(device, (None, None))
        choice = getattr(backend, "kernel_choice", None)
        chosen = (lambda c=choice, m=module, n=kname: c(m, KernelName(n))) if choice else None
        kernels.append(KernelReport(kname, device, source, ops, num_nodes, template, chosen))
    return GraphReport(graph_name, kind, kernels, fields["fallbacks"], fields["peak_bytes"], seconds,
                       fields["decisions"], entry["wrapper"], fields["num_inputs"], fields["symbolic"],
                       fields["reused"], fields["inplace"], cached=True,
                       output_strides=fields.get("output_strides"))


__all__ = ["key_for", "load", "store", "KernelName", "Ticket", "NAMESPACE", "SUFFIX", "MAX_VARIANTS"]
