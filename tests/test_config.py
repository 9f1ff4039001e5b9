"""Coil's typed configuration: every knob does what it says (tested by its effect on a compile,
not by the value stored), bad values are refused with the variable and the valid range, paths
are expanded, and unknown ``COIL_*`` variables are reported once with the closest known name."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Literal

import pytest
import torch

import coil
import coil.sdk as sdk
from coil import config, plugins
from coil.errors import ConfigError
from coil.sdk import knobs

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(monkeypatch):
    """Set ``COIL_*`` variables for one test; the configuration is read again before and after."""
    config.reload_from_env()

    def setenv(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        config.reload_from_env()

    yield setenv
    monkeypatch.undo()
    config.reload_from_env()


def _inner(exc: BaseException) -> BaseException:
    """The backend's own exception (Dynamo wraps it in BackendCompilerFailed)."""
    return getattr(exc, "inner_exception", exc)


def softmax(x):
    return torch.softmax(x, -1)


def _kernels(**options) -> list[str]:
    x = torch.randn(8, 33)
    with config.override(**options):
        report = coil.explain(softmax, x)
    torch.testing.assert_close(report.result, softmax(x))
    return [k.name for k in report.kernels]


# ----------------------------------------------------------------------------- max_fusion_size


def test_max_fusion_size_bounds_the_kernels():
    """Softmax is one kernel (3 IR nodes: amax, sum of exp, div) by default; a limit of 2 or 1
    splits it, and every split still matches eager."""
    default, two, one = _kernels(), _kernels(max_fusion_size=2), _kernels(max_fusion_size=1)
    assert len(default) == 1, default
    assert len(one) > len(two) > len(default), (one, two, default)


def test_max_fusion_size_from_the_environment_and_options(env):
    env("COIL_MAX_FUSION_SIZE", "1")
    assert len(_kernels()) > 1
    env("COIL_MAX_FUSION_SIZE", "")  # empty: the default
    assert len(_kernels()) == 1
    torch._dynamo.reset()
    x = torch.randn(8, 33)
    compiled = torch.compile(softmax, backend="coil", options={"max_fusion_size": 1})
    from coil.compile import add_observer, remove_observer
    graphs = []
    add_observer(graphs.append)
    try:
        torch.testing.assert_close(compiled(x), softmax(x))
    finally:
        remove_observer(graphs.append)
    assert len(graphs[0].kernels) > 1


def test_the_devices_own_limit_applies_and_the_smaller_wins():
    from coil_cpu_cpp.backend import CppBackend

    class OneNode(sdk.Scheduling):
        max_fusion_size = 1

    backend = CppBackend()
    backend.scheduling = OneNode()
    plugins.reset()
    try:
        coil.register_backend_for_device("cpu", backend, name="one-node")
        assert len(_kernels()) == len(_kernels(max_fusion_size=1)) > 1
    finally:
        plugins.reset()


def test_fusion_refusals_name_the_limit(tmp_path):
    x = torch.randn(8, 33)
    with config.override(max_fusion_size=1, debug_dir=str(tmp_path)):
        coil.explain(softmax, x)
    decisions = "\n".join(p.read_text() for p in tmp_path.glob("graph*/fusion.txt"))
    assert "fusion-size limit 1 (the max_fusion_size knob)" in decisions, decisions


# ----------------------------------------------------------------------------- bad values


@pytest.mark.parametrize("name,value,expected", [
    ("COIL_MAX_FUSION_SIZE", "0", "an integer >= 1"),
    ("COIL_MAX_FUSION_SIZE", "-4", "an integer >= 1"),
    ("COIL_MAX_FUSION_SIZE", "2.5", "an integer >= 1"),
    ("COIL_MAX_FUSION_SIZE", "true", "an integer >= 1"),
    ("COIL_MAX_FUSION_SIZE", "many", "an integer >= 1"),
    ("COIL_REALIZE_READS_THRESHOLD", "-1", "an integer >= 0"),
    ("COIL_CACHE_MAX_BYTES", "0", "an integer >= 1"),
    ("COIL_CACHE_MAX_BYTES", "2 parsecs", "an integer >= 1"),
    ("COIL_GRAPH_CAPTURE", "ture", "one of auto, on, off"),
    ("COIL_CHECK", "2", "one of 1, true, yes, on, 0, false, no, off"),
    ("COIL_PROGRESS", "sometimes", "one of auto, on, off"),
    ("COIL_PROGRESS", "1", "one of auto, on, off"),
])
def test_bad_environment_values_are_refused(env, name, value, expected):
    env(name, value)
    with pytest.raises(config.ConfigValueError) as info:
        config.get()
    message = str(info.value)
    assert name in message and repr(value) in message and expected in message, message
    with pytest.raises(Exception) as info:  # and a compile says the same, before doing anything
        torch.compile(lambda x: x + 1, backend="coil")(torch.randn(3))
    assert isinstance(_inner(info.value), config.ConfigValueError), info.value


