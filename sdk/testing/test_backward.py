"""Tier ``backward``: training through Coil on the device. Forward and backward graphs both
compile to kernels on the device, and every gradient matches eager's on the CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("backward")


def _backward_on_device(kit: Kit, report) -> None:
    kinds = {g.kind for g in report.graphs}
    assert {"forward", "backward"} <= kinds, f"graphs compiled: {sorted(kinds)}"
    backward = [g for g in report.graphs if g.kind == "backward"]
    assert any(kit.device_kernels(g) for g in backward), "no backward kernel on the device"
    kit.assert_kernels(report)
    kit.assert_no_fallbacks(report)


def test_pointwise_gradients(coil_kit: Kit) -> None:
    x = torch.randn(8, 16, requires_grad=True)
    y = torch.randn(8, 16, requires_grad=True)
    report = coil_kit.check_grads(lambda x, y: (torch.tanh(x) * y + x.sigmoid()).sum(), x, y)
    _backward_on_device(coil_kit, report)


def test_layer_norm_gradients(coil_kit: Kit) -> None:
    coil_kit.require_reductions("sum", "welford")
    x = torch.randn(12, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    g = torch.randn(12, 32)
    report = coil_kit.check_grads(lambda x, w, b, g: (F.layer_norm(x, (32,), w, b) * g).sum(),
                                  x, w, b, g, atol=1e-4)
    _backward_on_device(coil_kit, report)


def test_cross_entropy_gradients(coil_kit: Kit) -> None:
    coil_kit.require_reductions("sum", "max")
    logits = torch.randn(16, 10, requires_grad=True)
    target = torch.randint(0, 10, (16,))
    report = coil_kit.check_grads(lambda l, t: F.cross_entropy(l, t), logits, target, atol=1e-5)
    _backward_on_device(coil_kit, report)
