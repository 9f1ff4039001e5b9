"""A value that is an exact widening of a half-precision one, stored for several users, is
stored in the narrow type (``coil.graph.GraphLowering._store``): autocast's batch-norm
backward upcasts every bf16 gradient and reads it twice, and storing it in float32 doubled
that buffer (ResNet-18 on the H200: a 196 MiB float32 buffer at the backward's peak).
Results stay eager's; the planned peak memory shrinks."""
from __future__ import annotations

import pytest
import torch

from coil import graph as coil_graph

from helpers import check


def _widened_twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 value with enough work in it to be stored, widened, then read by a column sum
    and by a pointwise user (the shape of a batch-norm backward)."""
    y = torch.tanh(torch.sigmoid(x * 1.5 + 0.25) * x - 0.5) * torch.exp(-x.abs())
    for k in range(6):
        y = y * (1.0 + 0.01 * k) + torch.sin(x) * 0.1
    wide = y.float()
    return wide.sum(0), (wide - wide.mean(0)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_widened_value_is_stored_narrow_and_matches_eager(dtype, monkeypatch):
    x = torch.randn(64, 48).to(dtype)
    narrow = check(_widened_twice, x, atol=1e-3, rtol=1e-3)
    monkeypatch.setattr(coil_graph, "_widened_from", lambda body: None)
    wide = check(_widened_twice, x, atol=1e-3, rtol=1e-3)
    # the stored intermediate (64 x 48) in 2 bytes a value instead of 4, and the half-precision
    # result written over it
    assert narrow.peak_bytes <= wide.peak_bytes - 64 * 48 * 2, (narrow.peak_bytes, wide.peak_bytes)


def test_a_widened_graph_output_keeps_its_type():
    """The widened value itself returned (a user that needs it in memory in its own type)."""
    x = torch.randn(32, 16).to(torch.bfloat16)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        wide = (torch.tanh(torch.sigmoid(x * 1.5) * x - 0.5) * torch.exp(-x.abs()) + torch.sin(x)).float()
        return wide, wide.sum(0), wide * 2

    report = check(fn, x, atol=1e-3, rtol=1e-3)
    assert [t.dtype for t in report.result] == [torch.float32] * 3


def test_only_exact_widenings_qualify():
    from coil import ir
    load = ir.Load(torch.float32, buffer="b", index=0)
    assert coil_graph._widened_from(ir.Cast(torch.float32, x=ir.Load(torch.bfloat16, buffer="b", index=0))) == torch.bfloat16
    assert coil_graph._widened_from(ir.Cast(torch.float64, x=load)) == torch.float32
    assert coil_graph._widened_from(ir.Cast(torch.bfloat16, x=load)) is None  # narrowing
    assert coil_graph._widened_from(ir.Cast(torch.float32, x=ir.Load(torch.int32, buffer="b", index=0))) is None
