"""Graphs Coil leaves to eager (``coil.eager_only``), found by a hunt against eager in session
31: ``.data =`` swaps a tensor's storage (``aten.set_``), which Coil dropped, so parameters
kept their values; a random op under activation checkpointing failed to compile with a
``TypeError``. Such graphs now run in eager, and the report says so."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import coil


def test_manual_sgd_through_data_updates_the_parameters():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    model(torch.randn(3, 4)).sum().backward()
    expected = [p.detach() - 0.1 * p.grad for p in model.parameters()]

    def step():
        for p in model.parameters():
            p.data = p.data - 0.1 * p.grad

    report = coil.explain(step)
    for p, e in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e)
    assert any(f.op == "<whole graph>" and "storage" in f.reason for g in report.graphs for f in g.fallbacks)


class _Halving(torch.nn.Module):
    """Halves its weight on every call, through ``.data``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.data = self.lin.weight.data * 0.5
        return self.lin(x).relu().sum()


def test_a_module_that_swaps_its_weight_in_forward_trains_like_eager():
    torch.manual_seed(0)
    eager = _Halving()
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, backend="coil")
    x = torch.randn(5, 4)
    for _ in range(3):
        loss, expected = compiled(x), eager(x)
        torch.testing.assert_close(loss, expected)
        loss.backward()
        expected.backward()
    torch.testing.assert_close(compiled_module.lin.weight, eager.lin.weight)
    torch.testing.assert_close(compiled_module.lin.weight.grad, eager.lin.weight.grad)


def test_dropout_under_checkpointing_recomputes_the_same_mask():
    torch.manual_seed(0)
    x = torch.randn(8, 8, requires_grad=True)

    def f(x):
        return checkpoint(lambda t: F.dropout(t.relu(), 0.5, True) * 3, x, use_reentrant=False)

    out = torch.compile(f, backend="coil")(x)
    out.sum().backward()
    dropped = (out == 0) & (x > 0)
    assert 0 < int(dropped.sum()) < int((x > 0).sum())
    torch.testing.assert_close(x.grad, torch.where((out == 0), 0.0, 6.0))  # 3 / (1 - 0.5) where kept


def _overlapping_rows() -> torch.Tensor:
    return torch.arange(10.0).as_strided((4, 7), (1, 1))  # x[i, j] is storage[i + j]


def test_a_write_into_an_input_whose_rows_overlap_runs_as_captured():
    """The write reaches every alias in eager (session 33's hunt: Coil's functional buffers
    summed the old values, [28, 34, 40, 46] against eager's [43, 43, 44, 46])."""
    def fn(x):
        x[:, 0].fill_(7.0)
        return x.sum(1)

    x, y = _overlapping_rows(), _overlapping_rows()
    expected = fn(y)
    report = coil.explain(fn, x)
    torch.testing.assert_close(report.result, expected)
    assert torch.equal(torch.empty(0).set_(x.untyped_storage()), torch.empty(0).set_(y.untyped_storage()))
    assert any(f.op == "<whole graph>" and "share memory" in f.reason for g in report.graphs for f in g.fallbacks)


def test_an_expanded_input_only_read_still_compiles():
    """Elements sharing memory matter only where the graph writes into them: an expanded
    input beside an in-place op on something else compiles as usual."""
    def fn(x, bias):
        y = x * 2
        y.add_(bias)
        return y.relu_()

    x, bias = torch.randn(4, 7), torch.randn(7).expand(4, 7)
    report = coil.explain(fn, x, bias)
    torch.testing.assert_close(report.result, fn(x, bias))
    assert report.graphs and not any(f.op == "<whole graph>" for g in report.graphs for f in g.fallbacks)
