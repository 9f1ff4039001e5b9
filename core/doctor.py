"""``coil doctor``: what this installation would do, and what stops it. It lists the plugins
(and why some are absent: ``COIL_NO_AUTOLOAD``, ``COIL_BLOCK_PLUGINS``, load errors), which
plugin serves each device and which it replaced, whether torch can make tensors of each device
here, every backend's toolchain checks (ok / FAIL / skipped, the last with the reason it could
not run), and the settings: knobs not at their default, values Coil refuses, and ``COIL_*``
variables nothing reads. Only failures make the report not ok: a check that could not run on
this machine, or an unknown variable, does not."""
from __future__ import annotations

from typing import Any

from . import config, plugins
from .errors import ConfigError
from .sdk import API_VERSION
from .version import __version__


def _status(check: Any) -> str:
    if getattr(check, "skipped", False):
        return "skipped"
    return "ok" if check.ok else "FAIL"


def device_unavailable(device_type: str) -> str | None:
    """Why torch cannot make ``device_type`` tensors in this process, or None when it can."""
    import torch
    try:
        torch.device(device_type)
    except (RuntimeError, ValueError):
        return (f"torch does not know device type {device_type!r} (it needs a PrivateUse1 "
                f"extension, imported before use: see examples/emu_chip)")
    try:
        torch.empty(1, device=device_type)
    except Exception as exc:  # noqa: BLE001 - whatever torch says is the reason
        return f"unavailable on this machine ({str(exc).strip().splitlines()[0]})"
    return None


def _plugin_lines(reg: plugins.Registry) -> list[str]:
    lines = ["plugins:"]
    for p in reg.plugins:
        lines.append(f"  {p.name:<24} version {p.version or '-':<8} API {p.api_version:<8} ({p.source})")
    if not reg.autoload:
        lines.append("  COIL_NO_AUTOLOAD is set: no entry-point plugin was loaded, Coil's own "
                     "included (unset it, or skip single plugins with COIL_BLOCK_PLUGINS)")
    elif not reg.plugins:
        lines.append("  (none)")
    if reg.blocked:
        lines.append(f"  skipped by COIL_BLOCK_PLUGINS: {', '.join(reg.blocked)}")
    return lines


def _device_lines(reg: plugins.Registry) -> tuple[list[str], bool]:
    lines, ok = ["devices:"], True
    for device_type, backend in sorted(reg.backends.items()):
        lines.append(f"  {device_type:<10} served by {backend.name or type(backend).__name__}")
        if device_type in reg.replaced:
            lines.append(f"    note: {reg.replacement_note(device_type)}")
        unavailable = device_unavailable(device_type)
        if unavailable:
            lines.append(f"    [skipped] {device_type} tensors: {unavailable}; its kernels "
                         f"cannot run here")
        try:
            checks = list(backend.doctor())
        except Exception as exc:  # noqa: BLE001 - a broken check is a failure to report
            lines.append(f"    [FAIL] doctor(): {type(exc).__name__}: {exc}")
            ok = False
            continue
        for check in checks:
            ok = ok and _status(check) != "FAIL"
            lines.append(f"    [{_status(check)}] {check.name}: {check.detail}")
    if not reg.backends:
        lines.append("  (none)")
    return lines, ok


def _settings_lines() -> tuple[list[str], bool]:
    lines, ok = ["settings:"], True
    try:
        cfg = config.from_env()
    except ConfigError as exc:
        lines.append(f"  [FAIL] {exc}")
        ok = False
    else:
        defaults = config.defaults()
        for name, default in defaults.items():
            value = getattr(cfg, name)
            if value != default or name == "cache_dir":
                lines.append(f"  {name} = {value!r}" + ("" if value == default else
                                                        f"  ({config.knob_variable(name)})"))
    for name, closest in config.unknown_variables():
        lines.append(f"  [unknown] {config.describe_unknown(name, closest)}")
    return lines, ok


def doctor_report() -> tuple[str, bool]:
    """The report's text, and whether everything checked out."""
    reg = plugins.registry()
    devices, devices_ok = _device_lines(reg)
    settings, settings_ok = _settings_lines()
    lines = [f"coil {__version__} (coil.sdk API {API_VERSION})", "", *_plugin_lines(reg), "",
             *devices, "", *settings]
    if reg.errors:
        lines += ["", "plugins that failed to load:"]
        lines += [f"  {e.plugin}: {e.reason}" for e in reg.errors]
    return "\n".join(lines), devices_ok and settings_ok and not reg.errors
