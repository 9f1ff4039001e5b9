"""Routing a backend to the device under test: ``--coil-backend=module:factory`` calls the
factory and registers what it returns with ``coil.register_backend_for_device`` for the run,
and puts the registry back as it was afterwards (so an in-process run leaves no trace)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from coil.sdk import registry
from coil.sdk.errors import CoilError


class BackendSpecError(CoilError):
    """A ``module:factory`` spec that cannot be loaded or gives no backend."""

    def __init__(self, spec: str, reason: str) -> None:
        self.spec = spec
        self.reason = reason
        super().__init__(f"--coil-backend={spec}: {reason}")


def load_factory(spec: str) -> Any:
    """The callable named by ``"package.module:factory"`` (a class is a factory too)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BackendSpecError(spec, "expected module:factory, e.g. my_plugin.backend:MyBackend")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendSpecError(spec, f"cannot import {module_name}: {exc}") from exc
    try:
        target: Any = module
        for part in attr.split("."):
            target = getattr(target, part)
    except AttributeError:
        raise BackendSpecError(spec, f"{module_name} has no attribute {attr!r}") from None
    if not callable(target):
        raise BackendSpecError(spec, f"{attr} is not callable")
    return target


@dataclass
class Routing:
    """A registration made for the run; :meth:`undo` restores the previous backend."""

    device_type: str
    plugin_name: str
    previous: Any

    def undo(self) -> None:
        reg = registry.registry()
        if reg.manager.has_plugin(self.plugin_name):
            reg.manager.unregister(name=self.plugin_name)
        reg.plugins = [p for p in reg.plugins if p.name != self.plugin_name]
        if self.previous is None:
            reg.backends.pop(self.device_type, None)
        else:
            reg.backends[self.device_type] = self.previous


def route(device_type: str, spec: str) -> Routing:
    """Serve ``device_type`` with ``factory()`` from ``spec`` for this run."""
    factory = load_factory(spec)
    try:
        backend = factory()
    except Exception as exc:
        raise BackendSpecError(spec, f"the factory raised {type(exc).__name__}: {exc}") from exc
    if not hasattr(backend, "compile") or not hasattr(backend, "call_line"):
        raise BackendSpecError(spec, f"the factory returned {backend!r}, not a coil.sdk.DeviceBackend")
    previous = registry.registry().backends.get(device_type)
    name = f"conformance:{spec}"
    registry.register_backend_for_device(device_type, backend, name=name)
    return Routing(device_type, name, previous)
