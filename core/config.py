"""Coil's typed configuration: a few documented knobs, each overridable by an environment
variable (``COIL_<NAME>``), by ``torch.compile(..., options={...})`` and by :func:`override`."""
from __future__ import annotations

import contextlib
import dataclasses
import os
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


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _coerce(name: str, value: Any) -> Any:
    kind = _FIELDS[name].type
    if kind in ("bool", bool):
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)
    if kind in ("int", int):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(name, list(_FIELDS), f"expected an integer, got {value!r} for") from None
    return str(value)


def _from_env() -> Config:
    cfg = Config()
    for name in _FIELDS:
        env = os.environ.get(f"COIL_{name.upper()}")
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
    """Check ``options`` against the known knobs; unknown keys raise :class:`ConfigError`."""
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key not in _FIELDS:
            raise ConfigError(key, list(_FIELDS))
        out[key] = _coerce(key, value)
    return out


@contextlib.contextmanager
def override(**options: Any) -> Iterator[Config]:
    """Scoped override: ``with coil.config.override(max_fusion_size=8): ...``."""
    global _current
    saved = dataclasses.replace(get())
    try:
        for key, value in validated(options).items():
            setattr(get(), key, value)
        yield get()
    finally:
        _current = saved
