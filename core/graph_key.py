"""The key of Coil's graph cache (:mod:`coil.graph_cache`): everything a compile depends on,
each part spelled canonically and hashed.

A hit skips the graph passes, lowering, scheduling, memory planning and the backends'
codegen, so the key covers every input of those steps:

* ``graph``: the ATen graph as AOTAutograd gave it (before Coil's graph passes): each node's
  opcode, target, arguments (other nodes by position), keyword arguments and the ``val``
  meta (dtype, sizes with symbols by name, strides, storage offset, device); ``get_attr``
  tensors by a hash of their contents;
* ``inputs``: the example inputs (dtype, sizes or symbols, strides, storage offset, device,
  requires_grad) and ``symbols``: the value range the shape environment gives each symbol;
* ``kind`` (forward, backward, inference), ``donated``: the backward's inputs whose memory
  it may take over (:mod:`coil.donation`), and ``config``: every knob of :class:`Config`
  except those that only say where files go or how progress shows (:data:`NOT_IN_KEY`);
* ``plugins`` (name, version, declared API), ``backends`` (for each device the graph uses:
  backend class, provider, ``options_key()``, ``capabilities.cache_key()``,
  ``target_key()``), ``templates`` and the modules of lowerings and graph passes;
* ``versions`` (torch, triton, sympy, Python, machine) and ``source``: a digest of the
  ``.py``/``.h`` files of Coil, ``coil.sdk`` and every package a plugin, backend, template,
  lowering or graph pass comes from, so any code change misses.

A graph whose canonical form cannot be written (a local function as a target, an argument
of an unknown type, a submodule call) raises :class:`Uncacheable` with the reason."""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import inspect
import os
import platform
import sys
from typing import Any, Iterable, Sequence

import sympy
import torch

from .config import Config

#: Enters every key; raise it when what an entry holds or means changes.
FORMAT = "coil-graph-cache-2"

#: Knobs that change where files go or what is shown, never what a compile produces.
NOT_IN_KEY = frozenset({"cache_dir", "debug_dir", "cache_max_bytes", "progress", "graph_cache",
                        "remote_cache", "environ"})

#: Top-level packages never hashed into ``source`` (their versions are in ``versions``).
_VERSIONED = frozenset({"torch", "triton", "sympy", "pluggy", "numpy", "cffi"})


class Uncacheable(Exception):
    """The graph cannot be keyed (or stored) safely; the argument says why."""


@dataclasses.dataclass(frozen=True)
class GraphKey:
    """``digest`` names the entry; ``parts`` maps each component to its own digest (tests
    and ``coil.explain`` say which one changed); ``environment`` holds the readable
    versions and machine parts, compared one by one when artifacts are loaded."""

    digest: str
    parts: dict[str, str]
    environment: dict[str, str]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ----------------------------------------------------------------------------- values


def _sym(x: Any) -> str:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym({x.node.expr})"
    if isinstance(x, sympy.Basic):
        return f"sym({x})"
    return repr(x)


def _tensor_meta(t: torch.Tensor) -> str:
    sizes = ",".join(_sym(s) for s in t.size())
    strides = ",".join(_sym(s) for s in t.stride())
    return (f"T({t.dtype},[{sizes}],[{strides}],{_sym(t.storage_offset())},{t.device},"
            f"grad={t.requires_grad})")


