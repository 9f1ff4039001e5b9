"""The layout of a graph's convolutions as its backend decides it from the convolutions
(``DeviceBackend.prefers_channels_last``, SDK 1.1.0; :mod:`coil.conv_layout`), on the C++
plugin as shipped: a depthwise conv net runs channels-last, a dense one NCHW, both matching
eager. The layout is read where the compiled graph calls ATen's convolution (the profiler
records its operands' strides), not from timings."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any, Iterator, Sequence

import pytest
import torch

import coil
import coil.sdk as sdk
from coil import compile as coil_compile
from coil import config, plugins
from coil_cpu_cpp.backend import CppBackend
from models import check

aten = torch.ops.aten
CL = torch.channels_last


@contextlib.contextmanager
def _convolutions() -> Iterator[list[bool]]:
    """Whether each ATen convolution run inside (forward, and backward's input operand) got
    a channels-last input, from the profiler's record of its operands' strides (a dispatch
    mode would make Dynamo run the frame in eager)."""
    seen: list[bool] = []
    with torch.profiler.profile(record_shapes=True) as prof:
        yield seen
    for event in prof.events():
        position = {"aten::convolution": 0, "aten::convolution_backward": 1}.get(event.name)
        if position is None:
            continue
        strides = getattr(event, "structured_input_strides", None)
        if strides is None:
            pytest.skip("this torch's profiler records no operand strides")
        shape, stride = event.input_shapes[position], strides[position]
        seen.append(len(shape) == 4 and shape[1] > 1 and stride[1] == 1)


class _Depthwise(torch.nn.Module):
    """A MobileNet block: stem, depthwise 3x3, pointwise 1x1, squeezed into a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b0 = torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.BatchNorm2d(16)
        self.dw, self.b1 = torch.nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), torch.nn.BatchNorm2d(16)
        self.pw, self.b2 = torch.nn.Conv2d(16, 24, 1, bias=False), torch.nn.BatchNorm2d(24)
        self.head = torch.nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.hardswish(self.b0(self.stem(x)))
        y = torch.relu(self.b1(self.dw(y))) + y
        y = self.b2(self.pw(y))
        return self.head(y.mean((2, 3)))


class _Dense(torch.nn.Module):
    """A ResNet basic block: dense 3x3 convolutions only."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.c2, self.b2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        return self.head(y.mean((2, 3)))


@pytest.fixture
def cpu_plugin():
    """The C++ plugin as shipped (whatever an earlier test registered)."""
    plugins.reset()
    yield plugins.registry().backends["cpu"]
    plugins.reset()


def _infer(net: torch.nn.Module) -> list[bool]:
    """The compiled net's output against eager's; whether each convolution ran channels-last."""
    torch.manual_seed(0)
    net = net.eval()
    x = torch.randn(2, 3, 16, 16)
    torch._dynamo.reset()
    fn = torch.compile(net, backend="coil")
    with torch.no_grad():
        expected = net(x)
        fn(x)  # compiles
        with _convolutions() as seen:
            out = fn(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert out.stride() == expected.stride()
    return seen


def test_a_depthwise_net_runs_channels_last_and_matches_eager(cpu_plugin):
    # the stem calls ATen; the depthwise one is a generated kernel (Capabilities.depthwise_conv)
    # and the pointwise one a matrix product over the channels-last pixels
    # (convolution_as_matmul), so neither is among the calls
    assert _infer(_Depthwise()) == [True]


def test_a_dense_net_stays_nchw_and_matches_eager(cpu_plugin):
    assert _infer(_Dense()) == [False, False]


def _train(net: torch.nn.Module, steps: int = 2) -> tuple[list[coil_compile.GraphReport], list[bool]]:
    """``steps`` SGD steps of a compiled copy against eager (outputs, gradients and their
    strides, batch-norm statistics); the compiled graphs' reports and whether each ATen
    convolution of the last step (forward and backward) ran channels-last (with ``steps``
    of 2 or more: the first step's compiles run convolutions on fake tensors)."""
    torch.manual_seed(0)
    ref = copy.deepcopy(net)
    torch._dynamo.reset()
    fn = torch.compile(net, backend="coil")
    opt, ref_opt = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    reports: list[coil_compile.GraphReport] = []
    coil_compile.add_observer(reports.append)
    try:
        for step in range(steps):
            x = torch.randn(4, 3, 12, 12)
            with _convolutions() if step == steps - 1 else contextlib.nullcontext([]) as seen:
                out = fn(x)  # the first step compiles: its fake-tensor convolutions not seen
                out.square().sum().backward()
            expected = ref(x)
            expected.square().sum().backward()
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
            for (name, p), q in zip(net.named_parameters(), ref.parameters()):
                # a channels-last weight gradient sums in another order (1.9e-4 seen, 16 channels)
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3, msg=lambda m: f"{name}: {m}")
                assert p.grad.stride() == q.grad.stride(), name
            for (name, b), c in zip(net.named_buffers(), ref.buffers()):
                torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
            opt.step(), ref_opt.step()
            opt.zero_grad(), ref_opt.zero_grad()
    finally:
        coil_compile.remove_observer(reports.append)
    return reports, seen


