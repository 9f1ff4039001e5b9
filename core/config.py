"""Coil's typed configuration: a few documented knobs, each overridable by an environment
variable (``COIL_<NAME>``), by ``torch.compile(..., options={...})`` and by :func:`override`.

Plugins add their own knobs, namespaced by backend name: a ``DeviceBackend`` declares an
``Options`` dataclass, and ``"<backend>.<field>"`` keys (env ``COIL_<BACKEND>_<FIELD>``) set
them; :func:`backend_options` resolves them for the compile in progress (:func:`current`)."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Iterator

from .errors import ConfigError


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "coil")


@dataclasses.dataclass
class Config:
    """Every knob Coil has. The field name, upper-cased and prefixed with ``COIL_``, is its
    environment variable."""

    #: Where every on-disk cache lives (compiled kernels, autotune results).
    cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    #: When set, every compiled graph writes its generated source and fusion decisions here.
    debug_dir: str = ""
    #: Most scheduler nodes one fused kernel may hold.
    max_fusion_size: int = 64
    #: A pointwise value used more than once is computed into a buffer (instead of recomputed
    #: by each user) when it reads more than this many buffers.
    realize_reads_threshold: int = 4
    #: ... or when its body has more than this many operations.
    realize_opcount_threshold: int = 30
    #: Record each compiled graph once and replay it (CUDA graphs, on backends that can);
    #: ``torch.compile(..., mode="reduce-overhead")`` turns it on.
    graph_capture: bool = False
    #: Plugin options set by ``options=`` or :func:`override`: ``"<backend>.<field>"`` -> value.
    plugin_options: dict[str, Any] = dataclasses.field(default_factory=dict, metadata={"knob": False})
    #: ``COIL_*`` environment variables as read with the knobs (plugin options read them too).
    environ: dict[str, str] = dataclasses.field(default_factory=dict, repr=False,
                                                metadata={"knob": False})


_FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.metadata.get("knob", True)}


def _coerce(name: str, value: Any, kind: Any = None, known: list[str] | None = None) -> Any:
    """``value`` (a string from the environment, or any value) as the field's type."""
    kind = _FIELDS[name].type if kind is None else kind
    kinds = {"bool": bool, "int": int, "float": float, "str": str}
    kind = kinds.get(kind, kind) if isinstance(kind, str) else kind
    if kind is bool:
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)
    if kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError):
            noun = "an integer" if kind is int else "a number"
            raise ConfigError(name, known or list(_FIELDS), f"expected {noun}, got {value!r} for") from None
    return str(value) if kind is str else value


def _from_env() -> Config:
    cfg = Config(environ={k: v for k, v in os.environ.items() if k.startswith("COIL_")})
    for name in _FIELDS:
        env = cfg.environ.get(f"COIL_{name.upper()}")
        if env is not None:
            setattr(cfg, name, _coerce(name, env))
    return cfg


_current: Config | None = None


def get() -> Config:
    """The configuration in force (environment variables read once, then overrides applied)."""
    global _current
    if _current is None:
        _current = _from_env()
    return _current


def reload_from_env() -> None:
    """Forget overrides and read the environment again (tests use this)."""
    global _current
    _current = None


def validated(options: dict[str, Any] | None) -> dict[str, Any]:
    """Check ``options`` against the known knobs, and ``"<backend>.<field>"`` keys against the
    ``Options`` of the registered backends; unknown keys raise :class:`ConfigError`."""
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if "." in key:
            out[key] = _plugin_option(key, value)
        elif key not in _FIELDS:
            raise ConfigError(key, list(_FIELDS))
        else:
            out[key] = _coerce(key, value)
    return out


def with_options(cfg: Config, options: dict[str, Any] | None) -> Config:
    """A copy of ``cfg`` with ``options`` (validated) applied; ``cfg`` is left alone."""
    out = dataclasses.replace(cfg, plugin_options=dict(cfg.plugin_options))
    for key, value in validated(options).items():
        if "." in key:
            out.plugin_options[key] = value
        else:
            setattr(out, key, value)
    return out


