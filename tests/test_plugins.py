"""Plugin discovery and the device registry: entry points loaded one by one (a broken plugin
is reported, the rest work), API-version checks, run-time registration."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest
import torch

import coil
import coil.sdk as sdk
from coil import plugins
from coil.errors import NoBackendError, PluginError


@pytest.fixture
def fresh_registry():
    plugins.reset()
    yield
    plugins.reset()


def _fake_entry_points(monkeypatch, eps):
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        if kw.get("group") == plugins.ENTRY_POINT_GROUP:
            return eps
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_shipped_cpu_plugin_is_found(fresh_registry):
    reg = plugins.registry()
    assert "cpu" in reg.backends
    info = {p.name: p for p in reg.plugins}["cpu_cpp"]
    assert info.source == "entry point" and info.api_version == sdk.API_VERSION


def test_broken_plugin_is_isolated_and_reported(fresh_registry, monkeypatch):
    bad_api = types.ModuleType("coil_test_bad_api")
    bad_api.coil_api_version = sdk.hookimpl(lambda: "99.0")
    sys.modules["coil_test_bad_api"] = bad_api
    EP = importlib.metadata.EntryPoint
    _fake_entry_points(
        monkeypatch,
        [
            EP("broken", "coil_test_does_not_exist", plugins.ENTRY_POINT_GROUP),
            EP("bad_api", "coil_test_bad_api", plugins.ENTRY_POINT_GROUP),
            EP("cpu_cpp", "coil_cpu_cpp", plugins.ENTRY_POINT_GROUP),
        ],
    )
    reg = plugins.registry()
    errors = {e.plugin: e.reason for e in reg.errors}
    assert "import failed" in errors["broken"]
    assert "99.0" in errors["bad_api"] and sdk.API_VERSION in errors["bad_api"]
    assert "cpu" in reg.backends  # the good plugin still works
    out = torch.compile(lambda x: x * 2, backend="coil")(torch.ones(3))
    torch.testing.assert_close(out, torch.full((3,), 2.0))


def test_autoload_can_be_turned_off_and_plugins_blocked(fresh_registry, monkeypatch):
    monkeypatch.setenv("COIL_BLOCK_PLUGINS", "cpu_cpp")
    assert "cpu" not in plugins.registry().backends
    plugins.reset()
    monkeypatch.delenv("COIL_BLOCK_PLUGINS")
    monkeypatch.setenv("COIL_NO_AUTOLOAD", "1")
    reg = plugins.registry()
    assert not reg.plugins
    with pytest.raises(NoBackendError, match="known device types"):
        reg.backend_for("cpu")


def test_register_backend_for_device_overrides(fresh_registry):
    from coil_cpu_cpp.backend import CppBackend

    calls = []

    class Counting(CppBackend):
        def compile(self, kernels, graph_name):
            calls.append(len(kernels))
            return super().compile(kernels, graph_name)

    coil.register_backend_for_device("cpu", Counting())
    out = torch.compile(lambda x: torch.softmax(x, -1), backend="coil")(torch.randn(4, 8))
    assert calls == [1]
    torch.testing.assert_close(out.sum(-1), torch.ones(4))


def test_register_backend_validates_device_type(fresh_registry):
    class Wrong(sdk.DeviceBackend):
        device_type = "cuda"

    with pytest.raises(PluginError, match="serves 'cuda'"):
        coil.register_backend_for_device("cpu", Wrong())


def test_doctor_names_a_broken_plugin_and_why(fresh_registry, monkeypatch):
    from coil.cli import doctor_report

    EP = importlib.metadata.EntryPoint
    _fake_entry_points(monkeypatch, [
        EP("broken", "coil_test_does_not_exist", plugins.ENTRY_POINT_GROUP),
        EP("cpu_cpp", "coil_cpu_cpp", plugins.ENTRY_POINT_GROUP),
    ])
    text, ok = doctor_report()
    assert not ok
    assert "broken: import failed: ModuleNotFoundError" in text
    assert "cpu        served by cpu_cpp" in text and "[ok] C++ compiler" in text


def test_doctor_command_runs():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "coil.cli", "doctor"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cpu_cpp" in out.stdout and "(entry point)" in out.stdout


def test_capabilities_without_scans_or_scatter_fall_back_per_op():
    """A backend declaring ``scans=False, scatter=False`` never receives those kernels: the
    ops run in ATen and everything else still compiles for it."""
    import dataclasses

    from coil_cpu_cpp.backend import CppBackend

    backend = CppBackend()
    backend.capabilities = dataclasses.replace(backend.capabilities, scans=False, scatter=False)
    coil.register_backend_for_device("cpu", backend, name="no-scans")
    try:
        x, i = torch.randn(6, 5), torch.tensor([0, 2, 2])
        r = coil.explain(lambda x, i: (x.cumsum(1) + 1, x.index_add(0, i, x[:3])), x, i)
        torch.testing.assert_close(r.result[0], x.cumsum(1) + 1)
        torch.testing.assert_close(r.result[1], x.index_add(0, i, x[:3]))
        assert any("cumsum" in op for op in r.fallbacks), r.fallbacks
        assert any("index_add" in op or "index_put" in op or "scatter" in op for op in r.fallbacks), r.fallbacks
        assert r.kernels
    finally:
        plugins.reset()