@pytest.mark.parametrize("key,value", [
    ("max_fusion_size", 0), ("max_fusion_size", -1), ("max_fusion_size", 2.0),
    ("max_fusion_size", True), ("max_fusion_size", "2.5"), ("graph_capture", "ture"),
    ("graph_capture", 2), ("check", "maybe"), ("cache_max_bytes", -5), ("cache_dir", 3),
    ("progress", True), ("progress", "never"),
])
def test_bad_option_values_are_refused(key, value):
    with pytest.raises(config.ConfigValueError, match=re.escape(key)):
        config.validated({key: value})
    with pytest.raises(ConfigError, match=re.escape(key)):
        with config.override(**{key: value}):
            pass
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x + 1, backend="coil", options={key: value})(torch.randn(3))
    assert isinstance(_inner(info.value), config.ConfigValueError), info.value


def test_good_values_in_every_spelling(env):
    assert config.validated({"max_fusion_size": "5", "graph_capture": "On", "check": 1,
                             "cache_max_bytes": "512M", "progress": " ON "}) == {
        "max_fusion_size": 5, "graph_capture": "on", "check": True, "cache_max_bytes": 512 * 2**20,
        "progress": "on"}
    env("COIL_CACHE_MAX_BYTES", "3GiB")
    env("COIL_CHECK", "no")
    assert config.get().cache_max_bytes == 3 * 2**30 and config.get().check is False
    with pytest.raises(ConfigError, match="known options: .*cache_dir"):
        config.validated({"nope": 1})
    with pytest.raises(ConfigError, match="expected an integer"):
        config.validated({"max_fusion_size": "many"})


def test_plugin_option_variables_are_checked_too(env):
    """A plugin's boolean option read from the environment is as strict as a knob."""
    import dataclasses

    from coil_cpu_cpp.backend import CppBackend

    class Flagged(CppBackend):
        name = "flagged"

        @dataclasses.dataclass(frozen=True)
        class Options:
            verbose: bool = False

    env("COIL_FLAGGED_VERBOSE", "ture")
    with pytest.raises(config.ConfigValueError, match="COIL_FLAGGED_VERBOSE"):
        Flagged().options
    env("COIL_FLAGGED_VERBOSE", "yes")
    assert Flagged().options.verbose is True


def test_plugin_literal_option_takes_only_its_words(env):
    """An option typed ``Literal[...]`` (here as text, under ``from __future__ import
    annotations``) takes one of its words, case ignored, and refuses any other (SDK 1.3.0)."""
    import dataclasses

    from coil_cpu_cpp.backend import CppBackend

    class Worded(CppBackend):
        name = "worded"

        @dataclasses.dataclass(frozen=True)
        class Options:
            tuning: Literal["auto", "all"] = "auto"

    assert Worded().options.tuning == "auto"
    env("COIL_WORDED_TUNING", "ALL")
    assert Worded().options.tuning == "all"
    env("COIL_WORDED_TUNING", "some")
    with pytest.raises(config.ConfigValueError, match="one of auto, all"):
        Worded().options
    # the Triton plugin's own option, through an override (validated where it enters)
    with pytest.raises(config.ConfigValueError, match="one of auto, all"):
        with config.override(**{"cuda_triton.tuning": "everything"}):
            pass


def test_scoped_override_restores():
    before = config.get().max_fusion_size
    with config.override(max_fusion_size=3):
        assert config.get().max_fusion_size == 3
    assert config.get().max_fusion_size == before


# ----------------------------------------------------------------------------- paths


