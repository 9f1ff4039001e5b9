"""Plugin discovery and the device registry: which backend serves each device type
(``coil.plugins`` re-exports it; a plugin's own tests look the registry up here).

Plugins come from the ``coil.plugins`` entry-point group (loaded one by one, so a broken
plugin is reported by name and the rest still load; that includes a plugin that calls
``sys.exit`` while importing) and from :func:`register_backend_for_device` at run time.
``COIL_NO_AUTOLOAD=1`` turns entry-point loading off, Coil's own plugins included (a device
left without a backend says so); ``COIL_BLOCK_PLUGINS=a,b`` skips plugins by name.

Entry points load in name order; when two serve the same device type the later one wins. That
replacement is recorded (``Registry.replaced``), shown by ``coil doctor`` and logged once, at
the device's first use. A run-time registration replaces silently: the caller asked for it."""
from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs, knobs
from .errors import NoBackendError, PluginError
from .hookspecs import hookimpl
from .versions import API_VERSION, compatibility

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
    #: Matrix-product templates (``coil_templates`` hook), in load order.
    templates: list[Any] = field(default_factory=list)
    #: Whether entry-point plugins were loaded (False under ``COIL_NO_AUTOLOAD=1``).
    autoload: bool = True
    #: Plugin names skipped by ``COIL_BLOCK_PLUGINS``.
    blocked: list[str] = field(default_factory=list)
    #: Device type -> name of the plugin whose backend serves it.
    providers: dict[str, str] = field(default_factory=dict)
    #: Device type -> entry-point plugins whose backend for it a later plugin replaced.
    replaced: dict[str, list[str]] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set, repr=False)

    def backend_for(self, device_type: str) -> Any:
        backend = self.backends.get(device_type)
        if backend is None:
            raise self._no_backend(device_type)
        if device_type in self.replaced and device_type not in self._warned:
            self._warned.add(device_type)
            log.warning("%s", self.replacement_note(device_type))
        return backend

    def api_version(self, device_type: str) -> str | None:
        """The SDK version declared by the plugin whose backend serves ``device_type``."""
        provider = self.providers.get(device_type)
        return next((p.api_version for p in self.plugins if p.name == provider), None)

    def replacement_note(self, device_type: str) -> str:
        """What replaced what for ``device_type``, and how to get the replaced backend back."""
        winner, losers = self.providers[device_type], self.replaced[device_type]
        return (f"device {device_type!r} is served by plugin {winner!r}, which replaces the "
                f"backend of {', '.join(map(repr, losers))} (entry points load in name order "
                f"and the later one wins); set COIL_BLOCK_PLUGINS={winner} to use "
                f"{losers[-1]!r} instead")

    def _no_backend(self, device_type: str) -> NoBackendError:
        err = NoBackendError(device_type, list(self.backends))
        hints = []
        if not self.autoload:
            hints.append("COIL_NO_AUTOLOAD is set, so no entry-point plugin was loaded, Coil's "
                         "own included: unset it, or skip single plugins with "
                         "COIL_BLOCK_PLUGINS=name.")
        if self.blocked:
            hints.append(f"COIL_BLOCK_PLUGINS skipped: {', '.join(self.blocked)}.")
        if self.errors:
            hints.append("Plugins that failed to load (`coil doctor` shows why): "
                         f"{', '.join(e.plugin for e in self.errors)}.")
        if hints:  # the message is the exception's only argument
            err.args = (" ".join([str(err), *hints]),)
        return err


_lock = threading.Lock()
_registry: Registry | None = None


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("coil")
    pm.add_hookspecs(hookspecs)
    return pm


def _check_api(name: str, declared: str) -> None:
    """Refuse a plugin whose declared API version this Coil cannot serve; the reason names
    both versions and what changed between them (policy: :mod:`coil.sdk.versions`)."""
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
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # pluggy validation errors
        raise PluginError(info.name, f"invalid hook implementation: {_describe(exc)}") from exc
    try:
        info.api_version = _call(pm, "coil_api_version", info.name) or ""
        _check_api(info.name, info.api_version)
        backends = _call(pm, "coil_device_backends", info.name) or []
        for b in backends:
            if not getattr(b, "device_type", ""):
                raise PluginError(info.name, f"backend {b!r} has no device_type")
        lowerings = _call(pm, "coil_lowerings", info.name) or []
        passes = _call(pm, "coil_graph_passes", info.name) or []
        templates = _call(pm, "coil_templates", info.name) or []
        for t in templates:
            if not getattr(t, "dialect", "") or not getattr(t, "name", ""):
                raise PluginError(info.name, f"template {t!r} has no name or no dialect")
    except PluginError:
        pm.unregister(name=info.name)
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a plugin must not end the user's process
        pm.unregister(name=info.name)
        raise PluginError(info.name, _describe(exc)) from exc
    for b in backends:
        _serve(reg, b, info)
    reg.lowerings.extend(lowerings)
    reg.graph_passes.extend(passes)
    reg.templates.extend(templates)
    reg.plugins.append(info)


def _serve(reg: Registry, backend: Any, info: PluginInfo) -> None:
    """Make ``backend`` serve its device, noting an entry-point plugin it replaces."""
    device_type = backend.device_type
    previous = reg.providers.get(device_type)
    if info.source != "entry point":
        reg.replaced.pop(device_type, None)  # asked for explicitly: nothing silent to report
    elif previous is not None and previous != info.name:
        reg.replaced.setdefault(device_type, []).append(previous)
    reg.backends[device_type] = backend
    reg.providers[device_type] = info.name


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return (f"called sys.exit({exc.code!r}); Coil skipped the plugin instead of ending "
                f"the process")
    return f"{type(exc).__name__}: {exc}"


def _call(pm: pluggy.PluginManager, hook: str, plugin_name: str) -> Any:
    """Call one plugin's implementation of a hook (None if it has none)."""
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if impl.plugin_name == plugin_name:
            return impl.function()
    return None


def _load_entry_points(reg: Registry) -> None:
    if knobs.env_flag("COIL_NO_AUTOLOAD"):
        reg.autoload = False
        log.info("COIL_NO_AUTOLOAD is set: no entry-point plugin is loaded")
        return
    blocked = {b.strip() for b in os.environ.get("COIL_BLOCK_PLUGINS", "").split(",") if b.strip()}
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in blocked:
            reg.blocked.append(ep.name)
            continue
        dist = getattr(ep, "dist", None)
        info = PluginInfo(ep.name, "entry point", getattr(dist, "version", "") if dist else "")
        try:
            module = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a plugin must not end the user's process
            err = PluginError(ep.name, f"import failed: {_describe(exc)}")
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
        if _registry is not None:
            return _registry
        reg = Registry(_new_manager())
        _load_entry_points(reg)
        _registry = reg
    # with the loaded plugins' options known, so a misspelt one is reported with the right name
    knobs.warn_unknown_variables(reg.backends.values())
    return reg


def reset() -> None:
    """Forget all plugins (tests use this); the next :func:`registry` call loads them again."""
    global _registry
    with _lock:
        _registry = None


def register_backend_for_device(device_type: str, backend: Any, *, name: str | None = None) -> None:
    """Serve ``device_type`` with ``backend`` (a ``coil.sdk.DeviceBackend``) in this process,
    overriding any plugin. Validated like an installed plugin."""
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


__all__ = ["ENTRY_POINT_GROUP", "PluginInfo", "Registry", "registry", "reset", "register_backend_for_device"]
