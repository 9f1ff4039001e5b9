"""Plugin discovery and the device registry: entry points loaded one by one (a broken plugin
is reported, the rest work), API-version checks, run-time registration."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import types

import pytest
import torch

import coil
import coil.sdk as sdk
from coil import plugins
from coil.errors import ConfigError, NoBackendError, PluginError


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
    # it declares the release whose features it uses (docs/plugin-guide.md, Versioning), which
    # this Coil serves; not necessarily the newest
    assert info.source == "entry point" and sdk.compatibility(info.api_version)[0], info.api_version


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


# ----------------------------------------------------------------------------- faults a plugin brings


def _plugin_module(tmp_path, monkeypatch, name: str, source: str) -> None:
    """A module ``name`` importable from ``tmp_path`` holding ``source``."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


def test_plugin_calling_sys_exit_is_reported_not_fatal(fresh_registry, monkeypatch, tmp_path):
    _plugin_module(tmp_path, monkeypatch, "coil_test_exits_at_import", "import sys\nsys.exit(3)\n")
    _plugin_module(tmp_path, monkeypatch, "coil_test_exits_in_hook", (
        "import sys\nimport coil.sdk as sdk\n\n"
        "@sdk.hookimpl\ndef coil_api_version():\n    return sdk.API_VERSION\n\n"
        "@sdk.hookimpl\ndef coil_device_backends():\n    sys.exit('no device here')\n"))
    EP = importlib.metadata.EntryPoint
    _fake_entry_points(monkeypatch, [
        EP("exits_at_import", "coil_test_exits_at_import", plugins.ENTRY_POINT_GROUP),
        EP("exits_in_hook", "coil_test_exits_in_hook", plugins.ENTRY_POINT_GROUP),
        EP("cpu_cpp", "coil_cpu_cpp", plugins.ENTRY_POINT_GROUP),
    ])
    reg = plugins.registry()
    errors = {e.plugin: e.reason for e in reg.errors}
    assert "import failed: called sys.exit(3)" in errors["exits_at_import"], errors
    assert "called sys.exit('no device here')" in errors["exits_in_hook"], errors
    assert [p.name for p in reg.plugins] == ["cpu_cpp"]
    out = torch.compile(lambda x: x * 2, backend="coil")(torch.ones(3))  # still alive, still working
    torch.testing.assert_close(out, torch.full((3,), 2.0))


def test_keyboard_interrupt_during_plugin_import_is_not_swallowed(fresh_registry, monkeypatch, tmp_path):
    _plugin_module(tmp_path, monkeypatch, "coil_test_interrupted", "raise KeyboardInterrupt\n")
    EP = importlib.metadata.EntryPoint
    _fake_entry_points(monkeypatch, [EP("interrupted", "coil_test_interrupted", plugins.ENTRY_POINT_GROUP)])
    with pytest.raises(KeyboardInterrupt):
        plugins.registry()


def test_doctor_survives_a_plugin_that_exits(tmp_path):
    """``coil doctor`` in a fresh process, with a plugin installed (a dist-info on the path)
    whose import calls sys.exit: the report is printed, names the plugin, and exits 1."""
    import subprocess

    (tmp_path / "coil_test_exiter.py").write_text("import sys\nsys.exit(0)\n")
    info = tmp_path / "coil_test_exiter-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: coil-test-exiter\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[coil.plugins]\nexiter = coil_test_exiter\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run([sys.executable, "-m", "coil.cli", "doctor"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "exiter: import failed: called sys.exit(0)" in out.stdout, out.stdout
    assert "cpu        served by cpu_cpp" in out.stdout


def test_no_autoload_says_so_where_the_backend_is_missing(fresh_registry, monkeypatch):
    from coil.cli import doctor_report

    monkeypatch.setenv("COIL_NO_AUTOLOAD", "1")
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x + 1, backend="coil")(torch.ones(3))
    err = getattr(info.value, "inner_exception", info.value)
    assert isinstance(err, NoBackendError) and "COIL_NO_AUTOLOAD is set" in str(err), err
    text, _ = doctor_report()
    assert "COIL_NO_AUTOLOAD is set: no entry-point plugin was loaded" in text
    plugins.reset()
    monkeypatch.setenv("COIL_NO_AUTOLOAD", "ture")
    with pytest.raises(ConfigError, match="COIL_NO_AUTOLOAD='ture'"):
        plugins.registry()
    plugins.reset()
    monkeypatch.setenv("COIL_NO_AUTOLOAD", "0")  # a flag like any other: 0 loads them
    assert "cpu" in plugins.registry().backends


