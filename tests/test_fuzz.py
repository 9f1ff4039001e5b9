"""The fuzzer in CI: a fixed, derandomized set of random programs (tests/fuzz) mixing Coil
kernels, ATen fallbacks, library calls, views and in-place updates over random strides,
channels_last and storage offsets, compiled with Coil and compared with eager, forward and
backward. A failure is minimised and saved as a standalone repro script (its path is in the
message; ``COIL_FUZZ_REPRO_DIR`` chooses the folder). ``COIL_FUZZ_EXAMPLES`` changes the
number of programs; long runs use ``python -m tests.fuzz.runner``."""
from __future__ import annotations

import os
import sys
import tempfile
import types
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from fuzz import harness, repro
from fuzz.campaign import Tally, failure_key
from fuzz.ops import FAMILIES
from fuzz.programs import InputSpec, Program, Step, load, programs
from fuzz.runner import check, minimize, pytorch_fails_too

#: 250 programs: the whole file takes 148 s under pytest on this 2-core machine (load ~1);
#: most of it is C++ compiles of the kernels (each program compiles 1-3 graphs).
EXAMPLES = int(os.environ.get("COIL_FUZZ_EXAMPLES", "250"))
TALLY = Tally()
FAILED: dict[str, str] = {}


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(programs())
def test_random_programs_match_eager(program: Program) -> None:
    source = repr(program)
    if source in FAILED:  # hypothesis runs a failing example again to report it
        pytest.fail(FAILED[source], pytrace=False)
    outcome = check(program)
    TALLY.add(program, outcome)
    if not outcome.failed:
        return
    if pytorch_fails_too(program, outcome):
        outcome.origin = "pytorch: aot_eager fails too"
    small = minimize(program, outcome, max_trials=40)
    folder = Path(os.environ.get("COIL_FUZZ_REPRO_DIR") or tempfile.mkdtemp(prefix="coil-fuzz-"))
    path = repro.save(small, str(outcome), folder / f"fuzz-{failure_key(outcome)}.py")
    message = f"{outcome}\nminimal program (repro script: {path}):\n{small!r}"
    if outcome.origin.startswith("pytorch"):
        warnings.warn(f"not Coil's bug: {message}", stacklevel=1)  # Coil cannot fix it
        return
    FAILED[source] = message
    pytest.fail(message, pytrace=False)


def test_the_programs_reached_every_kind_of_op() -> None:
    # Guards the generator: a change that made most programs skip, or stopped drawing a
    # family, would leave the fuzzer above passing while testing little.
    total = sum(TALLY.statuses.values())
    if total < EXAMPLES:
        pytest.skip("runs after test_random_programs_match_eager, in the same session")
    summary = TALLY.summary(0.0)
    assert TALLY.statuses["skip"] <= total // 5, summary
    assert set(TALLY.families) == set(FAMILIES), summary
    assert TALLY.fallbacks and TALLY.library and TALLY.kernels, summary


def _sample_program() -> Program:
    inputs = [InputSpec("a0", (2, 3, 4, 5), "float32", 1, layout="channels_last", requires_grad=True),
              InputSpec("a1", (5, 2), "float32", 2, layout="strided", dim=1, step=2, start=1)]
    steps = [Step("v0", "torch.relu(a0)", "pointwise"),
             Step("v1", "F.max_pool2d(v0, 2, stride=1, padding=0, ceil_mode=False)", "fallback"),
             Step(None, "a1[1:, ::2].add_(v1.amax())", "inplace"),
             Step("v2", "v1.permute(0, 2, 1, 3) @ a1[:4]", "library")]
    return Program(inputs, steps, ["v2", "v0"], backward=True, precision="float32")


def test_program_source_runs_and_prints_as_python() -> None:
    program = _sample_program()
    ns = load(program)
    out = ns["program"](*ns["make_inputs"]())
    assert [tuple(o.shape) for o in out] == [(2, 3, 3, 2), (2, 3, 4, 5)]
    assert "v1 = F.max_pool2d(v0, 2" in repr(program)
    assert ns["make_inputs"]()[0].is_contiguous(memory_format=torch.channels_last)


def test_repro_script_is_standalone_and_reports_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    text = repro.script(_sample_program(), "sample")
    assert "import fuzz" not in text and "from fuzz" not in text
    module = types.ModuleType("fuzz_repro")  # the script defines dataclasses: give it a module
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(text, "repro.py", "exec"), module.__dict__)  # noqa: S102 - the script under test
    ns = module.__dict__
    assert ns["main"](ns["program"], ns["make_inputs"], backward=True, precision=torch.float32) == 0
    assert Program.from_json(text.split(repro.MARKER)[1]).to_source() == _sample_program().to_source()


def test_a_wrong_result_is_caught_and_minimised(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for a miscompile: the compiled side's last output is off by 1e-2.
    program = Program([InputSpec("a0", (3, 4), "float32", 5)],
                      [Step("v0", "a0 * 2", "pointwise"), Step("v1", "torch.tanh(v0)", "pointwise"),
                       Step("v2", "v0.sum(dim=(1,), keepdim=False)", "reduction")],
                      ["v2", "v1"], backward=False)
    real_collect = harness.collect

    def skewed(fn, make_inputs, backward, weight_seed=1234):
        result = real_collect(fn, make_inputs, backward, weight_seed)
        if fn is not None and hasattr(fn, "_torchdynamo_orig_callable"):
            result.outputs[-1] = result.outputs[-1] + 1e-2
        return result

    monkeypatch.setattr(harness, "collect", skewed)
    outcome = check(program)
    assert outcome.status == "mismatch" and outcome.phase == "output"
    small = minimize(program, outcome)
    assert len(small.steps) == 1, small
    assert small.outputs and check(small).signature == outcome.signature
