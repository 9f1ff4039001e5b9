"""The coil.sdk API version policy: which declared versions load, and refusals that name both
versions and what changed between them (fake plugins through entry points)."""
from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest

import coil.sdk as sdk
from coil import plugins
from coil.sdk import versions
from coil.sdk.versions import Change, Release, compatibility

#: A made-up future: 1.0.0 broke the contract, 1.1.0 added to it.
FUTURE = versions.HISTORY + (
    Release("1.0.0", (Change("DeviceBackend.compile takes a CompileContext", breaking=True),
                      Change("Capabilities.tiles"))),
    Release("1.1.0", (Change("a new hook coil_autotuners"),)),
)


def test_history_is_ordered_and_breaking_changes_bump_the_major():
    parsed = [versions.parse(r.version) for r in versions.HISTORY]
    assert parsed == sorted(parsed) and len(set(parsed)) == len(parsed)
    assert sdk.API_VERSION == versions.API_VERSION == versions.HISTORY[-1].version
    for before, release in zip(versions.HISTORY, versions.HISTORY[1:]):
        if any(c.breaking for c in release.changes):
            assert versions.parse(release.version)[0] > versions.parse(before.version)[0], release


def test_same_version_and_older_minor_are_compatible():
    assert compatibility(sdk.API_VERSION) == (True, "")
    ok, message = compatibility("1.0.7", provided="1.1.0", history=FUTURE)
    assert ok and "1.0.7" in message and "1.1.0" in message and "coil_autotuners" in message
    assert compatibility("1.1.9", provided="1.1.0", history=FUTURE) == (True, "")  # patch ignored


def test_newer_minor_is_refused_with_what_to_do():
    ok, message = compatibility("1.2.0", provided="1.1.0", history=FUTURE)
    assert not ok
    assert "1.2.0" in message and "1.1.0" in message and "Upgrade Coil" in message


def test_other_major_is_refused_with_the_breaking_changes():
    ok, message = compatibility("0.2.0", provided="1.1.0", history=FUTURE)
    assert not ok and "0.2.0" in message and "1.1.0" in message
    assert "major versions differ" in message
    assert "[1.0.0, breaking] DeviceBackend.compile takes a CompileContext" in message
    assert "Capabilities.tiles" not in message  # only the breaking changes are listed
    ok, message = compatibility("2.0.0", provided="1.1.0", history=FUTURE)
    assert not ok and "newer" in message


@pytest.mark.parametrize("declared", ["banana", "1", "1.2.3.4", "v1.0", 1])
def test_malformed_versions_are_reported_clearly(declared):
    ok, message = compatibility(declared)  # type: ignore[arg-type]
    assert not ok and repr(declared) in message and "MAJOR.MINOR.PATCH" in message


def test_missing_version():
    ok, message = compatibility("")
    assert not ok and "coil_api_version" in message and sdk.API_VERSION in message


# -- through plugin loading


@pytest.fixture
def fresh_registry():
    plugins.reset()
    yield
    plugins.reset()


def _install(monkeypatch, **declared: str) -> None:
    """Entry points for fake plugins ``name -> declared API version`` (each serving a device
    of its own name), plus the shipped CPU plugin."""
    EP = importlib.metadata.EntryPoint
    eps = [EP("cpu_cpp", "coil_cpu_cpp", plugins.ENTRY_POINT_GROUP)]
    for name, version in declared.items():
        module = types.ModuleType(f"coil_test_{name}")
        backend = type(f"{name}Backend", (sdk.DeviceBackend,), {"device_type": name, "name": name})()
        module.coil_api_version = sdk.hookimpl(lambda v=version: v)
        module.coil_device_backends = sdk.hookimpl(lambda b=backend: [b])
        monkeypatch.setitem(sys.modules, module.__name__, module)
        eps.append(EP(name, module.__name__, plugins.ENTRY_POINT_GROUP))
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: eps if kw.get("group") == plugins.ENTRY_POINT_GROUP else real(**kw))


def test_plugins_load_or_are_refused_by_declared_version(fresh_registry, monkeypatch):
    current = versions.parse(sdk.API_VERSION)
    newer = f"{current[0]}.{current[1] + 1}.0"
    _install(monkeypatch, oldchip="0.1.0", nowchip=sdk.API_VERSION, newchip=newer, badchip="soon")
    reg = plugins.registry()
    assert {"oldchip", "nowchip", "cpu"} <= set(reg.backends)
    errors = {e.plugin: e.reason for e in reg.errors}
    assert set(errors) == {"newchip", "badchip"}
    assert newer in errors["newchip"] and sdk.API_VERSION in errors["newchip"]
    assert "'soon'" in errors["badchip"] and "MAJOR.MINOR.PATCH" in errors["badchip"]
    assert "newchip" not in reg.backends and "badchip" not in reg.backends


def test_a_new_major_names_what_broke(fresh_registry, monkeypatch):
    monkeypatch.setattr(versions, "HISTORY", FUTURE)
    monkeypatch.setattr(versions, "API_VERSION", "1.1.0")
    _install(monkeypatch, oldchip="0.2.0")
    from coil.cli import doctor_report
    text, ok = doctor_report()
    assert not ok
    assert "oldchip: written for coil.sdk API 0.2.0, Coil provides 1.1.0" in text
    assert "DeviceBackend.compile takes a CompileContext" in text
