"""The conformance kit (``coil.sdk.testing``): the shipped CPU plugin passes it, tiers the
capability descriptor lacks are skipped (never passed), ``--coil-backend`` routes a backend
for the run and is undone, the scorecard's table and exit status follow the outcomes, the
opinfo tier's expected-failures file works both ways, and the plugin is inert when unused.

Fake backends are small subclasses of the CPU plugin's backend, written to a temporary module
and routed with ``--coil-backend``. Kit runs happen in this process through ``pytest.main``
(not ``pytester``, which unloads the modules a run imported: torch and Dynamo do not survive
being imported twice), except the one a vendor would type, which runs in a fresh process."""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from coil import cli, plugins
from coil.sdk.testing import expected, tiers
from coil.sdk.testing.scorecard import ScoreCollector

FAKES = '''
import dataclasses, hashlib, os
import torch
import coil.sdk as sdk
from coil_cpu_cpp.backend import CppBackend


class LimitedBackend(CppBackend):
    """No reductions, no backward, no dynamic shapes, no half types, no templates."""
    def __init__(self):
        super().__init__()
        self.capabilities = dataclasses.replace(
            self.capabilities, reductions=frozenset(), backward=False, dynamic_shapes=False,
            dtypes=self.capabilities.dtypes - {torch.float16, torch.bfloat16},
            template_dialects=frozenset())


class CorruptingBackend(CppBackend):
    """Adds 1 to the first element of every floating-point kernel output."""
    def call_line(self, module_var, kernel, args):
        line = super().call_line(module_var, kernel, args)
        out = args[len(kernel.inputs)]
        return (f"{line}; ({out}.as_strided((1,), (1,), {out}.storage_offset()).add_(1) "
                f"if {out}.numel() and {out}.is_floating_point() else None)")


class TuningBackend(CppBackend):
    """Declares autotuning; 'tunes' each kernel once, remembered on disk (or, broken, in memory)."""
    persistent = True

    def __init__(self):
        super().__init__()
        self.capabilities = dataclasses.replace(self.capabilities, autotune=True)
        self.tuning_count = 0
        self._seen = set()

    def compile(self, kernels, graph_name):
        for text in self.generate(kernels)[2].values():
            key = hashlib.sha256(text.encode()).hexdigest()
            path = os.path.join(sdk.cache_dir("fake_tuner"), key)
            known = os.path.exists(path) if self.persistent else key in self._seen
            if not known:
                self.tuning_count += 1
                self._seen.add(key)
                open(path, "w").close()
        return super().compile(kernels, graph_name)


class ForgetfulTuningBackend(TuningBackend):
    persistent = False
'''


