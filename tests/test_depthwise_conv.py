"""Depthwise 2-D convolutions generated as kernels (:mod:`coil.lowering.depthwise`, for a
backend that declares ``Capabilities.depthwise_conv``: the C++ plugin), against eager: window
shapes, strides, padding, dilation, channel multipliers, NCHW and channels-last inputs, float32,
float64 and bfloat16, a bias the graph keeps, the batch norm and activation fused after, and
gradients through a training step, the backward's ``convolution_backward`` generated too.
Each case also checks that the convolution did not reach ATen, so a lowering that declined
(and left the library to give the right answer) fails."""
from __future__ import annotations

import pytest
import torch

import coil
from coil import config

CASES = [  # channels, kernel, stride, padding, dilation, multiplier, batch, size
    (16, 3, 1, 1, 1, 1, 2, 17),
    (24, 5, 2, 2, 1, 1, 2, 9),
    (8, 3, 2, 1, 2, 2, 1, 12),
    (32, 3, 1, 0, 1, 1, 2, 4),
    (6, (3, 1), 1, (1, 0), 1, 1, 2, 7),
    (5, (1, 5), (1, 2), (0, 2), 1, 3, 3, 6),
]


def _block(c: int, k, s, p, d, mult: int, bias: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(c * mult)
    with torch.no_grad():  # running statistics that are not the identity
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return torch.nn.Sequential(torch.nn.Conv2d(c, c * mult, k, s, p, d, groups=c, bias=bias), bn,
                               torch.nn.Hardswish())


def _library_convolutions(fn, *args) -> int:
    """ATen convolutions a compiled call runs (from the profiler)."""
    with torch.profiler.profile() as prof:
        fn(*args)
    return sum(e.name == "aten::convolution" for e in prof.events())


def _generated(net: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled net's output and eager's, after checking that no convolution of the
    compiled call reached ATen."""
    torch._dynamo.reset()
    with config.override(graph_cache=False), torch.no_grad():
        fn = torch.compile(net, backend="coil")
        out = fn(x)
        assert _library_convolutions(fn, x) == 0
        return out, net(x)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_inference_matches_eager(case, layout):
    c, k, s, p, d, mult, n, hw = case
    net = _block(c, k, s, p, d, mult, bias=True).eval()
    x = torch.randn(n, c, hw, hw)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    out, expected = _generated(net, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out.stride() == expected.stride()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_match_eager(dtype):
    net = _block(12, 3, 2, 1, 1, 1, bias=False).eval().to(dtype)
    x = torch.randn(2, 12, 10, 10, dtype=dtype)
    out, expected = _generated(net, x)
    tol = {torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)


def test_a_training_step_matches_eager():
    """A channel multiplier of 2: forward generated, backward ATen's convolution_backward
    (its lowering takes one channel per group only): loss, every gradient and the batch
    norm's running statistics as eager's."""
    net = _block(8, 3, 1, 1, 1, 2, bias=True).train()
    ref = _block(8, 3, 1, 1, 1, 2, bias=True).train()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(4, 8, 9, 9)
    torch._dynamo.reset()
    with config.override(graph_cache=False):
        fn = torch.compile(net, backend="coil")
        loss = fn(x).square().mean()
        loss.backward()
    expected = ref(x).square().mean()
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    for (name, a), b in zip(net.named_buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def _backward_library_convolutions(net: torch.nn.Module, x: torch.Tensor) -> int:
    """One backward through the compiled net: its backward graphs' ``convolution_backward``
    library calls."""
    from coil.report import recording
    torch._dynamo.reset()
    with config.override(graph_cache=False), recording() as report:
        fn = torch.compile(net, backend="coil")
        fn(x).square().sum().backward()
    return sum(op.startswith("aten.convolution_backward") for g in report.graphs if g.kind == "backward"
               for op in g.library_ops)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("input_grad", [True, False])
def test_gradients_match_eager(case, layout, input_grad):
    """Every gradient (input, weight, bias) of a depthwise convolution before an activation,
    as eager's (within 1e-4 of the largest), the input's asked for or not; with one channel per group and no dilation
    the backward is generated (no ``convolution_backward`` call), else the library's."""
    c, k, s, p, d, mult, n, hw = case
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(c, c * mult, k, s, p, d, groups=c), torch.nn.Hardswish())
    ref = torch.nn.Sequential(torch.nn.Conv2d(c, c * mult, k, s, p, d, groups=c), torch.nn.Hardswish())
    ref.load_state_dict(net.state_dict())
    x = torch.randn(n, c, hw, hw)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    xs = x.clone().requires_grad_(input_grad), x.clone().requires_grad_(input_grad)
    library = _backward_library_convolutions(net, xs[0])
    ref(xs[1]).square().sum().backward()
    generated = mult == 1 and d == 1
    assert library == (0 if generated else 1), library
    pairs = [("input", xs[0].grad, xs[1].grad)] if input_grad else []
    pairs += [(name, a.grad, b.grad) for (name, a), b in zip(net.named_parameters(), ref.parameters())]
    for name, got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")
        assert got.stride() == want.stride(), name


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_gradients_in_other_dtypes_match_eager(dtype):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(12, 12, 5, 2, 2, groups=12).to(dtype)
    ref = torch.nn.Conv2d(12, 12, 5, 2, 2, groups=12).to(dtype)
    ref.load_state_dict(conv.state_dict())
    x = torch.randn(2, 12, 10, 10, dtype=dtype)
    xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    assert _backward_library_convolutions(conv, xs[0]) == 0
    ref(xs[1]).square().sum().backward()
    tol = {torch.float64: 1e-10, torch.bfloat16: 5e-2}[dtype]
    for a, b in [(xs[0].grad, xs[1].grad), (conv.weight.grad, ref.weight.grad), (conv.bias.grad, ref.bias.grad)]:
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * max(1.0, b.abs().max().item()))