def test_cache_dir_empty_means_the_default_not_the_current_folder(env, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env("COIL_CACHE_DIR", "")
    folder = Path(sdk.cache_dir("probe"))
    assert folder == tmp_path / "xdg" / "coil" / "probe" and folder.is_dir()
    assert not list(work.iterdir())


def test_cache_dir_expands_home_and_variables_and_becomes_absolute(env, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CACHE_ROOT_FOR_COIL_TEST", str(tmp_path / "var"))
    monkeypatch.chdir(tmp_path)
    env("COIL_CACHE_DIR", "~/x")
    x = torch.randn(5, 7)
    out = torch.compile(lambda x: (x * 3).exp().sum(-1), backend="coil")(x)  # writes its library
    torch.testing.assert_close(out, (x * 3).exp().sum(-1))
    assert list((tmp_path / "home" / "x").iterdir()), "nothing was cached under ~/x"
    assert not (tmp_path / "~").exists()
    env("COIL_CACHE_DIR", "$CACHE_ROOT_FOR_COIL_TEST/c")
    assert config.get().cache_dir == str(tmp_path / "var" / "c")
    env("COIL_CACHE_DIR", "rel/c")
    assert config.get().cache_dir == str(tmp_path / "rel" / "c")
    env("COIL_CACHE_DIR", "$NO_SUCH_VARIABLE_FOR_COIL/c")
    with pytest.raises(config.ConfigValueError, match="NO_SUCH_VARIABLE_FOR_COIL is not set"):
        config.get()
    env("COIL_CACHE_DIR", "")
    with config.override(debug_dir="~/dbg") as cfg:
        assert cfg.debug_dir == str(tmp_path / "home" / "dbg")


# ----------------------------------------------------------------------------- unknown variables


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(knobs, "_warned", set())
    plugins.reset()
    yield
    plugins.reset()


def _unknown_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "coil.sdk.knobs" and "reads it" in r.getMessage()]


def test_unknown_variable_is_reported_once_with_the_closest_name(env, fresh_warnings, caplog):
    env("COIL_MAX_FUSOIN_SIZE", "8")
    env("COIL_CPU_CPP_EXTRA_CFLAG", "-O1")  # a plugin option, misspelled
    with caplog.at_level(logging.WARNING, logger="coil.sdk.knobs"):
        plugins.registry()
        plugins.reset()
        plugins.registry()
    warnings = _unknown_warnings(caplog)
    assert len(warnings) == 2, warnings
    assert "COIL_MAX_FUSOIN_SIZE" in warnings[1] and "did you mean COIL_MAX_FUSION_SIZE?" in warnings[1]
    assert "did you mean COIL_CPU_CPP_EXTRA_CFLAGS?" in warnings[0]


def test_known_variables_do_not_warn(env, fresh_warnings, caplog):
    for name in config.OTHER_VARIABLES:
        env(name, "")
    env("COIL_CPU_CPP_EXTRA_CFLAGS", "")
    env("COIL_CHECK", "0")
    env("COIL_CACHE_MAX_BYTES", "1G")
    with caplog.at_level(logging.WARNING, logger="coil.sdk.knobs"):
        plugins.registry()
    assert not _unknown_warnings(caplog)


#: ``COIL_*`` names in the code that are not environment variables (C preprocessor macros).
NOT_VARIABLES = {"COIL_PROBE", "COIL_NO_COMPARE"}


def test_every_variable_the_code_reads_is_declared(fresh_warnings):
    """Every ``COIL_*`` name in Coil's code, plugins, tests, scripts and benchmarks is a knob, an
    option of a shipped plugin, or declared in ``config.OTHER_VARIABLES``: a new variable is
    declared there, or users who set it are told it does nothing."""
    known = config.known_variables()
    found: dict[str, str] = {}
    for folder in ("core", "sdk", "plugins", "tests", "scripts", "bench", "examples"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix not in (".py", ".sh") or path == Path(__file__).resolve():
                continue
            for name in re.findall(r"\bCOIL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
                found.setdefault(name, str(path.relative_to(REPO)))
    undeclared = {n: p for n, p in found.items() if n not in known and n not in NOT_VARIABLES}
    assert not undeclared, f"declare these in coil.config.OTHER_VARIABLES: {undeclared}"
    assert {"COIL_TEST_DEVICE", "COIL_NO_AUTOLOAD", "COIL_CACHE_DIR"} <= set(found)


def test_doctor_shows_settings_refusals_and_unknown_variables(env, fresh_warnings):
    from coil.cli import doctor_report

    env("COIL_MAX_FUSION_SIZE", "8")
    env("COIL_MAX_FUSOIN_SIZE", "8")
    text, ok = doctor_report()
    assert ok, text
    assert "max_fusion_size = 8  (COIL_MAX_FUSION_SIZE)" in text
    assert "[unknown] COIL_MAX_FUSOIN_SIZE" in text and "did you mean COIL_MAX_FUSION_SIZE?" in text
    env("COIL_GRAPH_CAPTURE", "ture")
    text, ok = doctor_report()
    assert not ok and "[FAIL] COIL_GRAPH_CAPTURE='ture' is not valid" in text, text


def test_env_flag_is_strict(monkeypatch):
    monkeypatch.setenv("COIL_NO_AUTOLOAD", "ture")
    with pytest.raises(config.ConfigValueError, match="COIL_NO_AUTOLOAD"):
        config.env_flag("COIL_NO_AUTOLOAD")
    monkeypatch.setenv("COIL_NO_AUTOLOAD", "")
    assert config.env_flag("COIL_NO_AUTOLOAD") is False
    monkeypatch.setenv("COIL_NO_AUTOLOAD", "Yes")
    assert config.env_flag("COIL_NO_AUTOLOAD") is True
    assert os.environ["COIL_NO_AUTOLOAD"] == "Yes"


def test_profile_kernels_names_each_kernel_in_profiler_tables():
    x = torch.randn(64, 32)

    def f(x):
        return torch.softmax(x * 2, -1) + x.sum()
    torch._dynamo.reset()
    with config.override(profile_kernels=True):
        fn = torch.compile(f, backend="coil")
        fn(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            got = fn(x)
    torch.testing.assert_close(got, f(x))
    assert any(e.key.startswith("coil:k") for e in prof.key_averages()), [e.key for e in prof.key_averages()]
    torch._dynamo.reset()
    assert "record_function" not in coil.explain(f, x).graphs[0].wrapper_source  # off by default