def test_training_a_depthwise_net_follows_the_plugins_answer(cpu_plugin):
    """Forward and backward graphs run channels-last where the plugin takes it for training
    (their saved activations reported to AOTAutograd), NCHW where it does not; gradients
    match eager's either way."""
    from coil_cpu_cpp import backend as cpp
    with config.override(training_channels_last=True):
        reports, channels_last = _train(_Depthwise())
    forward = next(r for r in reports if r.kind == "forward")
    # the stem's convolution and its backward, the pointwise convolution's backward (its output
    # gradient, from the mean's expand through the batch norm's backward, is not
    # channels-last, so it is no matrix product) and, laid out NCHW, the pointwise convolution
    # (channels-last it is a matrix product, convolution_as_matmul); the depthwise one and
    # its backward are generated kernels
    assert len(channels_last) == (3 if cpp.TRAINING_CHANNELS_LAST else 4), channels_last
    assert all(c == cpp.TRAINING_CHANNELS_LAST for c in channels_last), channels_last
    assert (forward.output_strides is not None) == cpp.TRAINING_CHANNELS_LAST
    assert not next(r for r in reports if r.kind == "backward").fallback_ops


def test_training_a_dense_net_stays_nchw(cpu_plugin):
    with config.override(training_channels_last=True):
        reports, channels_last = _train(_Dense())
    assert len(channels_last) == 4 and not any(channels_last), channels_last
    assert all(r.output_strides is None for r in reports)


# --------------------------------------------------------------------------- the decision