@pytest.fixture(autouse=True)
def _plugins_restored() -> Iterator[None]:
    """The kit, run in this process, routes ``--coil-device`` to the backend it tests and
    leaves it there: later tests in the process (the freezing tests' packed convolutions)
    would get that backend instead of the C++ plugin."""
    yield
    plugins.reset()


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module ``coil_conformance_fakes`` of fake backends, importable (also by subprocesses)."""
    (tmp_path / "coil_conformance_fakes.py").write_text(textwrap.dedent(FAKES))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "coil_conformance_fakes"
    sys.modules.pop("coil_conformance_fakes", None)


def _pytest(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, collections.Counter, str, str]:
    """Run pytest in this process: (exit status, kit outcomes by kind, stdout, stderr)."""
    collector = ScoreCollector()
    status = int(pytest.main(["-p", "no:cacheprovider", *argv], plugins=[collector]))
    out, err = capsys.readouterr()
    return status, collections.Counter(o for _, o, _ in collector.outcomes.values()), out, err


def _kit(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, collections.Counter, str, str]:
    return _pytest(capsys, "--pyargs", "coil.sdk.testing", "--coil-device=cpu", *argv)


def _scorecard(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    status = cli.main(["conformance", *argv])
    out = capsys.readouterr().out
    return status, out[out.index("Coil conformance scorecard"):]


def _row(card: str, tier: str) -> str:
    return next(line for line in card.splitlines() if line.strip().startswith(tier + " "))


# -- the shipped CPU plugin -------------------------------------------------------------------

def test_cpu_plugin_passes_every_tier_it_declares(tmp_path: Path) -> None:
    """``coil conformance cpu`` in a fresh process: the kit as a vendor runs it."""
    done = subprocess.run([sys.executable, "-m", "coil.cli", "conformance", "cpu"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    card = done.stdout[done.stdout.find("Coil conformance scorecard"):]
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    for tier in ("runtime", "pointwise", "reductions", "views_indexing", "fusion", "memory_reuse",
                 "backward", "dynamic_shapes", "templates", "host_programs"):  # templates: the C++ GEMM template
        name, passed, failed, skipped, xfail, verdict = _row(card, tier).split()
        assert (verdict, failed, skipped) == ("PASS", "0", "0") and int(passed) > 0, _row(card, tier)
    assert _row(card, "autotune_cache").endswith("SKIPPED: capabilities.autotune is False")
    assert "overall: CONFORMANT: 10 tier(s) passed" in card
    assert "backend cpu_cpp" in card


def test_triton_plugin_passes_every_tier_under_the_interpreter(tmp_path: Path) -> None:
    """The Triton plugin, its kernels run by Triton's interpreter on CPU tensors: every tier
    passes, templates too (the shipped Triton GEMM template, in float16 and bfloat16). The autotune tier runs with a backend that tunes as on the GPU
    (tuning every kernel of the other tiers under the interpreter would take minutes)."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", COIL_CACHE_DIR=str(tmp_path / "cache"))
    passed = 0
    for factory, tiers in (("interpreted_backend", "runtime,pointwise,reductions,views_indexing,fusion,"
                                                   "memory_reuse,backward,dynamic_shapes,templates"),
                           ("conformance_backend", "autotune_cache")):
        done = subprocess.run([sys.executable, "-m", "coil.cli", "conformance", "cpu", "--backend",
                               f"coil_cuda_triton.testing:{factory}", "--tiers", tiers], cwd=tmp_path,
                              capture_output=True, text=True, timeout=900, env=env)
        card = done.stdout[done.stdout.find("Coil conformance scorecard"):]
        assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
        assert "backend cuda_triton" in card
        for tier in tiers.split(","):
            verdict = _row(card, tier).split()[5]
            assert verdict == "PASS", _row(card, tier)
            passed += verdict == "PASS"
    assert passed == 10


# -- capability-based skipping, routing, the scorecard -----------------------------------------

def test_tiers_the_capabilities_lack_are_skipped_not_passed(fakes: str, capsys: pytest.CaptureFixture) -> None:
    cpu_backend = plugins.registry().backend_for("cpu")
    status, card = _scorecard(
        capsys, "cpu", "--backend", f"{fakes}:LimitedBackend",
        "--tiers", "pointwise,reductions,backward,dynamic_shapes,templates,autotune_cache",
        "--pytest-args", "-k 'not pointwise or float_dtypes'")
    assert status == 0, card
    assert "backend cpu_cpp" in card
    assert _row(card, "reductions").endswith("SKIPPED: capabilities.reductions is empty")
    assert _row(card, "backward").endswith("SKIPPED: capabilities.backward is False")
    assert _row(card, "dynamic_shapes").endswith("SKIPPED: capabilities.dynamic_shapes is False")
    assert _row(card, "templates").endswith(
        "SKIPPED: capabilities.templates and capabilities.template_dialects are empty")
    pointwise = _row(card, "pointwise").split()
    assert pointwise[1:5] == ["2", "0", "2", "0"], pointwise  # float32/64 ran, half types skipped
    assert "capabilities.dtypes lacks torch.float16" in _row(card, "pointwise")
    assert "overall: CONFORMANT: 1 tier(s) passed; skipped (capabilities): reductions" in card
    assert plugins.registry().backend_for("cpu") is cpu_backend  # the routing was undone


def test_scorecard_fails_a_wrong_backend(fakes: str, capsys: pytest.CaptureFixture) -> None:
    status, card = _scorecard(capsys, "cpu", "--backend", f"{fakes}:CorruptingBackend",
                              "--tiers", "runtime")
    assert status == 1
    row = _row(card, "runtime").split()
    assert row[-1] == "FAIL" and int(row[2]) >= 3, row
    assert "overall: NOT CONFORMANT: runtime failed" in card


def test_scorecard_rejects_unknown_tiers(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["conformance", "cpu", "--tiers", "runtime,warp_speed"]) == 2
    assert "known tiers: runtime" in capsys.readouterr().out


def test_bad_backend_spec_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    status, _, _, err = _kit(capsys, "--coil-backend=coil_no_such_module:make")
    assert status == pytest.ExitCode.USAGE_ERROR
    assert "--coil-backend=coil_no_such_module:make: cannot import coil_no_such_module" in err