def _content(t: torch.Tensor) -> str:
    """A tensor's metadata and a hash of its bytes (a constant baked into the graph)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes as unset_fake_temporarily
    if isinstance(t, FakeTensor):
        raise Uncacheable("a constant with no value (a fake tensor)")
    with unset_fake_temporarily():  # AOTAutograd calls Coil inside its fake mode
        data = t.detach().cpu().contiguous().reshape(-1)
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return f"{_tensor_meta(t)}#{digest.hexdigest()[:32]}"


def _meta(v: Any) -> str:
    """A node's ``val`` meta (a fake tensor, a tuple of them, a SymInt, a number)."""
    if isinstance(v, torch.Tensor):
        return _tensor_meta(v)
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(_meta(x) for x in v) + ")"
    if v is None or isinstance(v, (bool, int, float, str, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _sym(v)
    return type(v).__qualname__


def _callable(fn: Any) -> str:
    """An importable name for a node target or a module-level function."""
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(fn)
    if isinstance(fn, torch._ops.HigherOrderOperator):
        return f"hop.{fn.name()}"
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module and qualname and "<" in qualname:  # made by a factory (F.max_pool2d): its public name
        found = sys.modules.get(module)
        qualname = next((name for name, value in vars(found).items() if value is fn), None) if found else None
    if not module or not qualname or "<" in qualname:
        raise Uncacheable(f"target {fn!r} has no importable name")
    return f"{module}.{qualname}"


def _arg(a: Any, index: dict[Any, int]) -> str:
    if isinstance(a, torch.fx.Node):
        return f"%{index[a]}"
    if isinstance(a, (list, tuple)):
        inner = ",".join(_arg(x, index) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner})"
    if isinstance(a, dict):
        return "{" + ",".join(f"{k!r}:{_arg(v, index)}" for k, v in a.items()) + "}"
    if a is None or isinstance(a, (bool, int, float, str, complex)):
        return f"{type(a).__name__}:{a!r}"
    if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return f"{type(a).__name__}:{a}"
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool, sympy.Basic)):
        return _sym(a)
    if isinstance(a, slice):
        return f"slice({_arg(a.start, index)},{_arg(a.stop, index)},{_arg(a.step, index)})"
    if isinstance(a, enum.Enum):
        return f"{type(a).__qualname__}.{a.name}"
    if isinstance(a, torch.Tensor):
        return _content(a)
    if a is Ellipsis:
        return "..."
    raise Uncacheable(f"argument of type {type(a).__qualname__} has no canonical form")


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The graph, one canonical line per node (names replaced by positions)."""
    index: dict[Any, int] = {}
    lines = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "call_function":
            target = _callable(node.target)
        elif node.op == "get_attr":
            target = f"{node.target}={_attribute(gm, node.target)}"
        elif node.op in ("placeholder", "output", "call_method"):
            target = str(node.target)
        else:
            raise Uncacheable(f"{node.op} node {node.name} (a submodule call)")
        # the op a node was decomposed from, which the lowering reads (a var_mean of a layer
        # norm keeps float32 statistics, one called as such float64: two graphs alike but for
        # it shared an entry, a hunt)
        origin = node.meta.get("original_aten")
        lines.append(f"{i} {node.op} {target} {_arg(node.args, index)} {_arg(node.kwargs, index)}"
                     f" :: {_meta(node.meta.get('val'))}" + (f" from {origin}" if origin is not None else ""))
    return "\n".join(lines)


def _attribute(gm: torch.fx.GraphModule, target: str) -> str:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    if isinstance(value, torch.fx.GraphModule):
        return "graph{" + graph_text(value) + "}"
    if isinstance(value, torch.Tensor):
        return _content(value)
    raise Uncacheable(f"attribute {target} of type {type(value).__qualname__}")


def inputs_text(example_inputs: Sequence[Any]) -> str:
    out = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            out.append(_tensor_meta(x))
        elif x is None or isinstance(x, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
            out.append(_sym(x))
        else:
            raise Uncacheable(f"example input of type {type(x).__qualname__}")
    return "\n".join(out)


def symbols_text(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """Each size symbol with the value range the shape environment gives it."""
    from torch._guards import detect_fake_mode
    fake_mode = detect_fake_mode(example_inputs)
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return ""
    ranges = getattr(shape_env, "var_to_range", {})
    return "\n".join(f"{sym}: {ranges.get(sym)}" for sym in sorted(ranges, key=str))


# ----------------------------------------------------------------------------- the environment


def config_text(config: Config) -> str:
    parts = []
    for f in dataclasses.fields(config):
        if f.name in NOT_IN_KEY:
            continue
        value = getattr(config, f.name)
        if isinstance(value, dict):
            value = sorted((k, repr(v)) for k, v in value.items())
        parts.append(f"{f.name}={value!r}")
    return "\n".join(parts)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=None)
def versions() -> dict[str, str]:
    """The versions of what Coil's generated code depends on, and the machine."""
    return {"torch": torch.__version__, "triton": _version("triton"), "sympy": sympy.__version__,
            "python": sys.version.split()[0], "machine": platform.machine()}