def _conv(c_in: int, c_out: int, hw: int, k: int = 3, groups: int = 1, stride: int = 1,
          batch: int = 2) -> sdk.ConvolutionInfo:
    out = (hw + 2 * (k // 2) - k) // stride + 1
    return sdk.ConvolutionInfo(input=(batch, c_in, hw, hw), weight=(c_out, c_in // groups, k, k),
                               output=(batch, c_out, out, out), stride=(stride, stride),
                               padding=(k // 2, k // 2), dilation=(1, 1), groups=groups,
                               transposed=False, dtype=torch.float32)


def _resnet_like() -> list[sdk.ConvolutionInfo]:
    return ([_conv(3, 64, 64, 7, stride=2)] + [_conv(64, 64, 16)] * 4 + [_conv(128, 128, 8)] * 3
            + [_conv(256, 256, 4)] * 3 + [_conv(512, 512, 2)] * 3 + [_conv(256, 512, 4, 1, stride=2)])


def _mobilenet_like() -> list[sdk.ConvolutionInfo]:
    blocks = [(16, 72, 16), (24, 96, 8), (40, 240, 4), (96, 576, 2)]
    return [_conv(3, 16, 64, stride=2)] + [c for cin, mid, hw in blocks for c in (
        _conv(cin, mid, hw, 1), _conv(mid, mid, hw, 5, groups=mid), _conv(mid, cin, hw, 1))]


def test_the_cpu_plugin_asks_for_channels_last_where_depthwise_work_is_a_fair_share():
    backend = CppBackend()
    assert backend.prefers_channels_last(_mobilenet_like(), training=False)
    assert not backend.prefers_channels_last(_resnet_like(), training=False)
    token = _resnet_like() + [_conv(64, 64, 16, 3, groups=64)]  # a dense net's one depthwise conv
    assert not backend.prefers_channels_last(token, training=False)
    grouped = [_conv(128, 128, 8, 3, groups=32)] * 4  # ResNeXt's: level in either layout
    assert not backend.prefers_channels_last(grouped, training=False)


def test_convolution_info_describes_the_convolution():
    dw, dense = _conv(16, 16, 8, 3, groups=16), _conv(16, 32, 8, 3)
    assert dw.depthwise and not dense.depthwise and dw.kernel_size == (3, 3)
    assert dense.macs == 2 * 32 * 8 * 8 * 16 * 9 and dw.macs == 2 * 16 * 8 * 8 * 9
    transposed = dataclasses.replace(dense, transposed=True, weight=(16, 32, 3, 3))
    assert transposed.macs == 2 * 16 * 8 * 8 * 32 * 9 and not transposed.depthwise


# --------------------------------------------------------------------------- the contract


class _Asking(CppBackend):
    """The C++ backend answering from a fixed reply, recording what it was asked."""

    def __init__(self, reply: bool) -> None:
        super().__init__()
        self.reply = reply
        self.asked: list[tuple[tuple[sdk.ConvolutionInfo, ...], bool]] = []

    def prefers_channels_last(self, convolutions: Sequence[sdk.ConvolutionInfo], *, training: bool) -> bool:
        self.asked.append((tuple(convolutions), training))
        return self.reply


@pytest.fixture
def register():
    def install(backend: Any) -> Any:
        plugins.reset()
        coil.register_backend_for_device("cpu", backend, name="asking")
        return backend
    yield install
    plugins.reset()


@pytest.mark.parametrize("reply", [True, False])
def test_the_backend_is_asked_once_per_graph_and_its_answer_applies(register, reply):
    backend = register(_Asking(reply))
    assert _infer(_Dense()) == [reply, reply]
    [(convolutions, training)] = backend.asked
    assert training is False and len(convolutions) == 2
    first = convolutions[0]
    assert (first.input, first.weight, first.output) == ((2, 3, 16, 16), (16, 3, 3, 3), (2, 16, 16, 16))
    assert (first.stride, first.padding, first.dilation, first.groups) == ((1, 1), (1, 1), (1, 1), 1)
    assert first.dtype == torch.float32 and not first.transposed


def test_training_graphs_are_asked_with_training_and_only_under_the_knob(register):
    backend = register(_Asking(True))
    with config.override(training_channels_last=False):
        _train(_Dense(), steps=1)
    assert backend.asked == []
    with config.override(training_channels_last=True):
        reports, channels_last = _train(_Dense())
    assert [t for _, t in backend.asked] == [True] and all(channels_last)
    assert next(r for r in reports if r.kind == "forward").output_strides is not None


class _Declaring(CppBackend):
    """The C++ backend with the SDK's default method: its answer is the capability. Its
    depthwise and pointwise convolutions stay ATen calls, so that every convolution's layout
    is seen."""

    prefers_channels_last = sdk.DeviceBackend.prefers_channels_last
    convolution_as_matmul = sdk.DeviceBackend.convolution_as_matmul

    def __init__(self, declared: bool) -> None:
        super().__init__()
        self.capabilities = dataclasses.replace(self.capabilities, conv_channels_last=declared,
                                                depthwise_conv=False)


@pytest.mark.parametrize("declared", [True, False])
def test_the_default_answer_is_the_capability(register, declared):
    register(_Declaring(declared))
    assert _infer(_Depthwise()) == [declared] * 3


def test_the_pass_propagates_what_a_full_propagation_gives(cpu_plugin, monkeypatch):
    """The pass re-propagates only the nodes the new layouts reach; every node's shape,
    strides, dtype and offset afterwards are what propagating the whole graph gives, in an
    inference graph and in a training forward graph."""
    from coil import conv_layout

    class Everything(conv_layout._Propagation):
        def run_node(self, n: torch.fx.Node) -> object:
            return conv_layout.FakeTensorProp.run_node(self, n)

    def layouts(net: torch.nn.Module, train: bool) -> list[tuple[Any, ...]]:
        seen: list[tuple[Any, ...]] = []

        def recording(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> int:
            done = conv_layout.to_channels_last(gm, *args, **kwargs)
            for n in gm.graph.nodes:
                v = n.meta.get("val")
                seen.append((n.name, tuple(v.shape), v.stride(), v.dtype, v.storage_offset())
                            if isinstance(v, torch.Tensor) else (n.name, type(v)))
            return done
        monkeypatch.setattr(coil_compile, "to_channels_last", recording)
        with config.override(graph_cache=False, training_channels_last=True):
            if train:
                _train(copy.deepcopy(net), steps=1)
            else:
                _infer(copy.deepcopy(net))
        assert seen
        return seen

    for train in (False, True):
        incremental = layouts(_Depthwise(), train)
        monkeypatch.setattr(conv_layout, "_Propagation", Everything)
        assert layouts(_Depthwise(), train) == incremental
        monkeypatch.undo()


class _StridedStem(torch.nn.Module):
    """FastViT's stem: a 1x1 stride-2 branch over the image's 3 channels beside a 3x3 one,
    then a depthwise convolution (which makes the plugin want channels-last)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.Conv2d(3, 16, 1, 2)
        self.bn = torch.nn.BatchNorm2d(16)
        self.dw = torch.nn.Conv2d(16, 16, 3, 1, 1, groups=16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.a(x) + self.b(x)))
        return self.head((y + self.dw(y)).mean((2, 3)))


def test_training_graphs_stay_nchw_where_atens_channels_last_weight_gradient_is_wrong():
    """oneDNN's channels-last weight gradient of a 1x1 strided convolution over 2-7 channels
    corrupts the heap or is wrong (tests/repros_open); the plugin keeps such training graphs
    NCHW, and inference graphs (no weight gradient) as they were."""
    backend = CppBackend()
    stem = [_conv(3, 16, 64, 1, stride=2)]
    assert not backend.prefers_channels_last(stem + _mobilenet_like(), training=True)
    assert backend.prefers_channels_last(stem + _mobilenet_like(), training=False)
    assert backend.prefers_channels_last([_conv(8, 16, 64, 1, stride=2)] + _mobilenet_like(), training=True)
    assert backend.prefers_channels_last([_conv(3, 16, 64, 1)] + _mobilenet_like(), training=True)


def test_a_strided_1x1_stem_trains_as_eager(cpu_plugin):
    torch.manual_seed(0)
    with config.override(training_channels_last=True):
        result = check.check_training(_StridedStem(), (torch.randn(2, 3, 40, 40),), {},
                                      lambda y: y.square().mean(), backend="coil", steps=2)
    assert result.ok, result.message()
