"""1x1 convolutions as matrix products (:mod:`coil.conv_matmul`,
``DeviceBackend.convolution_as_matmul``): the C++ plugin asks for it for float32 1x1
convolutions over channels-last inputs, in inference, training forward and (SDK 1.7.0)
training backward graphs. Every test compares against eager."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import coil
from coil import config
from coil.report import recording
from helpers import torch_threads


def _block(bias: bool = False) -> nn.Module:
    """An inverted residual block (MobileNetV2's): its depthwise convolution makes the C++
    plugin lay the graph out channels-last."""
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.expand = nn.Conv2d(16, 64, 1, bias=bias)
            self.bn1 = nn.BatchNorm2d(64)
            self.dw = nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False)
            self.bn2 = nn.BatchNorm2d(64)
            self.project = nn.Conv2d(64, 16, 1, bias=bias)
            self.strided = nn.Conv2d(16, 16, 1, stride=2)
            self.grouped = nn.Conv2d(16, 16, 1, groups=4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.nn.functional.relu6(self.bn1(self.expand(x)))
            y = torch.nn.functional.relu6(self.bn2(self.dw(y)))
            y = self.project(y) + x
            return self.grouped(self.strided(y))

    block = Block()
    for m in block.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return block.eval()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_pointwise_convolutions_run_as_matrix_products(bias: bool, threads: int) -> None:
    block = _block(bias)
    x = torch.randn(2, 16, 8, 8)
    with torch_threads(threads), torch.no_grad():
        report = coil.explain(block, x)
        out = torch.compile(block, backend="coil")(x)
    torch.testing.assert_close(out, block(x), atol=1e-5, rtol=1e-5)
    library = report.library_calls
    # the expand and project convolutions; the strided and the grouped one stay convolutions
    assert library.count("coil.pointwise_convolution") == 2, library
    assert library.count("aten.convolution.default") == 2, library


def test_a_backend_that_declines_keeps_its_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    import coil_cpu_cpp.prepack as prepack
    monkeypatch.setattr(prepack, "as_matmul", lambda info: False)
    block = _block()
    x = torch.randn(2, 16, 8, 8)
    with torch.no_grad(), config.override(graph_cache=False):
        report = coil.explain(block, x)
        out = torch.compile(block, backend="coil")(x)
    assert "coil.pointwise_convolution" not in report.library_calls
    torch.testing.assert_close(out, block(x), atol=1e-5, rtol=1e-5)


def _train_and_compare(bias: bool, input_grad: bool) -> list:
    """One backward through Coil and through eager; every gradient compared; the reports."""
    block, ref = _block(bias).train(), _block(bias).train()
    x = torch.randn(2, 16, 8, 8)
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="coil")
    xs = x.clone().requires_grad_(input_grad), x.clone().requires_grad_(input_grad)
    with recording() as report:
        compiled(xs[0]).square().sum().backward()
    ref(xs[1]).square().sum().backward()
    if input_grad:
        torch.testing.assert_close(xs[0].grad, xs[1].grad, atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(block.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
        assert p.grad.stride() == q.grad.stride(), name
    return report.graphs


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias,input_grad", [(False, True), (True, True), (True, False)])
def test_training_graphs_use_products_and_gradients_match_eager(bias: bool, input_grad: bool,
                                                                threads: int) -> None:
    """The forward's two 1x1 convolutions are products, and so is their backward (SDK
    1.7.0): the input's, the weight's and the bias's gradients, each asked for or not; the
    strided and the grouped one keep ``convolution_backward`` (the depthwise one's is a
    generated kernel). Every gradient is eager's,
    in eager's strides."""
    with torch_threads(threads), config.override(graph_cache=False):
        graphs = _train_and_compare(bias, input_grad)
    forward = [g for g in graphs if g.kind == "forward"]
    backward = [g for g in graphs if g.kind == "backward"]
    assert forward and sum(g.library_ops.count("coil.pointwise_convolution") for g in forward) == 2, \
        [g.library_ops for g in graphs]
    assert backward and sum(g.library_ops.count("coil.pointwise_convolution_backward") for g in backward) == 2, \
        [g.library_ops for g in graphs]
    assert sum(op.startswith("aten.convolution_backward") for g in backward for op in g.library_ops) == 2, \
        [g.library_ops for g in graphs]


def test_backends_of_sdk_1_6_are_not_asked_about_backward_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    import coil.compile as coil_compile
    monkeypatch.setattr(coil_compile, "MATMUL_BACKWARD_API", (99, 0, 0))
    with config.override(graph_cache=False):
        graphs = _train_and_compare(bias=True, input_grad=True)
    backward = [g for g in graphs if g.kind == "backward"]
    assert not any("coil.pointwise_convolution_backward" in g.library_ops for g in backward)
    assert sum(g.library_ops.count("coil.pointwise_convolution") for g in graphs if g.kind == "forward") == 2


def test_frozen_pointwise_convolutions_go_to_mkl_or_mm() -> None:
    """With the freezing knob, one thread: the 1x1 convolutions the plugin would have packed
    for oneDNN go as linear layers where MKL's rule takes them (rows 8-256, a weight of 32768
    elements or more), else as matrix products."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(160, 160, 3, padding=1, groups=160), nn.Conv2d(160, 640, 1),
                        nn.ReLU(), nn.Conv2d(640, 32, 1)).eval()
    x = torch.randn(2, 160, 4, 4)
    with torch_threads(1), torch.no_grad(), config.override(freezing=True):
        report = coil.explain(net, x)
        out = torch.compile(net, backend="coil", options={"freezing": True})(x)
    torch.testing.assert_close(out, net(x), atol=1e-4, rtol=1e-4)
    library = report.library_calls
    assert library.count("coil.frozen_linear") == 1, library  # 160 -> 640: 102400 weights
    assert library.count("coil.pointwise_convolution") == 1, library  # 640 -> 32: 20480
