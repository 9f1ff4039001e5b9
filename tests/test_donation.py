"""Donated inputs (``coil.donation``): a backward graph writes over the saved activations it
has read for the last time, and is still right when the saved tensors must survive it."""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from coil import compile as coil_compile
from coil import config, donation


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return F.gelu(x @ w1) @ w2


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(64, 32), (torch.randn(32, 128) / 6).requires_grad_(),
            (torch.randn(128, 16) / 11).requires_grad_()]


def _step(fn, args: list[torch.Tensor], backwards: int = 1) -> list[torch.Tensor]:
    loss = fn(*args).square().sum()
    for i in range(backwards):
        loss.backward(retain_graph=i + 1 < backwards)
    return [loss.detach(), *(a.grad for a in args if a.requires_grad)]


def _compiled_step(backwards: int = 1, **knobs) -> tuple[list[torch.Tensor], list[coil_compile.GraphReport]]:
    reports: list[coil_compile.GraphReport] = []
    coil_compile.add_observer(reports.append)
    torch._dynamo.reset()
    try:
        with config.override(graph_cache=False, **knobs):
            got = _step(torch.compile(_mlp, backend="coil"), _inputs(), backwards)
    finally:
        coil_compile.remove_observer(reports.append)
    return got, reports


def _backward_source(reports) -> str:
    (backward,) = [r for r in reports if r.kind == "backward"]
    return backward.wrapper_source


def _check(got: list[torch.Tensor], backwards: int = 1) -> None:
    want = _step(_mlp, _inputs(), backwards)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_the_backward_writes_over_a_saved_activation_it_has_finished_with():
    got, reports = _compiled_step()
    _check(got)
    # the GELU's gradient goes where its saved input (x @ w1) was
    assert "in place over arg" in _backward_source(reports)


def test_a_backward_that_keeps_its_saved_tensors_writes_over_none():
    # retain_graph: autograd may call the backward again with the same saved tensors
    got, reports = _compiled_step(backwards=2)
    _check(got, backwards=2)
    assert "over arg" not in _backward_source(reports) and "reuses arg" not in _backward_source(reports)


def test_torchs_switch_turns_donation_off():
    with torch._functorch.config.patch(donated_buffer=False):
        got, reports = _compiled_step()
    _check(got)
    assert "over arg" not in _backward_source(reports) and "reuses arg" not in _backward_source(reports)


def test_the_self_check_does_not_count_a_donated_input_as_mutated():
    got, reports = _compiled_step(check=True)  # raises on a mismatch
    _check(got)
    assert "in place over arg" in _backward_source(reports)


def _donated(listed: list[int], inputs: list[torch.Tensor], monkeypatch, kind: str = "backward") -> tuple[int, ...]:
    context = types.SimpleNamespace(fw_metadata=types.SimpleNamespace(bw_donated_idxs=listed))
    monkeypatch.setattr(torch._guards.TracingContext, "try_get", staticmethod(lambda: context))
    return donation.donated_positions(kind, inputs, config.get())


def test_only_inputs_that_own_their_whole_storage_are_donated(monkeypatch):
    base = torch.randn(8, 8)
    inputs = [torch.randn(4, 4), base, base.view(64),  # two views of one storage
              torch.randn(5, 4)[1:],  # an offset into a larger storage
              torch.randn(4, 8)[:, :4],  # a strided slice
              torch.randn(4, 4).t(),  # a permutation: dense, donated
              torch.randn(2, 3)]  # not listed by AOTAutograd
    assert _donated([0, 1, 2, 3, 4, 5], inputs, monkeypatch) == (0, 5)
    assert _donated([0, 5], inputs, monkeypatch, kind="forward") == ()
    assert _donated([], inputs, monkeypatch) == ()


def test_recorded_graphs_are_not_donated(monkeypatch):
    with config.override(graph_capture="on"):
        context = types.SimpleNamespace(fw_metadata=types.SimpleNamespace(bw_donated_idxs=[0]))
        monkeypatch.setattr(torch._guards.TracingContext, "try_get", staticmethod(lambda: context))
        assert donation.donated_positions("backward", [torch.randn(3)], config.get()) == ()


def test_a_forward_output_the_backward_also_reads_is_left_intact():
    # the user holds a; its clone b is saved; only tensors that are no forward output may go
    def f(x):
        a = x.sin()
        b = a.clone()
        return a, (b * b.exp()).sum()

    x = torch.randn(64, 64, requires_grad=True)
    torch._dynamo.reset()
    with config.override(graph_cache=False):
        a, s = torch.compile(f, backend="coil")(x)
    kept = a.detach().clone()
    s.backward()
    torch.testing.assert_close(a.detach(), kept, rtol=0, atol=0)
    y = x.detach().requires_grad_()
    f(y)[1].backward()
    torch.testing.assert_close(x.grad, y.grad)
