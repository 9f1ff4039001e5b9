"""Plugin discovery and the device registry: which backend serves each device type.

Plugins come from the ``coil.plugins`` entry-point group (loaded one by one, so a broken
plugin is reported by name and the rest still load) and from
:func:`register_backend_for_device` at run time. ``COIL_NO_AUTOLOAD=1`` turns entry-point
loading off; ``COIL_BLOCK_PLUGINS=a,b`` skips plugins by name."""
from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import pluggy

from .errors import NoBackendError, PluginError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "coil.plugins"


@dataclass
class PluginInfo:
    name: str
    source: str  # "entry point" | "runtime"
    version: str = ""
    api_version: str = ""


@dataclass
class Registry:
    """Loaded plugins, the backend of each device type, and every load error."""

    manager: pluggy.PluginManager
    plugins: list[PluginInfo] = field(default_factory=list)
    backends: dict[str, Any] = field(default_factory=dict)
    errors: list[PluginError] = field(default_factory=list)
    lowerings: list[tuple[Any, Any, str | None]] = field(default_factory=list)
    graph_passes: list[Any] = field(default_factory=list)

    def backend_for(self, device_type: str) -> Any:
        backend = self.backends.get(device_type)
        if backend is None:
            raise NoBackendError(device_type, list(self.backends))
        return backend


_lock = threading.Lock()
_registry: Registry | None = None


def _new_manager() -> pluggy.PluginManager:
    from .sdk import hookspecs  # noqa: F401  (coil.sdk.hookspecs)
    pm = pluggy.PluginManager("coil")
    pm.add_hookspecs(hookspecs)
    return pm


def _check_api(name: str, declared: str) -> None:
    """Refuse a plugin whose declared API version this Coil cannot serve; the reason names
    both versions and what changed between them (policy: :mod:`coil.sdk.versions`)."""
    from .sdk.versions import compatibility
    ok, message = compatibility(declared)
    if not ok:
        raise PluginError(name, message)
    if message:
        log.debug("plugin %s: %s", name, message)


def _add_plugin(reg: Registry, module: Any, info: PluginInfo) -> None:
    """Register a plugin module or object with validation; raise PluginError on problems."""
    pm = reg.manager
    try:
        pm.register(module, name=info.name)
    except Exception as exc:  # pluggy validation errors
        raise PluginError(info.name, f"invalid hook implementation: {exc}") from exc
    try:
        info.api_version = _call(pm, "coil_api_version", info.name) or ""
        _check_api(info.name, info.api_version)
        backends = _call(pm, "coil_device_backends", info.name) or []
        for b in backends:
            if not getattr(b, "device_type", ""):
                raise PluginError(info.name, f"backend {b!r} has no device_type")
        lowerings = _call(pm, "coil_lowerings", info.name) or []
        passes = _call(pm, "coil_graph_passes", info.name) or []
    except PluginError:
        pm.unregister(name=info.name)
        raise
    except Exception as exc:
        pm.unregister(name=info.name)
        raise PluginError(info.name, f"{type(exc).__name__}: {exc}") from exc
    for b in backends:
        reg.backends[b.device_type] = b
    reg.lowerings.extend(lowerings)
    reg.graph_passes.extend(passes)
    reg.plugins.append(info)


def _call(pm: pluggy.PluginManager, hook: str, plugin_name: str) -> Any:
    """Call one plugin's implementation of a hook (None if it has none)."""
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if impl.plugin_name == plugin_name:
            return impl.function()
    return None


def _load_entry_points(reg: Registry) -> None:
    if os.environ.get("COIL_NO_AUTOLOAD", "") in ("1", "true", "yes"):
        return
    blocked = {b.strip() for b in os.environ.get("COIL_BLOCK_PLUGINS", "").split(",") if b.strip()}
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in blocked:
            continue
        dist = getattr(ep, "dist", None)
        info = PluginInfo(ep.name, "entry point", getattr(dist, "version", "") if dist else "")
        try:
            module = ep.load()
        except Exception as exc:
            err = PluginError(ep.name, f"import failed: {type(exc).__name__}: {exc}")
            reg.errors.append(err)
            log.warning("%s", err)
            continue
        try:
            _add_plugin(reg, module, info)
        except PluginError as err:
            reg.errors.append(err)
            log.warning("%s", err)


def registry() -> Registry:
    """The process-wide registry, loading entry-point plugins on first use."""
    global _registry
    with _lock:
        if _registry is None:
            reg = Registry(_new_manager())
            _load_entry_points(reg)
            _registry = reg
        return _registry


def reset() -> None:
    """Forget all plugins (tests use this); the next :func:`registry` call loads them again."""
    global _registry
    with _lock:
        _registry = None


def register_backend_for_device(device_type: str, backend: Any, *, name: str | None = None) -> None:
    """Serve ``device_type`` with ``backend`` (a ``coil.sdk.DeviceBackend``) in this process,
    overriding any plugin. Validated like an installed plugin."""
    from .sdk import API_VERSION, hookimpl
    if not getattr(backend, "device_type", None):
        backend.device_type = device_type
    if backend.device_type != device_type:
        raise PluginError(name or type(backend).__name__,
                          f"backend serves {backend.device_type!r}, not {device_type!r}")
    reg = registry()
    plugin_name = name or f"runtime:{device_type}:{type(backend).__name__}"

    class _RuntimePlugin:
        @staticmethod
        @hookimpl
        def coil_api_version() -> str:
            return API_VERSION

        @staticmethod
        @hookimpl
        def coil_device_backends() -> list[Any]:
            return [backend]

    if reg.manager.has_plugin(plugin_name):
        reg.manager.unregister(name=plugin_name)
        reg.plugins = [p for p in reg.plugins if p.name != plugin_name]
    _add_plugin(reg, _RuntimePlugin(), PluginInfo(plugin_name, "runtime", api_version=API_VERSION))
