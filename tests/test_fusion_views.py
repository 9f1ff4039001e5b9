"""Fusion across a view between (batch, tokens, features) and (batch * tokens, features):
pointwise nodes over the two shapes of the same points fuse into one kernel
(``Scheduler._try_rerange``), and reads through the view compare equal to the writes
(div/mod pairs folded, ``coil.scheduler._simplify``)."""
from __future__ import annotations

import math

import torch

from coil.report import recording

B, T, C, H = 2, 8, 16, 64


def _new_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _Mlp(torch.nn.Module):
    """GPT-2's MLP as transformers writes it: addmm on the flattened tokens, viewed back."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(C, H) / 4)
        self.b1 = torch.nn.Parameter(torch.randn(H) / 4)
        self.w2 = torch.nn.Parameter(torch.randn(H, C) / 8)
        self.b2 = torch.nn.Parameter(torch.randn(C) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(self.b1, x.view(-1, C), self.w1).view(B, T, H)
        return torch.addmm(self.b2, _new_gelu(h).view(-1, H), self.w2).view(B, T, C)


def _step(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    with torch.autocast("cpu", torch.bfloat16):
        y = model(x)
    y.float().square().sum().backward()
    return [y.float()] + [p.grad.clone() for p in model.parameters()]


def _compiled_against_eager(make: type[torch.nn.Module], kind: str) -> list:
    """One autocast step of ``make()`` in eager and through Coil (same weights and input),
    the outputs and gradients compared; returns the kernels of Coil's ``kind`` graph."""
    torch.manual_seed(0)
    eager, compiled = make(), make()
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(B, T, C)
    want = _step(eager, x)
    with recording() as report:
        torch._dynamo.reset()
        got = _step(torch.compile(compiled, backend="coil"), x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-2 * w.abs().max().item(), rtol=2e-2)
    (graph,) = [g for g in report.graphs if g.kind == kind]
    return graph.kernels


def test_gelu_backward_across_a_view_is_one_kernel_and_matches_eager() -> None:
    """Under bf16 autocast the GELU's backward splits at a float32 intermediate that one
    node writes over (batch, tokens, features) and the next reads over (batch * tokens,
    features); both now run in one kernel, and nothing is stored between them."""
    kernels = _compiled_against_eager(_Mlp, "backward")
    gelu = [k for k in kernels if "aten.tanh.default" in k.ops]
    assert len(gelu) == 1, [k.name for k in kernels]


class _Block(torch.nn.Module):
    """A ViT MLP block: LayerNorm over (batch, tokens, features), then a linear layer that
    reads the normalised tokens flattened to (batch * tokens, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(C)
        self.fc1 = torch.nn.Linear(C, H)
        self.fc2 = torch.nn.Linear(H, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def test_layer_norm_before_a_flattening_linear_is_one_kernel_and_matches_eager() -> None:
    """The normalisation (pointwise over (batch * tokens, features)) joins the statistics'
    reduction (over (batch, tokens) x (features)) in one kernel: its dims split onto the
    reduction's space."""
    kernels = _compiled_against_eager(_Block, "forward")
    norm = [k for k in kernels if "aten.var_mean.correction" in k.ops or "aten.rsqrt.default" in k.ops]
    assert len(norm) == 1, [(k.name, k.ops) for k in kernels]
