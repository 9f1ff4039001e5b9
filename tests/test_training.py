"""Training through Coil: forward and backward graphs both compile, gradients match eager."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from coil import compile as coil_compile
from coil.demo import Block


def _grads_match(model: nn.Module, step, *inputs, atol=1e-5, rtol=1e-4) -> list:
    ref = copy.deepcopy(model)
    graphs = []
    coil_compile.add_observer(graphs.append)
    try:
        loss = torch.compile(step, backend="coil")(model, *inputs)
    finally:
        coil_compile.remove_observer(graphs.append)
    ref_loss = step(ref, *inputs)
    torch.testing.assert_close(loss, ref_loss, atol=atol, rtol=rtol)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=rtol, msg=name)
    return graphs


def test_gpt_block_gradients():
    torch.manual_seed(0)
    block = Block(dim=32, heads=2)
    x = torch.randn(2, 8, 32)

    def step(m, x):
        loss = m(x).pow(2).mean()
        loss.backward()
        return loss

    graphs = _grads_match(block, step, x)
    kinds = {g.kind for g in graphs}
    assert {"forward", "backward"} <= kinds
    assert all(not g.fallback_ops for g in graphs), [g.fallback_ops for g in graphs]


def test_embedding_layernorm_cross_entropy_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.LayerNorm(16), nn.Linear(16, 50))
    idx, target = torch.randint(0, 50, (4, 6)), torch.randint(0, 50, (24,))

    def step(m, idx, target):
        loss = F.cross_entropy(m(idx).view(-1, 50), target)
        loss.backward()
        return loss

    _grads_match(model, step, idx, target)


def test_batchnorm_conv_training_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x = torch.randn(5, 3, 8, 8)

    def step(m, x):
        loss = m(x).logsumexp(-1).sum()
        loss.backward()
        return loss

    ref = copy.deepcopy(model)
    _grads_match(model, step, x, atol=1e-4, rtol=1e-4)
    step(ref, x)
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)


def test_a_forward_with_effect_tokens_and_a_saved_view_with_a_size_one_dim():
    """``linalg.tensorinv``'s forward carries an effect token (its error check) and saves a
    [12, 1, 2, 2, 3] view whose size-1 dim Coil strides otherwise than traced. Neither may
    make the core report the forward's output strides: a size-1 dim's stride does not
    matter, and with tokens torch reads the reported strides shifted (the backward compile
    failed with 'mismatch in length of strides and shape')."""
    torch.manual_seed(0)
    a = torch.randn(2, 2, 3, 12, 1, dtype=torch.float64, requires_grad=True)
    f = lambda a: torch.linalg.tensorinv(a, ind=3)  # noqa: E731
    out = torch.compile(f, backend="coil")(a)
    (out * torch.arange(out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    got, a.grad = a.grad, None
    expected = f(a)
    (expected * torch.arange(expected.numel(), dtype=expected.dtype).view(expected.shape)).sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(got, a.grad)


class _Counted(nn.Module):
    """Scales by a call count it keeps in a buffer (incremented under ``no_grad``), and by a
    factor it doubles after reading it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.count += 1
        y = x * (self.count * self.scale)  # saves the product (eager: not the buffer)
        with torch.no_grad():
            self.scale.mul_(2)
        return y


def test_a_backward_does_not_read_an_input_the_forward_wrote():
    """The partitioner recomputed ``count + 1`` in the backward from the buffer, which the
    forward had already incremented: gradients twice eager's (aot_eager and Inductor on
    torch 2.13 too). Coil reads such inputs through copies saved before the write. Three
    steps, gradients and buffers as eager's."""
    torch.manual_seed(0)
    eager, compiled = _Counted(), _Counted()
    step = torch.compile(compiled, backend="coil")
    for _ in range(3):
        x = torch.randn(8, 4).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        eager(x).pow(2).sum().backward()
        step(x2).pow(2).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
        torch.testing.assert_close(compiled.count, eager.count)
        torch.testing.assert_close(compiled.scale, eager.scale)
