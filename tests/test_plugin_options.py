"""Namespaced plugin options: a backend's ``Options`` dataclass, set by ``COIL_<BACKEND>_<FIELD>``,
``torch.compile(options={"<backend>.<field>": v})`` and ``coil.config.override``, read per
compile through ``DeviceBackend.options``, and part of the CPU plugin's library cache key."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import coil
import coil.sdk as sdk
from coil import config, plugins
from coil.errors import ConfigError
from coil_cpu_cpp import toolchain
from coil_cpu_cpp.backend import CppBackend


@pytest.fixture
def fresh_registry():
    plugins.reset()
    yield
    plugins.reset()


@pytest.fixture
def builds(monkeypatch):
    """Every library the CPU plugin asks for: (extra flags, cache-key extra, path)."""
    seen: list[tuple[list[str], str, str]] = []
    real = toolchain.library_for

    def recording(source, extra_flags=(), key_extra=""):
        path = real(source, extra_flags, key_extra)
        seen.append((list(extra_flags), key_extra, str(path)))
        return path

    monkeypatch.setattr(toolchain, "library_for", recording)
    return seen


def _inner(exc: BaseException) -> BaseException:
    """The backend's own exception (Dynamo wraps it in BackendCompilerFailed)."""
    return getattr(exc, "inner_exception", exc)


def fn(x):
    return torch.softmax(x * 2, -1) + x.sum(0)


def test_option_changes_the_build_and_still_matches_eager(builds):
    x = torch.randn(6, 33)
    flagged = torch.compile(fn, backend="coil", options={"cpu_cpp.extra_cflags": "-O1 -DCOIL_PROBE=1"})(x)
    torch._dynamo.reset()
    plain = torch.compile(fn, backend="coil")(x)
    torch.testing.assert_close(flagged, fn(x))
    torch.testing.assert_close(plain, fn(x))
    (flags_a, key_a, path_a), (flags_b, key_b, path_b) = builds
    assert flags_a == ["-O1", "-DCOIL_PROBE=1"] and flags_b == []
    assert "extra_cflags='-O1 -DCOIL_PROBE=1'" in key_a and "extra_cflags=''" in key_b
    assert CppBackend().capabilities.cache_key() in key_a  # capabilities enter the key too
    assert path_a != path_b


def test_option_reaches_the_compiler_command_line():
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="coil",
                      options={"cpu_cpp.extra_cflags": "-fcoil-no-such-flag"})(torch.randn(4, 4))
    err = _inner(info.value)
    assert isinstance(err, sdk.KernelCompileError) and "coil-no-such-flag" in err.output


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="coil", options={"cpu_cpp.nonexistent": 1})(torch.randn(3, 3))
    err = _inner(info.value)
    assert isinstance(err, ConfigError) and err.key == "cpu_cpp.nonexistent"
    assert "cpu_cpp.extra_cflags" in str(err)
    with pytest.raises(ConfigError, match="known options: .*cpu_cpp.extra_cflags"):
        config.validated({"no_such_plugin.knob": 1})
    with pytest.raises(ConfigError, match="cpu_cpp.extra_cflags"):
        with config.override(**{"cpu_cpp.nonexistent": 1}):
            pass


def test_environment_then_override_then_options(monkeypatch):
    backend = CppBackend()
    assert backend.options.extra_cflags == "" and backend.options_key() == "autotune=False;extra_cflags='';streaming=True"
    monkeypatch.setenv("COIL_CPU_CPP_EXTRA_CFLAGS", "-O2")
    config.reload_from_env()
    try:
        assert backend.options.extra_cflags == "-O2"
        with config.override(**{"cpu_cpp.extra_cflags": "-O1"}) as cfg:
            assert backend.options.extra_cflags == "-O1"
            per_call = config.with_options(cfg, {"cpu_cpp.extra_cflags": "-O3"})
            with config.active(per_call):
                assert backend.options.extra_cflags == "-O3"
            assert backend.options.extra_cflags == "-O1"
        assert backend.options.extra_cflags == "-O2"
    finally:
        monkeypatch.delenv("COIL_CPU_CPP_EXTRA_CFLAGS")
        config.reload_from_env()
    assert backend.options.extra_cflags == ""


class ProbeBackend(CppBackend):
    """The CPU backend with typed options, recording the options each compile saw."""

    name = "probe"

    @dataclasses.dataclass(frozen=True)
    class Options(CppBackend.Options):
        #: Any integer; the test reads it back.
        level: int = 0
        #: A second knob, to check key order.
        fast: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, bool]] = []

    def compile(self, kernels, graph_name):
        self.seen.append((self.options.level, self.options.fast))
        return super().compile(kernels, graph_name)


def test_each_compile_sees_its_own_options(fresh_registry):
    probe = ProbeBackend()
    coil.register_backend_for_device("cpu", probe)
    x = torch.randn(5)
    out = torch.compile(lambda x: x + 1, backend="coil", options={"probe.level": "3", "probe.fast": 1})(x)
    torch.testing.assert_close(out, x + 1)
    torch.compile(lambda x: x * 3, backend="coil")(x)
    with config.override(**{"probe.level": 7}):
        torch.compile(lambda x: x - 1, backend="coil")(x)
    assert probe.seen == [(3, True), (0, False), (7, False)]
    assert probe.options_key() == "autotune=False;extra_cflags='';fast=False;level=0;streaming=True"  # sorted by field name
    with pytest.raises(ConfigError, match="expected an integer"):
        config.validated({"probe.level": "high"})
    with pytest.raises(ConfigError, match="known options: probe.autotune, probe.extra_cflags, probe.fast, probe.level, probe.streaming"):
        config.validated({"probe.levle": 1})


def test_options_must_be_a_dataclass(fresh_registry):
    class Loose(CppBackend):
        name = "loose"

        class Options:
            knob = 1

    with pytest.raises(ConfigError, match="must be a dataclass"):
        _ = Loose().options


def test_backend_without_options():
    assert sdk.DeviceBackend().options is None and sdk.DeviceBackend().options_key() == ""
