"""Channels-last convolutions in training (``coil.conv_layout``, knob
``training_channels_last``): the forward graph saves its activations channels-last and
reports their strides to AOTAutograd, the backward graph adopts them; gradients stay eager's.
Run through the C++ plugin with ``Capabilities.conv_channels_last`` turned on and the SDK's
default ``prefers_channels_last``, which answers it for every conv net (the Triton plugin's
setting on the GPU; the C++ plugin's own answer keeps these dense nets NCHW, see
tests/test_conv_layout_cpu.py)."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import coil
from coil import compile as coil_compile
from coil import config, plugins


def _register_cpp(conv_channels_last: bool) -> None:
    """The C++ plugin for ``cpu``, answering channels-last for every conv net (the SDK's
    default ``prefers_channels_last``) and declaring ``conv_channels_last`` as asked."""
    import coil.sdk as sdk
    from coil_cpu_cpp.backend import CppBackend

    class ChannelsLast(CppBackend):
        prefers_channels_last = sdk.DeviceBackend.prefers_channels_last

    backend = ChannelsLast()
    backend.capabilities = dataclasses.replace(backend.capabilities, conv_channels_last=conv_channels_last)
    plugins.reset()
    coil.register_backend_for_device("cpu", backend, name=f"cpp-channels-last-{conv_channels_last}")


@pytest.fixture
def channels_last_cpu():
    _register_cpp(conv_channels_last=True)
    with config.override(training_channels_last=True):
        yield
    plugins.reset()


class _Net(torch.nn.Module):
    """Two conv-BN-ReLU layers with a residual, pooled into a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        return self.head(y.mean((2, 3)))


def _train(steps: int = 2) -> list[coil_compile.GraphReport]:
    """``steps`` SGD steps of a compiled copy against eager: outputs, every gradient and the
    batch-norm running statistics match at each step. Returns the compiled graphs' reports."""
    torch.manual_seed(0)
    net = _Net()
    ref = copy.deepcopy(net)
    fn = torch.compile(net, backend="coil")
    opt, ref_opt = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    reports: list[coil_compile.GraphReport] = []
    coil_compile.add_observer(reports.append)
    try:
        for _ in range(steps):
            x = torch.randn(4, 3, 10, 10)
            out, expected = fn(x), ref(x)
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
            out.square().sum().backward()
            expected.square().sum().backward()
            for (name, p), q in zip(net.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
                assert p.grad.stride() == q.grad.stride(), name
            for (name, b), c in zip(net.named_buffers(), ref.buffers()):
                torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-4, msg=name)
            opt.step(), ref_opt.step()
            opt.zero_grad(), ref_opt.zero_grad()
    finally:
        coil_compile.remove_observer(reports.append)
    return reports


def _channels_last(stride: tuple[int, ...] | None) -> bool:
    return stride is not None and len(stride) == 4 and stride[1] == 1


def test_training_saves_activations_channels_last_and_gradients_match(channels_last_cpu):
    reports = _train()
    forward = next(r for r in reports if r.kind == "forward")
    backward = next(r for r in reports if r.kind == "backward")
    assert forward.output_strides is not None
    assert sum(_channels_last(s) for s in forward.output_strides) >= 2, forward.output_strides
    assert not backward.fallback_ops, backward.fallbacks  # lowered, not run as traced
    assert "<whole graph>" not in [f.op for f in backward.fallbacks]


def test_convolution_operands_are_saved_channels_last(channels_last_cpu):
    """The input image and the weights, which the forward graph saves for the convolutions'
    backward, are saved as their channels-last copies: saved in eager's layout, the backward's
    ``convolution_backward`` got them beside a channels-last gradient and the library
    converted the gradient back (0.34 ms per step on ResNet-18's first layer on the H200)."""
    reports = _train(steps=1)
    forward = next(r for r in reports if r.kind == "forward")
    four_d = [s for s in forward.output_strides or [] if s is not None and len(s) == 4]
    assert len(four_d) >= 4, forward.output_strides  # x, two weights, activations
    assert all(_channels_last(s) for s in four_d), forward.output_strides


def test_without_the_capability_training_keeps_eager_layouts():
    """A backend that does not declare ``conv_channels_last`` (named here: the test run's
    default backend may be one that does, such as the Triton plugin under its interpreter)."""
    _register_cpp(conv_channels_last=False)
    try:
        with config.override(training_channels_last=True):
            reports = _train(steps=1)
    finally:
        plugins.reset()
    assert all(r.output_strides is None for r in reports)


def test_without_the_knob_training_keeps_eager_layouts(channels_last_cpu):
    with config.override(training_channels_last=False):
        reports = _train(steps=1)
    assert all(r.output_strides is None for r in reports)


def test_a_backward_graph_that_cannot_adopt_the_layouts_runs_as_traced(channels_last_cpu, monkeypatch):
    def fails(gm, example_inputs):
        raise RuntimeError("no fake mode here")

    monkeypatch.setattr(coil_compile, "adopt_input_layouts", fails)
    reports = _train()
    backward = next(r for r in reports if r.kind == "backward")
    assert [f.op for f in backward.fallbacks] == ["<whole graph>"], backward.fallbacks
    assert "layouts could not be propagated" in backward.fallbacks[0].reason


@pytest.mark.graph_cache
def test_a_cached_forward_graph_reports_its_layouts_again(channels_last_cpu, tmp_path):
    with config.override(cache_dir=str(tmp_path)):
        first = _train(steps=1)
        torch._dynamo.reset()
        second = _train(steps=1)
    forward = [r for r in second if r.kind == "forward"]
    assert forward and all(r.cached for r in forward)
    assert forward[0].output_strides == next(r for r in first if r.kind == "forward").output_strides
