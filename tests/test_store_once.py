"""A value that a library call reads is stored once, and its other users read that store
(``GraphLowering._stored_by_a_user``): GPT-2's forward computed each GELU twice, once for the
next matmul and once, transposed, as the tensor its backward saves."""
from __future__ import annotations

import torch

import coil.report


def _block(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """GPT-2's MLP: its ``Conv1D`` is ``addmm(bias, x, weight)``, weight (in, out)."""
    n, c = x.shape[0] * x.shape[1], x.shape[2]
    h = torch.addmm(b1, x.view(n, c), w1).view(x.shape[0], x.shape[1], -1)
    g = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
    return torch.addmm(b2, g.view(n, -1), w2)


def test_gelu_read_by_a_matmul_is_computed_once():
    torch.manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(2, 16, 32, dtype=dt, requires_grad=True)
    params = [torch.randn(32, 128, dtype=dt) * 0.1, torch.randn(128, dtype=dt), torch.randn(128, 32, dtype=dt) * 0.1,
              torch.randn(32, dtype=dt)]
    params = [p.requires_grad_() for p in params]
    want_out = _block(x, *params)
    want_out.float().sum().backward()
    want = [t.grad.clone() for t in (x, *params)]
    for t in (x, *params):
        t.grad = None
    with coil.report.recording() as report:
        out = torch.compile(_block, backend="coil")(x, *params)
        out.float().sum().backward()
    torch.testing.assert_close(out, want_out)
    for got, w in zip([t.grad for t in (x, *params)], want):
        torch.testing.assert_close(got, w, rtol=2e-2, atol=2e-2)
    (forward,) = [g for g in report.graphs if g.kind == "forward"]
    gelus = [k.name for k in forward.kernels if "tanh" in k.name]
    assert len(gelus) == 1, [k.name for k in forward.kernels]
