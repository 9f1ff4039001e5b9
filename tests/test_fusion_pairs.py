"""Tiny independent pointwise nodes over one space share a kernel (``coil.fusion_pairs``):
a conv net's training forward graph bumps every batch norm's ``num_batches_tracked`` in a
one-element node of its own, which was a kernel (a launch) each."""
from __future__ import annotations

import torch

import coil
import coil.report
from coil import fusion_pairs

from helpers import check


def test_independent_scalar_updates_share_one_kernel():
    def bump(a, b, c, d, x):
        for t in (a, b, c, d):
            t.add_(1)
        return torch.relu(x) * 2

    args = [torch.tensor(3), torch.tensor(5), torch.tensor(7), torch.tensor(9), torch.randn(4096)]
    expected = [a.clone() + 1 for a in args[:4]]
    report = check(bump, *args)
    assert [a.item() for a in args[:4]] == [e.item() for e in expected]
    scalar = [k for k in report.kernels if "add" in k.name]
    assert len(scalar) == 1, [k.name for k in report.kernels]


def test_batch_norms_count_their_batches_in_one_kernel():
    def layers() -> torch.nn.Sequential:
        return torch.nn.Sequential(*[m for _ in range(4) for m in (
            torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())])

    net = layers()
    ref = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(2, 4, 8, 8)
    compiled = torch.compile(net, backend="coil")
    with coil.report.recording() as report:
        out = compiled(x)
    bumps = [k.name for k in report.kernels if "add_copy" in k.name]
    assert len(bumps) == 1, [k.name for k in report.kernels]
    reference = layers()
    reference.load_state_dict(ref)
    torch.testing.assert_close(out, reference(x), rtol=1e-4, atol=1e-4)
    for (name, got), want in zip(net.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)


def test_tiny_nodes_linked_through_a_library_call_stay_apart():
    """``q`` depends on ``y`` through a matmul: one kernel for both would need the matmul
    inside it (the scheduler's cycle check refuses)."""
    def chain(a, w):
        y = a + 1
        z = y.reshape(1, 1) @ w
        return y, z.reshape(()) + 2

    report = check(chain, torch.tensor(2.0), torch.tensor([[3.0]]))
    assert len(report.kernels) == 2, [k.name for k in report.kernels]


def test_large_sums_with_tiny_casts_stay_apart():
    """Under autocast each bias gradient is a sum over every row, then a tiny cast to the
    parameter's dtype. The casts are tiny; the groups they are in are not, and must not be
    joined (all twelve of a ViT's attention bias sums had ended in one kernel of a few
    programs, 0.6 ms on the H200)."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    x = torch.randn(512, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layers(x)
    expected.float().sum().backward()
    want = [p.grad.clone() for p in layers.parameters()]
    layers.zero_grad()
    with coil.report.recording() as report:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.compile(layers, backend="coil")(x)
        out.float().sum().backward()
    torch.testing.assert_close(out, expected)
    for got, w in zip([p.grad for p in layers.parameters()], want):
        torch.testing.assert_close(got, w)
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    sums = [k for k in backward.kernels if "sum" in k.source.lower() and "acc" in k.source]
    assert all(k.source.count("sum_update") <= 1 for k in sums), [k.name for k in sums]
    assert len(sums) == 4, [k.name for k in backward.kernels]