def test_kit_without_a_device_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    status, _, _, err = _pytest(capsys, "--pyargs", "coil.sdk.testing", "--coil-tiers=runtime")
    assert status == pytest.ExitCode.USAGE_ERROR
    assert "needs the device under test" in err and "--coil-device=NAME" in err


def test_plugin_is_inert_in_other_sessions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "test_plain.py").write_text(textwrap.dedent('''
        def test_plain(request):
            pm = request.config.pluginmanager
            assert pm.get_plugin("coil_conformance") is not None  # loaded through pytest11...
            assert pm.get_plugin("coil-conformance-session") is None  # ...but inactive
    '''))
    status, _, out, _ = _pytest(capsys, str(tmp_path / "test_plain.py"))
    assert status == 0 and "1 passed" in out, out


# -- the autotune_cache tier -------------------------------------------------------------------

@pytest.mark.parametrize(("factory", "passes"), [("TuningBackend", True), ("ForgetfulTuningBackend", False)])
def test_autotune_cache_tier(capsys: pytest.CaptureFixture, fakes: str, factory: str, passes: bool) -> None:
    status, outcomes, out, _ = _kit(capsys, f"--coil-backend={fakes}:{factory}", "--coil-tiers=autotune_cache")
    if passes:
        assert (status, outcomes) == (0, {"passed": 1}), out
    else:
        assert (status, outcomes) == (1, {"failed": 1}), out
        assert "a fresh process with a warm COIL_CACHE_DIR tuned" in out


# -- the opinfo tier and its expected-failures file ----------------------------------------------

def _opinfo(capsys: pytest.CaptureFixture, xfail_file: Path, *extra: str) -> tuple[int, collections.Counter, str]:
    status, outcomes, out, _ = _kit(capsys, "--coil-tiers=opinfo", "--coil-opinfo-ops=abs,neg",
                                    "--coil-opinfo-samples=1", f"--coil-expected-failures={xfail_file}",
                                    *extra)
    return status, outcomes, out


def test_expected_failures_file(capsys: pytest.CaptureFixture, fakes: str, tmp_path: Path) -> None:
    xfail_file = tmp_path / "cpu_expected_failures.txt"
    wrong = f"--coil-backend={fakes}:CorruptingBackend"

    status, outcomes, out = _opinfo(capsys, xfail_file, wrong, "--coil-update-expected-failures")
    assert (status, outcomes) == (1, {"failed": 2}), out
    assert set(expected.read(xfail_file)) == {"abs", "neg"}
    assert "mismatch" in expected.read(xfail_file)["abs"]

    status, outcomes, out = _opinfo(capsys, xfail_file, wrong)  # known failures: the run passes
    assert (status, outcomes) == (0, {"xfailed": 2}), out

    status, outcomes, out = _opinfo(capsys, xfail_file)  # the real backend: they now pass
    assert (status, outcomes) == (0, {"xpassed": 2}), out
    assert "expected failures that now pass" in out and "abs (drop it from" in out

    xfail_file.write_text("abs  # known\n")
    status, outcomes, out = _opinfo(capsys, xfail_file, wrong)  # neg is a new failure
    assert (status, outcomes) == (1, {"xfailed": 1, "failed": 1}), out
    assert "FAILED" in out and "test_opinfo[neg]" in out


# -- small pieces ----------------------------------------------------------------------------

def test_parse_tiers() -> None:
    assert tiers.parse_tiers(None) == tiers.DEFAULT_TIERS and "opinfo" not in tiers.DEFAULT_TIERS
    assert tiers.parse_tiers("pointwise,runtime", opinfo=True) == ("runtime", "pointwise", "opinfo")
    with pytest.raises(ValueError, match="known tiers"):
        tiers.parse_tiers("runtime,bogus")


def test_expected_failures_update_keeps_untested_entries(tmp_path: Path) -> None:
    old = {"abs": "old reason", "cumsum": "not tested this time", "neg": ""}
    new = expected.updated(old, failing={"abs": "mismatch (sample 0): x"}, tested={"abs", "neg"})
    assert new == {"abs": "mismatch (sample 0): x", "cumsum": "not tested this time"}
    path = tmp_path / "x.txt"
    expected.write(path, new, "cpu")
    assert expected.read(path) == new
