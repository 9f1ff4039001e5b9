"""Compiled autograd with Coil: the backward graph compiled autograd captures takes its
inputs as one list, which Coil's backend flattens (Dynamo's ``flatten_graph_inputs``); the
gradients equal eager's, with the forward compiled afresh and loaded by the training layer
before AOTAutograd (whose entry keeps the backward graph for compiled autograd)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from coil import config


def _grads(model: nn.Module, x: torch.Tensor, compiled: bool, steps: int = 2) -> list[list[torch.Tensor]]:
    f = torch.compile(model, backend="coil") if compiled else model
    out = []
    for _ in range(steps):
        model.zero_grad()
        if compiled:
            with torch._dynamo.compiled_autograd._enable(torch.compile(backend="coil")):
                f(x).square().mean().backward()
        else:
            f(x).square().mean().backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def _models() -> list[tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    conv = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 6 * 6, 3))
    return [(mlp, torch.randn(5, 8)), (conv, torch.randn(4, 3, 8, 8))]


@pytest.mark.parametrize("which", [0, 1], ids=["mlp", "conv_bn"])
def test_compiled_autograd_gradients_match_eager(which: int) -> None:
    model, x = _models()[which]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = _grads(model, x, compiled=False)
    model.load_state_dict(state)
    torch._dynamo.utils.counters.clear()
    got = _grads(model, x, compiled=True)
    assert torch._dynamo.utils.counters["compiled_autograd"]["captures"] >= 1
    for step_got, step_ref in zip(got, ref):
        for a, b in zip(step_got, step_ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.graph_cache
def test_compiled_autograd_after_a_training_layer_hit(tmp_path: Path, traces: list[int]) -> None:
    model, x = _models()[0]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = _grads(model, x, compiled=False, steps=1)
    with config.override(cache_dir=str(tmp_path)):
        for _ in range(2):  # the second compile loads the forward and backward through the layer
            torch._dynamo.reset()
            model.load_state_dict(state)
            model.zero_grad()
            f = torch.compile(model, backend="coil")
            f(x).square().mean().backward()
        torch._dynamo.reset()
        model.load_state_dict(state)
        got = _grads(model, x, compiled=True, steps=1)
    assert len(traces) == 2  # the forward once (then twice from the layer); compiled autograd's graph
    for a, b in zip(got[0], ref[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
