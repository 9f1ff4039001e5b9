"""Tier ``pointwise``: chains of elementwise ops become one kernel on the device, with no
fallback, for every dtype the device declares; broadcasting, scalars, strided views, type
promotion and several outputs included."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coil.sdk.ops import SEED_HIGH, SEED_LOW
from coil.sdk.reference import philox_rand
from coil.sdk.testing.kit import Kit, recording

pytestmark = pytest.mark.coil_tier("pointwise")

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTEGERS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


def _one_kernel(kit: Kit, fn, *args, tol: float = 1e-5) -> None:
    report = kit.check(fn, *args, atol=tol, rtol=tol)
    kit.assert_kernels(report, count=1)
    kit.assert_no_fallbacks(report)


def test_chain_is_one_kernel(coil_kit: Kit) -> None:
    _one_kernel(coil_kit, lambda x: torch.sigmoid(x * 2 + 1).relu() - x.abs(), torch.randn(1000))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_dtypes(coil_kit: Kit, dtype: torch.dtype) -> None:
    coil_kit.require_dtype(dtype)
    x, b, res = (torch.randn(33, 65, dtype=dtype), torch.randn(65, dtype=dtype),
                 torch.randn(33, 65, dtype=dtype))
    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    _one_kernel(coil_kit, lambda x, b, res: F.gelu(x + b) * 0.5 + res, x, b, res, tol=tol)


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_dtypes(coil_kit: Kit, dtype: torch.dtype) -> None:
    coil_kit.require_dtype(dtype)
    a, b = torch.randint(0, 7, (5, 9)).to(dtype), torch.randint(1, 5, (5, 9)).to(dtype)
    _one_kernel(coil_kit, lambda a, b: (a * b + 3) // b - a % b + torch.maximum(a, b), a, b)


def test_bool(coil_kit: Kit) -> None:
    coil_kit.require_dtype(torch.bool)
    a, b = torch.randn(7, 11) > 0, torch.randn(7, 11) > 0
    _one_kernel(coil_kit, lambda a, b: (a & b) | ~a ^ (b == a), a, b)


def test_math_functions(coil_kit: Kit) -> None:
    def fn(x):
        y = x.abs() + 0.5
        return (torch.exp(x) + torch.log1p(y) + torch.tanh(x) + torch.erf(x) + torch.sqrt(y)
                + torch.sin(x) * torch.cos(x) + torch.floor(x) + torch.rsqrt(y) + torch.pow(y, 1.5))
    _one_kernel(coil_kit, fn, torch.randn(257), tol=1e-4)


def test_broadcast_scalars_and_where(coil_kit: Kit) -> None:
    x, y = torch.randn(4, 1, 8), torch.randn(3, 8)
    _one_kernel(coil_kit, lambda x, y: torch.where(x > 0, x + y * 2.5, -y).clamp(-1, 1), x, y)


def test_strided_views_of_inputs(coil_kit: Kit) -> None:
    x = torch.randn(12, 10)
    _one_kernel(coil_kit, lambda x: x.t()[::2, 1:] * 3 + x[1:, ::2].t(), x)


def test_type_promotion(coil_kit: Kit) -> None:
    coil_kit.require_dtype(torch.int32)
    a, b = torch.randint(-5, 5, (6, 7), dtype=torch.int32), torch.randn(6, 7)
    _one_kernel(coil_kit, lambda a, b: a * b + a / 3, a, b)


def test_several_outputs_share_one_kernel(coil_kit: Kit) -> None:
    x = torch.randn(9, 16)
    _one_kernel(coil_kit, lambda x: (x * 2, torch.relu(x) - 1, x.neg()), x)


def test_random_numbers(coil_kit: Kit) -> None:
    """With ``capabilities.random``: ``rand`` equals the reference Philox bit for bit (the
    graph's seed is its first draw from the device's generator), and dropout is one kernel
    whose kept elements are ``x * float32(1 / (1 - p))`` exactly."""
    coil_kit.require("random")
    p = 0.25
    x = coil_kit.to_device(torch.randn(64, 80) + 3.0)  # no zeros: dropped is exactly 0
    compiled = coil_kit.compile(lambda x: (torch.rand_like(x), F.dropout(x, p, training=True) * 2))
    torch.manual_seed(1234)
    with recording() as report:
        uniform, dropped = compiled(x)
    coil_kit.backend.synchronize()
    coil_kit.assert_kernels(report, count=1)
    coil_kit.assert_no_fallbacks(report)
    torch.manual_seed(1234)
    seed = torch.randint(SEED_LOW, SEED_HIGH, (), dtype=torch.int64, device=x.device)
    counters = torch.arange(x.numel(), device=x.device).view(x.shape)
    assert torch.equal(coil_kit.to_cpu(uniform), coil_kit.to_cpu(philox_rand(seed, counters)))
    dropped, x = coil_kit.to_cpu(dropped), coil_kit.to_cpu(x)
    kept = dropped != 0
    assert 0.6 < kept.float().mean() < 0.9, kept.float().mean()
    scale = torch.tensor(1 / (1 - p), dtype=torch.float32)
    assert torch.equal(dropped[kept], (x * scale * 2)[kept])
