"""Triton scatter kernels define every loop variable their values use, index values included:
a position embedding's backward scatters into rows given by ``arange`` over the tokens, a
value that is a loop variable (the kernel read an undefined ``r0`` before)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from coil.report import recording
from helpers import cpu_routed_to, cpu_tensors


def test_position_embedding_backward_through_triton():
    def positions(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1]).unsqueeze(0)
        return ((F.embedding(pos, w) + x) * 2).sum()

    with cpu_tensors():
        torch.manual_seed(0)
        w = torch.randn(64, 16, requires_grad=True)
        x = torch.randn(2, 32, 16)
        positions(w, x).backward()
        want = w.grad.clone()
        w.grad = None
        with cpu_routed_to("triton", "scatter-index-tests"), recording() as report:
            torch.compile(positions, backend="coil")(w, x).backward()
    torch.testing.assert_close(w.grad, want)
    backward = [g for g in report.graphs if g.kind == "backward"]
    assert backward and any("atomic" in k.source or "scatter" in k.name for g in backward for k in g.kernels), \
        [k.name for g in backward for k in g.kernels]
