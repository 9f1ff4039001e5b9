"""Tier ``host_programs``: a backend declaring ``Capabilities.host_programs`` (SDK 1.12.0) runs
each run of consecutive kernels as one host call, and nothing a caller sees changes: results
equal those of the launches one by one (bit for bit: the same kernels in the same order),
each call reads its own inputs (scratch memory reused from call to call holds nothing of the
last), an error a kernel raises one by one is raised through a program too, gradients match
eager, and two threads calling one compiled graph each get their own results. The graph's
report lists the programs its wrapper calls (``GraphInfo.programs``, SDK 1.13.0)."""
from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

from coil.sdk import config
from coil.sdk.testing.kit import Kit, recording

pytestmark = pytest.mark.coil_tier("host_programs")


def block(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two kernels at least on any backend: row statistics, then what reads them."""
    y = F.layer_norm(x, (x.shape[-1],))
    z = F.gelu(y) + x
    return z.softmax(-1).sum(0), z


def _programs(report: Any) -> list[str]:
    return [p for g in report.graphs for p in getattr(g, "programs", ())]


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def test_a_run_of_kernels_is_one_host_call(coil_kit: Kit) -> None:
    report = coil_kit.check(block, torch.randn(8, 64), atol=1e-4, rtol=1e-4)
    kernels = coil_kit.assert_kernels(report)
    assert len(kernels) >= 2, f"expected at least two kernels:\n{report}"
    programs = _programs(report)
    assert programs, f"no host program: the backend declares Capabilities.host_programs\n{report}"
    for program in programs:
        assert program.count(",") >= 1, f"a program of fewer than two kernels: {program}"


def test_results_equal_the_launches_one_by_one(coil_kit: Kit) -> None:
    x = torch.randn(16, 33)
    with_programs = coil_kit.check(block, x, atol=1e-4, rtol=1e-4)
    assert _programs(with_programs), f"no host program:\n{with_programs}"
    with config.override(host_programs=False):
        plain = coil_kit.check(block, x, atol=1e-4, rtol=1e-4)
    assert not _programs(plain), "host programs built with the host_programs knob off"
    for got, want in zip(_tensors(with_programs.result), _tensors(plain.result)):
        assert torch.equal(Kit.to_cpu(got), Kit.to_cpu(want)), "a host program changed a result"


def test_each_call_reads_its_own_inputs(coil_kit: Kit) -> None:
    compiled = coil_kit.compile(block)
    for seed in range(4):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed)) * (seed + 1)
        got = compiled(*coil_kit.to_device((x,)))
        coil_kit.backend.synchronize()
        coil_kit.assert_close(got, block(x), atol=1e-4, rtol=1e-4, msg=f"call {seed}: ")


def test_an_error_raised_launch_by_launch_is_raised_through_a_program(coil_kit: Kit) -> None:
    def gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        y = x.softmax(-1)
        return y[idx].sum(-1) * y.amax()

    x, bad = torch.randn(6, 32), torch.tensor([0, 7, 2])
    with config.override(host_programs=False):
        compiled = coil_kit.compile(gather)
        try:
            compiled(*coil_kit.to_device((x, bad)))
            coil_kit.backend.synchronize()
        except Exception:  # noqa: BLE001 - the backend reports bad indices: so must programs
            pass
        else:
            pytest.skip(f"the {coil_kit.device.type} kernels do not report an index out of range")
    compiled = coil_kit.compile(gather)
    good = torch.tensor([0, 5, 2])
    with recording() as report:
        coil_kit.assert_close(compiled(*coil_kit.to_device((x, good))), gather(x, good), atol=1e-5, rtol=1e-4)
    assert _programs(report), f"no host program:\n{report}"
    with pytest.raises(Exception):
        compiled(*coil_kit.to_device((x, bad)))
        coil_kit.backend.synchronize()


def test_gradients_through_programs(coil_kit: Kit) -> None:
    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, (x.shape[-1],), w)
        return (F.gelu(y) + x).softmax(-1).square().sum()

    report = coil_kit.check_grads(loss, torch.randn(8, 48, requires_grad=True),
                                  torch.randn(48, requires_grad=True), atol=1e-4, rtol=1e-3)
    assert _programs(report), f"no host program in the forward or backward graph:\n{report}"


def test_two_threads_calling_one_graph_get_their_own_results(coil_kit: Kit) -> None:
    compiled = coil_kit.compile(block)
    inputs = [torch.randn(8, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    expected = [block(x) for x in inputs]
    compiled(*coil_kit.to_device((inputs[0],)))  # compiled before the threads start
    failures: list[str] = []

    def run(i: int) -> None:
        (device_input,) = coil_kit.to_device((inputs[i],))
        for call in range(200):
            got = compiled(device_input)
            coil_kit.backend.synchronize()
            try:
                coil_kit.assert_close(got, expected[i], atol=1e-4, rtol=1e-4)
            except AssertionError as exc:
                failures.append(f"thread {i}, call {call}: {exc}")
                return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
