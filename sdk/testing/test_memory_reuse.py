"""Tier ``memory_reuse``: Coil's memory planner, on the device. A chain of kernels keeps at
most two full-size buffers alive (planned peak below the naive sum of every buffer), reused
buffers give correct results, inputs are never overwritten and outputs of one call survive
the next."""
from __future__ import annotations

import pytest
import torch

from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("memory_reuse")

SHAPE = (64, 128)


def _chain(x: torch.Tensor) -> torch.Tensor:
    """Softmax over alternating dims: each step a separate kernel writing a full-size buffer."""
    for i in range(4):
        x = torch.softmax(x * 1.5, i % 2)
    return x


def test_chain_peak_below_naive_sum(coil_kit: Kit) -> None:
    coil_kit.require_reductions("max", "sum")
    x = torch.randn(SHAPE)
    report = coil_kit.check(_chain, x, atol=1e-5, rtol=1e-4)
    kernels = coil_kit.assert_kernels(report)
    full = x.numel() * x.element_size()
    naive = len(kernels) * full  # every kernel's full-size output kept alive
    assert len(kernels) >= 3, f"expected a chain of kernels, got {[k.name for k in kernels]}"
    assert report.peak_bytes < naive, f"planned peak {report.peak_bytes} B, naive sum {naive} B"
    assert report.peak_bytes <= 2.5 * full, (
        f"planned peak {report.peak_bytes} B keeps more than two {full} B buffers alive")


def test_inputs_are_never_overwritten(coil_kit: Kit) -> None:
    coil_kit.require_reductions("max", "sum")
    x = torch.randn(SHAPE)
    compiled = coil_kit.compile(_chain)
    x_device = coil_kit.to_device(x)
    first = compiled(x_device)
    coil_kit.assert_close(x_device, x, atol=0, rtol=0, msg="the input changed: ")
    coil_kit.assert_close(compiled(x_device), coil_kit.to_cpu(first), atol=0, rtol=0)


def test_outputs_survive_later_calls(coil_kit: Kit) -> None:
    coil_kit.require_reductions("max", "sum")
    compiled = coil_kit.compile(_chain)
    inputs = [torch.randn(SHAPE) for _ in range(3)]
    outputs = [compiled(coil_kit.to_device(x)) for x in inputs]
    for i, (x, out) in enumerate(zip(inputs, outputs)):
        coil_kit.assert_close(out, _chain(x), atol=1e-5, rtol=1e-4, msg=f"output of call {i}: ")
