"""Tier ``fusion``: the patterns that matter most for memory traffic become one kernel on the
device each: softmax, log-softmax, layer norm, RMS norm, bias + GELU + residual."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import pytest

from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("fusion")

ROWS, COLS = 37, 129


def _one_kernel(kit: Kit, fn, *args) -> None:
    report = kit.check(fn, *args, atol=1e-4, rtol=1e-4)
    kit.assert_kernels(report, count=1)
    kit.assert_no_fallbacks(report)


def test_softmax(coil_kit: Kit) -> None:
    coil_kit.require_reductions("max", "sum")
    _one_kernel(coil_kit, lambda x: torch.softmax(x, -1), torch.randn(ROWS, COLS))


def test_log_softmax(coil_kit: Kit) -> None:
    coil_kit.require_reductions("max", "sum")
    _one_kernel(coil_kit, lambda x: F.log_softmax(x * 0.5, -1), torch.randn(ROWS, COLS))


def test_layer_norm(coil_kit: Kit) -> None:
    coil_kit.require_reductions("welford")
    w, b = torch.randn(COLS), torch.randn(COLS)
    _one_kernel(coil_kit, lambda x, w, b: F.layer_norm(x, (COLS,), w, b), torch.randn(ROWS, COLS), w, b)


def test_rms_norm(coil_kit: Kit) -> None:
    coil_kit.require_reductions("sum")
    w = torch.randn(COLS)
    _one_kernel(coil_kit, lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                torch.randn(ROWS, COLS), w)


def test_bias_gelu_residual(coil_kit: Kit) -> None:
    x, b, res = torch.randn(ROWS, COLS), torch.randn(COLS), torch.randn(ROWS, COLS)
    _one_kernel(coil_kit, lambda x, b, res: F.gelu(x + b) + res, x, b, res)
