"""Tier ``reductions``: every reduction kind the device declares (``Capabilities.reductions``)
over the inner dim, an outer dim, several dims and all of them, with odd sizes; a pointwise
prologue and epilogue fuse into the reduction's kernel."""
from __future__ import annotations

import pytest
import torch

from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("reductions")

#: torch function -> the reduction kind it lowers to (``Capabilities.reductions`` names).
KINDS = {
    "sum": "sum", "prod": "prod", "amax": "max", "amin": "min", "argmax": "argmax",
    "argmin": "argmin", "any": "any", "all": "all", "mean": "sum", "var": "welford",
}


def _input(op: str) -> torch.Tensor:
    x = torch.randn(23, 37)
    if op in ("any", "all"):
        return x > 0.5 if op == "any" else x > -1.5
    if op == "prod":
        return x.clamp(0.8, 1.2)
    return x


@pytest.mark.parametrize("op", list(KINDS))
def test_reduction_inner_outer_and_all_dims(coil_kit: Kit, op: str) -> None:
    coil_kit.require_reductions(KINDS[op])
    fn = getattr(torch, op)
    report = coil_kit.check(lambda x: (fn(x, -1), fn(x, 0), fn(x)), _input(op), atol=1e-4, rtol=1e-4)
    coil_kit.assert_kernels(report)
    coil_kit.assert_no_fallbacks(report)


def test_several_dims_and_keepdim(coil_kit: Kit) -> None:
    coil_kit.require_reductions("sum", "max")
    x = torch.randn(5, 6, 7)
    report = coil_kit.check(lambda x: (x.sum((0, 2), keepdim=True), x.amax((1, 2))), x, atol=1e-4)
    coil_kit.assert_kernels(report)
    coil_kit.assert_no_fallbacks(report)


def test_large_full_reduction(coil_kit: Kit) -> None:
    coil_kit.require_reductions("sum", "max")
    report = coil_kit.check(lambda x: (x.sum(), x.amax()), torch.randn(100_003), atol=1e-2, rtol=1e-4)
    coil_kit.assert_kernels(report)


def test_nan_propagates_through_max_and_argmax(coil_kit: Kit) -> None:
    coil_kit.require_reductions("max", "argmax")
    x = torch.randn(6, 31)
    x[2, 5] = float("nan")
    coil_kit.check(lambda x: (x.amax(-1), x.argmax(-1), x.max(0)), x)


def test_prologue_and_epilogue_fuse(coil_kit: Kit) -> None:
    coil_kit.require_reductions("sum")
    # divided by the row length, the exponent stays near 1: with ``/ 3`` it reached ~25 on some
    # random inputs, where exp turns the sum's last-bit rounding into a relative error above
    # the default rtol (a flaky failure, 1.14e-5 against 1e-5, on a correct backend)
    report = coil_kit.check(lambda x: ((x * 2 + 1).sum(-1) / 50).exp(), torch.randn(16, 50), atol=1e-4)
    coil_kit.assert_kernels(report, count=1)
    coil_kit.assert_no_fallbacks(report)