def test_plugins_of_earlier_sdks_keep_the_librarys_backward(monkeypatch):
    import coil.lowering.depthwise as depthwise
    monkeypatch.setattr(depthwise, "BACKWARD_API", (99, 0, 0))
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
    assert _backward_library_convolutions(conv, torch.randn(2, 8, 6, 6, requires_grad=True)) == 1


def test_other_convolutions_stay_library_calls():
    """Dense, grouped (not depthwise), transposed and 7x7 depthwise convolutions run ATen's
    convolution, reported as library calls, not fallbacks."""
    torch.manual_seed(0)
    convs = [torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1, groups=2),
             torch.nn.ConvTranspose2d(8, 8, 3, padding=1, groups=8), torch.nn.Conv2d(8, 8, 7, padding=3, groups=8)]
    x = torch.randn(2, 8, 9, 9)
    for conv in convs:
        torch._dynamo.reset()
        with config.override(graph_cache=False), torch.no_grad():
            report = coil.explain(conv, x)
            fn = torch.compile(conv, backend="coil")
            torch.testing.assert_close(fn(x), conv(x), rtol=1e-5, atol=1e-5)
        graph = report.graphs[0]
        kinds = {(f.op, f.kind) for f in graph.fallbacks}
        assert any(op.startswith("aten.convolution") and kind == "library" for op, kind in kinds), kinds
        assert not any(kind == "fallback" for _, kind in kinds), kinds


def test_the_window_reads_rows_and_tabled_weights_apart_from_a_reduction():
    """The C++ kernel of a channels-last depthwise 3x3 reads each tap through a row pointer
    (the padding's mask decided once per row), the weights from per-tap tables (not gathered
    9 apart along the channels), and stays out of the squeeze-and-excitation mean's kernel."""
    class SE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = _block(32, 3, 1, 1, 1, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.block(x)
            return y * torch.sigmoid(y.mean((2, 3), keepdim=True))

    net = SE().eval()
    x = torch.randn(2, 32, 12, 12).contiguous(memory_format=torch.channels_last)
    torch._dynamo.reset()
    with config.override(graph_cache=False), torch.no_grad():
        report = coil.explain(net, x)
        torch.testing.assert_close(torch.compile(net, backend="coil")(x), net(x), rtol=1e-5, atol=1e-5)
    kernels = report.graphs[0].kernels
    window = [k for k in kernels if "aten.convolution.default" in k.ops]
    assert len(window) == 1, [k.name for k in kernels]
    source = window[0].source
    assert "fill0" in source and "tab" in source, source
    assert "aten.mean.dim" not in window[0].ops, window[0].ops