@contextlib.contextmanager
def override(**options: Any) -> Iterator[Config]:
    """Scoped override: ``with coil.config.override(max_fusion_size=8): ...``; plugin options
    take their namespaced key: ``override(**{"cpu_cpp.openmp": False})``."""
    global _current
    saved = get()
    _current = with_options(saved, options)
    try:
        yield _current
    finally:
        _current = saved


# ----------------------------------------------------------------------------- the compile in progress

_active: contextvars.ContextVar[Config | None] = contextvars.ContextVar("coil_active_config", default=None)


def current() -> Config:
    """The configuration of the compile in progress (with its ``torch.compile`` options), or
    :func:`get` outside a compile. Plugins reach it through ``DeviceBackend.options``."""
    cfg = _active.get()
    return get() if cfg is None else cfg


@contextlib.contextmanager
def active(cfg: Config) -> Iterator[Config]:
    """Make ``cfg`` the configuration of the compile in progress (``compile_graph`` does)."""
    token = _active.set(cfg)
    try:
        yield cfg
    finally:
        _active.reset(token)


# ----------------------------------------------------------------------------- plugin options


def namespace(backend: Any) -> str:
    """The prefix of a backend's option keys: its ``name`` (else its class name)."""
    return backend.name or type(backend).__name__


def env_var(backend_name: str, field_name: str) -> str:
    """``COIL_<BACKEND>_<FIELD>``, upper-cased, other characters as ``_``."""
    return re.sub(r"\W", "_", f"COIL_{backend_name}_{field_name}").upper()


def _option_fields(backend: Any) -> list[dataclasses.Field]:
    cls = getattr(backend, "Options", None)
    if cls is None:
        return []
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"{namespace(backend)}.Options", [],
                          "a backend's Options must be a dataclass (decorate it with "
                          "@dataclasses.dataclass(frozen=True))")
    return [f for f in dataclasses.fields(cls) if f.init]


def _plugin_fields() -> dict[str, dataclasses.Field]:
    """``"<backend>.<field>"`` -> field, for every registered backend that declares Options."""
    from . import plugins
    out: dict[str, dataclasses.Field] = {}
    for backend in plugins.registry().backends.values():
        out.update({f"{namespace(backend)}.{f.name}": f for f in _option_fields(backend)})
    return out


def _plugin_option(key: str, value: Any) -> Any:
    known = _plugin_fields()
    if key in known:
        return _coerce(key, value, known[key].type, list(known))
    prefix = key.split(".")[0] + "."
    same_plugin = [k for k in known if k.startswith(prefix)]
    if same_plugin:
        raise ConfigError(key, same_plugin, f"unknown option of plugin {prefix[:-1]!r}")
    raise ConfigError(key, list(known) + list(_FIELDS), "no registered backend has the option")


def backend_options(backend: Any, cfg: Config | None = None) -> Any:
    """The ``backend.Options`` instance in force for ``cfg`` (default: :func:`current`):
    defaults, then ``COIL_<BACKEND>_<FIELD>`` variables, then ``options=``/:func:`override`
    values. None when the backend declares no Options."""
    fields = _option_fields(backend)
    if not fields:
        return None
    cfg = current() if cfg is None else cfg
    ns = namespace(backend)
    values: dict[str, Any] = {}
    for f in fields:
        key = f"{ns}.{f.name}"
        env = cfg.environ.get(env_var(ns, f.name))
        if key in cfg.plugin_options:
            values[f.name] = cfg.plugin_options[key]
        elif env is not None:
            values[f.name] = _coerce(env_var(ns, f.name), env, f.type, [key])
    return backend.Options(**values)


def options_key(options: Any) -> str:
    """A stable one-line spelling of an Options instance, for cache keys ("" for None)."""
    if options is None:
        return ""
    return ";".join(f"{f.name}={getattr(options, f.name)!r}"
                    for f in sorted(dataclasses.fields(options), key=lambda f: f.name))