def test_blocked_plugins_are_named_where_the_backend_is_missing(fresh_registry, monkeypatch):
    monkeypatch.setenv("COIL_BLOCK_PLUGINS", "cpu_cpp")
    with pytest.raises(NoBackendError, match="COIL_BLOCK_PLUGINS skipped: cpu_cpp"):
        plugins.registry().backend_for("cpu")


def test_installed_plugin_replacing_a_device_backend_is_announced(fresh_registry, monkeypatch, caplog):
    """Two installed plugins serve ``cpu``: the later by name wins (the documented rule), and
    the replacement shows in ``coil doctor`` and is logged once, at the first compile."""
    from coil.cli import doctor_report
    from coil_cpu_cpp.backend import CppBackend

    calls = []

    class VendorCpu(CppBackend):
        name = "vendor_cpu"

        def compile(self, kernels, graph_name):
            calls.append(graph_name)
            return super().compile(kernels, graph_name)

    vendor = types.ModuleType("coil_test_vendor_cpu")
    vendor.coil_api_version = sdk.hookimpl(lambda: sdk.API_VERSION)
    vendor.coil_device_backends = sdk.hookimpl(lambda: [VendorCpu()])
    monkeypatch.setitem(sys.modules, "coil_test_vendor_cpu", vendor)
    EP = importlib.metadata.EntryPoint
    _fake_entry_points(monkeypatch, [
        EP("cpu_cpp", "coil_cpu_cpp", plugins.ENTRY_POINT_GROUP),
        EP("vendor_cpu", "coil_test_vendor_cpu", plugins.ENTRY_POINT_GROUP),
    ])
    reg = plugins.registry()
    assert reg.replaced == {"cpu": ["cpu_cpp"]} and reg.providers["cpu"] == "vendor_cpu"
    text, ok = doctor_report()
    assert ok and "cpu        served by vendor_cpu" in text
    assert "replaces the backend of 'cpu_cpp'" in text and "COIL_BLOCK_PLUGINS=vendor_cpu" in text
    with caplog.at_level(logging.WARNING, logger="coil.sdk.registry"):
        for n in (3, 4):
            torch._dynamo.reset()
            out = torch.compile(lambda x: x.exp() * 2, backend="coil")(torch.ones(n))
            torch.testing.assert_close(out, torch.ones(n).exp() * 2)
    notes = [r.getMessage() for r in caplog.records if "replaces the backend" in r.getMessage()]
    assert len(notes) == 1 and "served by plugin 'vendor_cpu'" in notes[0], notes
    assert len(calls) == 2  # the vendor's backend compiled both


def test_runtime_registration_replaces_without_a_notice(fresh_registry):
    from coil_cpu_cpp.backend import CppBackend

    coil.register_backend_for_device("cpu", CppBackend(), name="explicit")
    reg = plugins.registry()
    assert reg.providers["cpu"] == "explicit" and "cpu" not in reg.replaced


# ----------------------------------------------------------------------------- doctor statuses


class _Probe(sdk.DeviceBackend):
    """A backend whose doctor reports what the test hands it."""

    def __init__(self, device_type, checks):
        self.device_type = device_type
        self._checks = checks

    def doctor(self):
        return self._checks


def test_doctor_says_skipped_not_ok_for_a_check_that_cannot_run(fresh_registry):
    from coil.cli import doctor_report

    check = sdk.Check.skip("accelerator present", "none visible on this machine")
    assert check.status == "skipped" and check.ok  # skipped is not a failure
    coil.register_backend_for_device("coil_test_nodevice", _Probe("coil_test_nodevice", [check]))
    text, ok = doctor_report()
    assert ok, text
    assert "[skipped] accelerator present: none visible on this machine" in text
    assert "[ok] accelerator present" not in text
    # torch cannot make tensors of a device it does not know: said once, for every backend
    assert "[skipped] coil_test_nodevice tensors: torch does not know device type" in text
    assert "PrivateUse1" in text


def test_doctor_fails_on_a_failing_or_raising_check(fresh_registry):
    from coil.cli import doctor_report

    failing = sdk.Check("driver", False, "too old")
    coil.register_backend_for_device("coil_test_bad", _Probe("coil_test_bad", [failing]))
    text, ok = doctor_report()
    assert not ok and "[FAIL] driver: too old" in text

    class Raising(_Probe):
        def doctor(self):
            raise RuntimeError("probe exploded")

    plugins.reset()
    coil.register_backend_for_device("coil_test_bad", Raising("coil_test_bad", []))
    text, ok = doctor_report()
    assert not ok and "[FAIL] doctor(): RuntimeError: probe exploded" in text
