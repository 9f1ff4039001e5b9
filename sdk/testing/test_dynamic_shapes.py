"""Tier ``dynamic_shapes``: with ``dynamic=True`` one symbolic compile (kernels taking sizes
as arguments) serves every later size, on the device, and each result matches eager."""
from __future__ import annotations

import pytest
import torch

from coil.sdk.testing.kit import CountingCompiler, Kit, recording

pytestmark = pytest.mark.coil_tier("dynamic_shapes")


def _one_compile_for_all(kit: Kit, fn, inputs: list[tuple[torch.Tensor, ...]], tol: float) -> None:
    counter = CountingCompiler()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=counter, dynamic=True)
    with recording() as report:
        for args in inputs:
            out = compiled(*kit.to_device(args))
            kit.assert_on_device(out)
            sizes = [tuple(a.shape) for a in args]
            kit.assert_close(out, fn(*args), atol=tol, rtol=tol, msg=f"sizes {sizes}: ")
    assert counter.calls == 1, f"{counter.calls} compiles for {len(inputs)} sizes"
    assert report.graphs and all(g.symbolic for g in report.graphs), "the graph has no symbolic sizes"
    kit.assert_kernels(report)
    kit.assert_no_fallbacks(report)


def test_pointwise_with_broadcast(coil_kit: Kit) -> None:
    sizes = [(3, 16), (17, 16), (64, 16)]
    inputs = [(torch.randn(n, m), torch.randn(m)) for n, m in sizes]
    _one_compile_for_all(coil_kit, lambda x, b: torch.sigmoid(x + b) * 2 - x, inputs, 1e-5)


def test_reductions_over_symbolic_dims(coil_kit: Kit) -> None:
    coil_kit.require_reductions("max", "sum")
    inputs = [(torch.randn(n, n + 3),) for n in (5, 9, 33, 100)]
    _one_compile_for_all(coil_kit, lambda a: torch.softmax(a * 2, -1).sum(0) + a.amax(0), inputs, 1e-4)