def devices_of(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """Device types the graph's values and inputs live on."""
    found: set[str] = set()

    def visit(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            found.add(v.device.type)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    visit(list(example_inputs))
    for node in gm.graph.nodes:
        visit(node.meta.get("val", node.meta.get("example_value")))  # an ATen graph's, Dynamo's
        for a in (*node.args, *node.kwargs.values()):
            if isinstance(a, torch.device):
                found.add(a.type)
    return sorted(found)


def backend_text(reg: Any, device_type: str) -> str:
    b = reg.backends.get(device_type)
    if b is None:
        return f"{device_type}: no backend"
    cls = type(b)
    return (f"{device_type}: {b.name} {cls.__module__}.{cls.__qualname__} "
            f"provider={reg.providers.get(device_type, '')} options={b.options_key()} "
            f"capabilities={b.capabilities.cache_key()} target={_target_key(b)}")


def _target_key(backend: Any) -> str:
    fn = getattr(backend, "target_key", None)
    return fn() if fn is not None else ""


def environment(reg: Any, device_types: Iterable[str]) -> dict[str, str]:
    """The readable parts that differ between machines and installations."""
    env = dict(versions())
    env["coil source"] = source_digest(reg)
    for dev in device_types:
        b = reg.backends.get(dev)
        env[f"{dev} backend"] = f"{b.name if b is not None else None}"
        env[f"{dev} target"] = _target_key(b) if b is not None else ""
    return env


def _plugins_text(reg: Any) -> str:
    lines = [f"{p.name} {p.source} version={p.version} api={p.api_version}" for p in reg.plugins]
    for t in reg.templates:
        lines.append(f"template {t.name} {t.dialect} {_owner(t)} version={_package_version(t)}")
    for op, fn, device_type in reg.lowerings:
        lines.append(f"lowering {op} {device_type} {_where(fn)}")
    for p in reg.graph_passes:
        lines.append(f"graph pass {_where(p)}")
    return "\n".join(lines)


def _where(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _owner(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _package_version(obj: Any) -> str:
    top = sys.modules.get(type(obj).__module__.split(".")[0])
    return str(getattr(top, "__version__", ""))


# ----------------------------------------------------------------------------- source digest


def _modules_of(reg: Any) -> set[str]:
    """Top-level modules whose code takes part in a compile: Coil, its SDK and everything
    the registry holds (plugins, backend classes with their bases, templates, lowerings,
    graph passes)."""
    names = {"coil", "coil.sdk"}
    objects: list[Any] = [p for p in reg.manager.get_plugins()]
    for b in reg.backends.values():
        objects += [c for c in type(b).__mro__ if c is not object]
    objects += [type(t) for t in reg.templates]
    objects += [fn for _, fn, _ in reg.lowerings] + list(reg.graph_passes)
    for obj in objects:
        module = obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
        if not module and not inspect.isclass(obj):
            module = type(obj).__module__
        if not module:
            continue
        top = module.split(".")[0]
        if module == "coil.sdk" or module.startswith("coil.sdk."):
            names.add("coil.sdk")
        elif top not in _VERSIONED and top not in sys.stdlib_module_names and top != "builtins":
            names.add(top)
    return names


@functools.lru_cache(maxsize=None)
def _files_digest(paths: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for root in paths:
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(folder, name) for folder, dirs, names in os.walk(root)
            if "__pycache__" not in folder for name in names if name.endswith((".py", ".h", ".tmpl")))
        for path in files:
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _paths(module_name: str) -> tuple[str, ...]:
    module = sys.modules.get(module_name)
    if module is None:
        return ()
    if hasattr(module, "__path__"):  # a package: every file under it
        return tuple(sorted(module.__path__))
    return (module.__file__,) if getattr(module, "__file__", None) else ()


def source_digest(reg: Any) -> str:
    """A digest of the source files of Coil, its SDK and every package the registry's
    plugins come from (computed once per folder and process)."""
    return _sha("\n".join(f"{name}:{_files_digest(_paths(name))}" for name in sorted(_modules_of(reg))))


# ----------------------------------------------------------------------------- the key


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Config, kind: str,
              reg: Any, donated: Sequence[int] = (), extra: dict[str, str] | None = None) -> GraphKey:
    """The key of compiling ``gm`` as ``kind`` under ``config`` with the plugins of ``reg``,
    its inputs at ``donated`` free to be taken over (:mod:`coil.donation`), with ``extra``
    parts of a caller's own (:mod:`coil.aot_cache`: the global state AOTAutograd reads);
    :class:`Uncacheable` when the graph has no canonical form."""
    devices = devices_of(gm, example_inputs)
    parts = {
        "format": FORMAT,
        "graph": graph_text(gm),
        "inputs": inputs_text(example_inputs),
        "symbols": symbols_text(gm, example_inputs),
        "kind": kind,
        "donated": ",".join(str(i) for i in donated),
        "config": config_text(config),
        "plugins": _plugins_text(reg),
        "backends": "\n".join(backend_text(reg, d) for d in devices),
        "versions": repr(sorted(versions().items())),
        "source": source_digest(reg),
        **(extra or {}),
    }
    hashed = {name: _sha(text) for name, text in parts.items()}
    digest = _sha("\n".join(f"{name}={h}" for name, h in hashed.items()))
    return GraphKey(digest, hashed, environment(reg, devices))


__all__ = ["GraphKey", "Uncacheable", "graph_key", "graph_text", "environment", "NOT_IN_KEY", "FORMAT"]
