"""The C++ plugin's measured schedules (plugins/cpu_cpp/autotune.py): a large kernel is
compiled in several schedules, timed at its first launch and the fastest kept and cached;
every schedule computes eager's values, bit for bit the rule's; kernels that cannot run twice
on their arguments are not tuned. ``MIN_BYTES`` is lowered so that small kernels count as
large."""
from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F

import coil

from conftest import TEST_BACKEND
from helpers import check

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cpu_cpp", reason="C++ plugin codegen")


@pytest.fixture
def tuning(monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture):
    """Kernels of 64 KiB and up tuned, choices in a fresh cache folder; yields a function that
    returns the choices logged since the last call."""
    from coil_cpu_cpp import autotune
    monkeypatch.setattr(autotune, "MIN_BYTES", 1 << 16)
    caplog.set_level(logging.DEBUG, logger="coil_cpu_cpp.autotune")

    def chosen() -> list[str]:
        out = [r.getMessage() for r in caplog.records if " chosen " in r.getMessage()]
        caplog.clear()
        return out

    with coil.config.override(cache_dir=str(tmp_path), **{"cpu_cpp.autotune": True}):
        yield chosen


def _transpose_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y.t()


def test_a_transpose_is_tuned_once_and_the_choice_cached(tuning, tmp_path) -> None:
    """Tiles of 32 (the rule) and 64 are compiled and timed at the first call; the
    choice is stored, and a second compile of the graph builds only the chosen schedule (no
    timing). Results as eager's both times."""
    x, y = torch.randn(160, 384), torch.randn(384, 160)
    check(_transpose_add, x, y)
    first = tuning()
    assert len(first) == 1 and "tile-64" in first[0], first
    from coil_cpu_cpp import autotune
    store = autotune.choices().store
    stored = [json.loads(store.read(p.stem, ".json")) for p in (tmp_path / "cpu-autotune").glob("*.json")]
    assert len(stored) == 1 and set(stored[0]["ms"]) == {"rule", "tile-64"}, stored
    torch._dynamo.reset()
    report = check(_transpose_add, x, y)
    assert tuning() == []
    assert report.kernels[0].source.count('extern "C"') == 1


def test_every_schedule_computes_the_rule_s_values_bit_for_bit(tuning, monkeypatch, tmp_path_factory) -> None:
    """Each variant made the winner in turn (the timings replaced): a layer norm (prefetch),
    a pointwise chain and a row-wise softmax (streaming stores), a transpose (tiles) give the
    untuned compile's values exactly, with one and two threads."""
    from coil_cpu_cpp import autotune
    x, y, w = torch.randn(96, 1024), torch.randn(1024, 96), torch.randn(1024)
    cases = [(lambda x: F.layer_norm(x, (1024,), w, w), (x,)), (lambda x: (x.sin() * 3).sigmoid() + x, (x,)),
             (lambda x: x.softmax(-1), (x,)), (_transpose_add, (x, y))]
    before = torch.get_num_threads()
    tuned: dict[int, set[str]] = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for fn, args in cases:
                torch._dynamo.reset()
                with coil.config.override(**{"cpu_cpp.autotune": False}):
                    expected = torch.compile(fn, backend="coil")(*args)
                for variant in autotune.VARIANTS[1:]:
                    monkeypatch.setattr(autotune, "VARIANTS", (autotune.RULE, variant))
                    monkeypatch.setattr(autotune, "_timings",
                                        lambda fns, args, v=variant.name: {n: 0.0 if n == v else 1.0 for n in fns})
                    torch._dynamo.reset()
                    with coil.config.override(cache_dir=str(tmp_path_factory.mktemp("tune"))):
                        got = torch.compile(fn, backend="coil")(*args)
                    assert torch.equal(got, expected), (variant, threads)
                    if any(f": {variant.name} chosen" in m for m in tuning()):
                        tuned.setdefault(cases.index((fn, args)), set()).add(variant.name)
                monkeypatch.undo()
                monkeypatch.setattr(autotune, "MIN_BYTES", 1 << 16)
    finally:
        torch.set_num_threads(before)
    assert sorted(tuned) == [0, 1, 2, 3], tuned  # every case had a schedule besides the rule's
    assert set().union(*tuned.values()) >= {"streaming", "no-prefetch", "tile-64"}, tuned


def test_kernels_that_cannot_run_twice_or_are_small_are_not_tuned(tuning, monkeypatch) -> None:
    """An in-place update of an input reads what it writes; a kernel below ``MIN_BYTES`` is
    not worth a compile; the option turns tuning off."""
    x, y = torch.randn(160, 384), torch.randn(384, 160)

    def update(x, y):
        x.mul_(0.5).add_(y.t())
        return x[0, :8] * 2  # a small kernel of its own

    x1, x2 = x.clone(), x.clone()
    got = torch.compile(update, backend="coil")(x1, y)
    torch.testing.assert_close(got, update(x2, y))
    torch.testing.assert_close(x1, x2)  # updated once
    assert tuning() == []
    check(_transpose_add, torch.randn(8, 16), torch.randn(16, 8))
    assert tuning() == []
    with coil.config.override(**{"cpu_cpp.autotune": False}):
        check(_transpose_add, x, y)
    assert tuning() == []
