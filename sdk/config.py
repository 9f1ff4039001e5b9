"""Coil's typed configuration (``coil.config`` is this module): a few documented knobs, each
overridable by an environment variable (``COIL_<NAME>``), by ``torch.compile(...,
options={...})`` and by :func:`override`; plugins add their own, namespaced by backend name
(``"<backend>.<field>"``, env ``COIL_<BACKEND>_<FIELD>``), declared by a ``DeviceBackend``'s
``Options`` dataclass.

The knobs themselves, how values are read and checked, and the configuration in force live in
:mod:`coil.sdk.knobs` and are re-exported here; this module adds what needs the plugin
registry (:mod:`coil.sdk.registry`, which reads the knobs and so sits between the two): keys
of plugin options checked against the loaded backends' ``Options``, and the ``COIL_*``
variables those options make known."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import knobs
from .knobs import (OTHER_VARIABLES, Config, ConfigValueError, GraphCaptureMode, ProgressMode,
                    TemplateMode, active, backend_options, current, defaults, describe_unknown,
                    env_flag, env_var, from_env, get, knob_variable, namespace, options_key,
                    reload_from_env)
from .registry import registry


def _loaded_backends() -> list[Any]:
    return list(registry().backends.values())


def validated(options: dict[str, Any] | None) -> dict[str, Any]:
    """Check ``options`` against the known knobs, and ``"<backend>.<field>"`` keys against the
    ``Options`` of the registered backends (loading the plugins when there is such a key);
    unknown keys raise :class:`ConfigError`, values a knob cannot take
    :class:`ConfigValueError`."""
    plugin_keys = any("." in key for key in options or {})
    return knobs.checked(options, _loaded_backends() if plugin_keys else ())


def with_options(cfg: Config, options: dict[str, Any] | None) -> Config:
    """A copy of ``cfg`` with ``options`` (validated) applied; ``cfg`` is left alone."""
    return knobs.applied(cfg, validated(options))


@contextlib.contextmanager
def override(**options: Any) -> Iterator[Config]:
    """Scoped override: ``with coil.config.override(max_fusion_size=8): ...``; plugin options
    take their namespaced key: ``override(**{"cpu_cpp.openmp": False})``."""
    with knobs.in_force(with_options(get(), options)) as cfg:
        yield cfg


def known_variables() -> dict[str, str]:
    """Every ``COIL_*`` variable something reads -> what it is: the knobs, the options of the
    registered backends, and :data:`OTHER_VARIABLES`."""
    return knobs.known_variables(_loaded_backends())


def unknown_variables(environ: dict[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``COIL_*`` variables of ``environ`` (default: the process's) that nothing reads, each
    with the closest known name (None when nothing is close)."""
    return knobs.unknown_variables(_loaded_backends(), environ)


def warn_unknown_variables() -> None:
    """Log each unknown ``COIL_*`` variable once per process (loading the plugins does)."""
    knobs.warn_unknown_variables(_loaded_backends())


__all__ = [
    "Config", "ConfigValueError", "TemplateMode", "ProgressMode", "GraphCaptureMode", "OTHER_VARIABLES",
    "knob_variable", "defaults", "from_env", "get", "reload_from_env", "validated", "with_options",
    "override", "current", "active", "namespace", "env_var", "backend_options", "options_key",
    "known_variables", "unknown_variables", "warn_unknown_variables", "describe_unknown", "env_flag",
]
