"""Functional collectives in one process: where Coil's wrapper starts a collective and waits
for it (:mod:`coil.collectives`), checked in the test process with a gloo process group of one
rank, so collectives run and nothing waits: a gathered input's memory is not reused while the
gather is in flight, the ``collective_overlap`` knob, and collectives kept in graph order.

``tests/test_distributed.py`` runs collectives, DDP and FSDP2 across processes."""
from __future__ import annotations

import os
import socket
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

FUNCOL = torch.ops._c10d_functional
DEVICE = os.environ.get("COIL_TEST_DEVICE", "cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world_of_one():
    """A gloo process group of one rank in this process: collectives run, nothing waits."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()


def _wrapper(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    import coil
    report = coil.explain(fn, *args)
    assert len(report.graphs) == 1
    return report.graphs[0].wrapper_source, report


def _buffers_between(wrapper: str, first: str, last: str) -> list[str]:
    lines = wrapper.splitlines()
    i = next(n for n, line in enumerate(lines) if first in line)
    j = next(n for n, line in enumerate(lines) if last in line)
    return lines[i + 1:j]


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU only")
def test_gathered_input_not_reused_while_in_flight(world_of_one):
    """An all-gather reads its input until its wait: the dead input's memory is not handed to
    the kernel that runs meanwhile (it was before: ``buf4 = reinterpret(buf0, ...)``)."""
    group = world_of_one

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.relu(x) * 2
        g = FUNCOL.wait_tensor(FUNCOL.all_gather_into_tensor(a, 1, group))
        return g + 1, torch.sin(w) * 3  # same size as a: a candidate for a's memory

    x, w = torch.randn(64, 64), torch.randn(64, 64)
    wrapper, report = _wrapper(fn, x, w)
    torch.testing.assert_close(report.result, fn(x, w))
    start = next(line for line in wrapper.splitlines() if "# start" in line)
    gathered = start.split("(")[1].split(",")[0]  # the all-gather's input buffer
    between = _buffers_between(wrapper, "# start", "# wait for")
    assert any("_sin" in line for line in between), wrapper  # the kernel did move before the wait
    assert not any(f"reinterpret({gathered}," in line or f"del {gathered}" == line.strip() for line in between), wrapper


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU only")
def test_overlap_knob_off_waits_right_after(world_of_one):
    group = world_of_one
    from coil import config

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = FUNCOL.wait_tensor(FUNCOL.all_reduce(x, "sum", group))
        return y * 2, torch.tanh(w @ w)

    x, w = torch.randn(8, 8), torch.randn(32, 32)
    with config.override(collective_overlap=False):
        wrapper, report = _wrapper(fn, x, w)
    torch.testing.assert_close(report.result, fn(x, w))
    lines = [line.strip() for line in wrapper.splitlines()]
    start = next(i for i, line in enumerate(lines) if "# start" in line)
    assert "# wait for" in lines[start + 1], wrapper
    assert report.collectives and "nothing in flight" in report.collectives[0], report.collectives


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU only")
def test_collectives_keep_graph_order(world_of_one):
    """Every rank must issue collectives in one order: a later collective whose input is
    ready first does not start before an earlier one."""
    group = world_of_one

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = FUNCOL.all_reduce(torch.exp(x).sum(0), "sum", group)  # needs a kernel first
        b = FUNCOL.all_reduce(y, "sum", group)  # ready at once
        return FUNCOL.wait_tensor(a) + 1, FUNCOL.wait_tensor(b) * 2

    x, y = torch.randn(16, 16), torch.randn(16)
    wrapper, report = _wrapper(fn, x, y)
    torch.testing.assert_close(report.result, fn(x, y))
    starts = [line for line in wrapper.splitlines() if "# start" in line]
    assert len(starts) == 2 and "arg1" in starts[1], wrapper
