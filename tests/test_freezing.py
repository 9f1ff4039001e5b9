"""The ``freezing`` knob (:mod:`coil.freezing`): parameters of an inference graph compiled
under ``no_grad`` become constants, batch norms fold into convolutions, the C++ plugin packs
convolution weights for oneDNN, and every call checks the parameters it baked in.

Each test compares against eager on the same module, after whatever the test does to the
parameters."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import coil
from coil import config
from coil.report import recording
from helpers import torch_threads

torch.backends.mkldnn.enabled = True


def _net(bias: bool = False) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=bias), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=bias), nn.BatchNorm2d(16), nn.Hardswish(),
        nn.Conv2d(16, 32, 3, bias=bias), nn.BatchNorm2d(32),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    for m in net.modules():  # statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return net.eval()


@pytest.mark.parametrize("bias", [False, True])
def test_frozen_conv_net_matches_eager_and_packs_convolutions(bias: bool) -> None:
    net = _net(bias)
    x = torch.randn(2, 3, 12, 12)
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    with torch.no_grad(), recording() as report:
        torch.testing.assert_close(fn(x), net(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fn(x), net(x), atol=1e-5, rtol=1e-5)
    library = report.library_calls
    # the two dense convolutions are oneDNN calls over packed weights; the depthwise one
    # is the core's own kernel (the plugin leaves it to the core)
    assert library.count("coil.frozen_convolution") == 2, library
    assert "aten.convolution.default" not in library and not report.fallbacks
    sources = " ".join(k.source for k in report.kernels)
    # batch norms folded into the weights: no kernel divides by a square root of a variance
    assert "sqrt" not in sources, sources
    note = report.graphs[0].frozen
    assert "3 convolution(s) with the batch norm or bias after them folded in" in note and "2 convolution(s) and 0 linear layer(s)" in note, note
    assert "freezing:" in str(report)


def test_without_freezing_nothing_is_packed() -> None:
    net = _net()
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        report = coil.explain(net, x)
    assert "coil.frozen_convolution" not in report.library_calls


def test_in_place_change_of_a_frozen_parameter_recompiles(caplog: pytest.LogCaptureFixture) -> None:
    net = _net()
    x = torch.randn(2, 3, 12, 12)
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    with torch.no_grad():
        fn(x)
        net[0].weight.mul_(2.0)  # bumps the version counter
        net[1].running_var.mul_(3.0)
        with caplog.at_level(logging.WARNING, logger="coil.freezing"):
            out = fn(x)
        torch.testing.assert_close(out, net(x), atol=1e-5, rtol=1e-5)
        assert any("compiling the graph again" in r.getMessage() for r in caplog.records)
        caplog.clear()
        net[4].weight.add_(0.25)  # a second change: compiled without freezing from now on
        with caplog.at_level(logging.WARNING, logger="coil.freezing"):
            out = fn(x)
        torch.testing.assert_close(out, net(x), atol=1e-5, rtol=1e-5)
        assert any("without freezing" in r.getMessage() for r in caplog.records)
        net[6].weight.mul_(-1.0)  # not frozen any more: read as an input, no warning
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="coil.freezing"):
            torch.testing.assert_close(fn(x), net(x), atol=1e-5, rtol=1e-5)
        assert not caplog.records


def test_load_state_dict_after_compile_is_seen() -> None:
    net = _net()
    other = _net()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 3, 12, 12)
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    with torch.no_grad():
        fn(x)
        net.load_state_dict(other.state_dict())
        torch.testing.assert_close(fn(x), other(x), atol=1e-5, rtol=1e-5)


def test_parameter_replaced_by_a_new_object_is_seen() -> None:
    net = _net()
    x = torch.randn(2, 3, 12, 12)
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    with torch.no_grad():
        fn(x)
        net[0].weight = nn.Parameter(torch.randn_like(net[0].weight))
        torch.testing.assert_close(fn(x), net(x), atol=1e-5, rtol=1e-5)


def test_parameters_read_as_they_are_stay_inputs() -> None:
    """A linear's weight is read by the matrix product itself: not baked, so an in-place
    change shows on the next call without a recompile."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4)).eval()
    x = torch.randn(3, 8)
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    with torch.no_grad():
        fn(x)
        net[0].weight.data.mul_(2.0)  # even a write the version counter does not see
        torch.testing.assert_close(fn(x), net(x), atol=1e-5, rtol=1e-5)


def test_static_address_inputs_are_not_frozen() -> None:
    """An input the user marked static (a KV cache) changes between calls by design."""
    cache = torch.zeros(4, 8)
    torch._dynamo.mark_static_address(cache)
    weight = nn.Parameter(torch.randn(8))

    def f(x: torch.Tensor) -> torch.Tensor:
        return (cache * weight).sum(0) + x

    fn = torch.compile(f, backend="coil", options={"freezing": True})
    x = torch.randn(8)
    with torch.no_grad():
        fn(x)
        cache.copy_(torch.randn(4, 8))
        torch.testing.assert_close(fn(x), f(x))


def test_training_graphs_are_not_frozen() -> None:
    net = _net().train()
    x = torch.randn(2, 3, 12, 12)
    ref = _net().train()
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    fn(x).sum().backward()
    ref(x).sum().backward()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)


def test_frozen_under_bf16_autocast() -> None:
    """The weights' casts to bf16 run once; the convolutions stay ATen's (packing is float32
    only) with their weights cast at compile time."""
    net = _net()
    x = torch.randn(2, 3, 12, 12)
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(x)
        ref = net(x)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_frozen_graphs_skip_the_layer_before_aot() -> None:
    from coil import aot_cache
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with config.override(freezing=True, graph_cache=True), torch.no_grad():
        assert "freezing" in (aot_cache.graph_refusal(gm, [torch.randn(2)], config.get()) or "")


def test_batch_norms_fold_through_the_triton_plugin_too() -> None:
    """The folding passes are the core's: the interpreted Triton plugin, which packs nothing,
    gets convolutions with the batch norms in their weights."""
    from helpers import cpu_routed_to, cpu_tensors
    net = _net(bias=True)
    x = torch.randn(2, 3, 12, 12)
    with cpu_tensors(), cpu_routed_to("triton", "freezing-triton"), torch.no_grad(), recording() as report:
        fn = torch.compile(net, backend="coil", options={"freezing": True})
        torch.testing.assert_close(fn(x), net(x), atol=1e-4, rtol=1e-4)
    assert "coil.frozen_convolution" not in report.library_calls
    sources = " ".join(k.source for k in report.kernels)
    assert report.kernels and "sqrt" not in sources


@pytest.mark.parametrize("threads", [1, 2])
def test_packing_follows_atens_own_choice_of_onednn(threads: int) -> None:
    """The C++ plugin packs a convolution where ATen itself would call oneDNN (packing only
    saves oneDNN's weight reorder); checked against what ATen calls, seen by the profiler."""
    from coil_cpu_cpp.prepack import aten_uses_onednn
    from coil.sdk import ConvolutionInfo
    cases = [  # (input, weight, stride, groups)
        ((2, 16, 8, 8), (8, 16, 1, 1), 1, 1), ((2, 16, 8, 8), (8, 16, 1, 1), 2, 1),
        ((2, 16, 8, 8), (8, 16, 3, 3), 1, 1), ((1, 16, 8, 8), (8, 16, 3, 3), 1, 1),
        ((1, 64, 32, 32), (8, 64, 3, 3), 1, 1), ((16, 8, 4, 4), (8, 8, 1, 1), 1, 1),
        ((1, 8, 16, 16), (8, 2, 5, 5), 1, 4), ((2, 3, 64, 64), (16, 3, 7, 7), 2, 1),
    ]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape, wshape, stride, groups in cases:
            x, w = torch.randn(shape), torch.randn(wshape)
            with torch.profiler.profile() as prof:
                torch.nn.functional.conv2d(x, w, None, stride, 0, 1, groups)
            onednn = any(e.name == "aten::mkldnn_convolution" for e in prof.events())
            oh = (shape[2] - wshape[2]) // stride + 1
            info = ConvolutionInfo(input=shape, weight=wshape, output=(shape[0], wshape[0], oh, oh),
                                   stride=(stride, stride), padding=(0, 0), dilation=(1, 1), groups=groups,
                                   transposed=False, dtype=torch.float32, frozen=True)
            assert aten_uses_onednn(info) == onednn, (shape, wshape, stride, groups, threads)
    finally:
        torch.set_num_threads(before)


def test_only_parameters_a_pass_consumed_are_checked() -> None:
    """Views of parameters (a linear's transposed weight) stay in the graph: their
    parameters stay inputs and cost no check; batch-norm statistics folded into a
    convolution's weight are checked."""
    from coil import compile as coil_compile
    seen: list[list] = []
    real = coil_compile.freezing.guarded

    def spy(fn, baked, recompile):
        seen.append(baked)
        return real(fn, baked, recompile)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4)).eval()
    coil_compile.freezing.guarded = spy
    try:
        with torch.no_grad():
            torch.compile(net, backend="coil", options={"freezing": True})(torch.randn(3, 8))
            torch._dynamo.reset()
            conv = _net()
            torch.compile(conv, backend="coil", options={"freezing": True})(torch.randn(2, 3, 12, 12))
    finally:
        coil_compile.freezing.guarded = real
    assert seen[0] == []
    assert any(b.tensor is conv[0].weight for b in seen[1])
    assert any(b.tensor is conv[1].running_var for b in seen[1])
    assert all(b.tensor is not conv[10].weight for b in seen[1])  # the linear's, read as it is


def test_linear_layers_pack_for_mkl_where_that_wins() -> None:
    """A linear layer of 32 rows against a 256x512 weight is MKL's packed product; the head
    of 2 rows stays the core's (a library call that measured faster there)."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).eval()
    head = nn.Linear(256, 10).eval()

    def f(x: torch.Tensor) -> torch.Tensor:
        return head(net(x)[:2])

    x = torch.randn(32, 256)
    fn = torch.compile(f, backend="coil", options={"freezing": True})
    with torch.no_grad(), recording() as report:
        torch.testing.assert_close(fn(x), f(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(fn(x), f(x), atol=1e-4, rtol=1e-4)
    assert report.library_calls.count("coil.frozen_linear") == 2, report.library_calls
    assert "1 linear" not in report.graphs[0].frozen and "2 linear layer(s)" in report.graphs[0].frozen
    with torch.no_grad():
        net[0].bias.add_(1.0)  # a bias folded into the packed call: seen, compiled again
        torch.testing.assert_close(fn(x), f(x), atol=1e-4, rtol=1e-4)


def test_batch_norm_in_training_mode_under_no_grad_is_not_frozen() -> None:
    """A model left in train() mode updates its running statistics even under no_grad: the
    graph writes into those buffers, so nothing is frozen and eager's updates happen."""
    net, ref = _net().train(), _net().train()
    x = torch.randn(2, 3, 12, 12)
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fn(x), ref(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(net[1].running_mean, ref[1].running_mean)
    torch.testing.assert_close(net[4].running_var, ref[4].running_var)


def _instances(count: int) -> list[nn.Module]:
    """``count`` nets of one class with different weights."""
    nets = [_net() for _ in range(count)]
    with torch.no_grad():
        for i, net in enumerate(nets):
            for p in net.parameters():
                p.add_(0.1 * i)
    return nets


def test_instances_of_one_model_class_each_get_a_frozen_copy(caplog: pytest.LogCaptureFixture) -> None:
    """Instances of one class share Dynamo's compiled frame, so each instance's parameters
    reach the same frozen graph: each gets a copy frozen with its own weights, not a recompile
    per switch, and not the first instance's weights."""
    from coil import freezing
    nets = _instances(3)
    fns = [torch.compile(net, backend="coil", options={"freezing": True}) for net in nets]
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad(), recording() as rep, caplog.at_level(logging.WARNING, logger="coil.freezing"):
        for _ in range(3):
            for fn, net in zip(fns, nets):
                torch.testing.assert_close(fn(x), net(x), atol=1e-5, rtol=1e-5)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    frozen = [g for g in rep.graphs if g.frozen.startswith("freezing: ") and "held as constants" in g.frozen]
    assert len(frozen) == 3, [g.frozen for g in rep.graphs]
    assert len(nets) <= freezing.FROZEN_COPIES


def test_instances_beyond_the_frozen_copies_run_unfrozen(caplog: pytest.LogCaptureFixture) -> None:
    from coil import freezing
    nets = _instances(freezing.FROZEN_COPIES + 2)
    fns = [torch.compile(net, backend="coil", options={"freezing": True}) for net in nets]
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="coil.freezing"):
        for _ in range(2):
            for fn, net in zip(fns, nets):
                torch.testing.assert_close(fn(x), net(x), atol=1e-5, rtol=1e-5)
        nets[0][0].weight.mul_(1.5)  # a copy's own parameter changed in place is still seen
        torch.testing.assert_close(fns[0](x), nets[0](x), atol=1e-5, rtol=1e-5)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("without freezing for the others" in m for m in messages) == 1, messages


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_pointwise_convolution_the_backend_declines_goes_as_a_linear_layer(channels_last: bool) -> None:
    """One thread: ATen (and so the C++ plugin) leaves a 1x1 convolution over two images to
    its matrix product, which the plugin's MKL rule takes as a linear layer instead (32
    pixels, a 640x160 weight). Strided or grouped 1x1 convolutions are no linear layers."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(160, 640, 1), nn.GELU(), nn.Conv2d(640, 160, 1),
                        nn.Conv2d(160, 160, 1, stride=2), nn.Conv2d(160, 160, 1, groups=2)).eval()
    x = torch.randn(2, 160, 4, 4)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    with torch_threads(1), torch.no_grad(), config.override(freezing=True):
        report = coil.explain(net, x)
        out = torch.compile(net, backend="coil", options={"freezing": True})(x)
    torch.testing.assert_close(out, net(x), atol=1e-4, rtol=1e-4)
    library = report.library_calls
    assert library.count("coil.frozen_linear") == 2, library
    assert "2 of them 1x1, as linear layers" in report.graphs[0].frozen, report.graphs[0].frozen


@pytest.mark.parametrize("bias", [False, True])
def test_batch_norm_folding_computes_on_the_weights_device(bias: bool) -> None:
    """The folded scale and shift are built on the weight's device: a CUDA model's constants
    met CPU tensors there (every conv net under freezing failed to compile on the GPU). The
    weights here are on the meta device, which refuses CPU operands as CUDA does."""
    from coil.constant_fold import ORIGIN
    from coil.conv_fold import fold_batch_norms
    aten = torch.ops.aten
    gm = torch.fx.GraphModule(nn.Module(), torch.fx.Graph())
    graph = gm.graph
    constants = {"w": torch.ones(4, 3, 1, 1), "s": torch.full((1, 4, 1, 1), 2.0),
                 "t": torch.full((4, 1, 1), 0.5)}
    if bias:
        constants["b"] = torch.ones(4)
    nodes = {}
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, 5, 5, device="meta")
    for i, (name, value) in enumerate(constants.items()):
        gm.register_buffer(name, value.to("meta"))
        nodes[name] = graph.get_attr(name)
        nodes[name].meta.update({ORIGIN: frozenset({i}), "val": value.to("meta")})
    out = torch.empty(2, 4, 5, 5, device="meta")
    conv = graph.call_function(aten.convolution.default, (x, nodes["w"], nodes.get("b"), [1, 1], [0, 0], [1, 1],
                                                          False, [0, 0], 1))
    mul = graph.call_function(aten.mul.Tensor, (conv, nodes["s"]))
    add = graph.call_function(aten.add.Tensor, (mul, nodes["t"]))
    for node in (conv, mul, add):
        node.meta["val"] = out
    graph.output(add)
    gm.recompile()
    assert fold_batch_norms(gm) == 1
    folded = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert all(getattr(gm, str(n.target)).device.type == "meta" for n in folded)


def test_a_failing_freezing_pass_compiles_the_graph_without_freezing(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Freezing is an optimisation: a pass that raises (as batch-norm folding did on CUDA)
    leaves the graph compiled without it, with a warning, and the result right."""
    from coil import freezing

    def broken(gm: torch.fx.GraphModule) -> int:
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(freezing, "fold_batch_norms", broken)
    net = _net()
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad(), recording() as rep, caplog.at_level(logging.WARNING, logger="coil.compile"):
        out = torch.compile(net, backend="coil", options={"freezing": True})(x)
    torch.testing.assert_close(out, net(x), atol=1e-5, rtol=1e-5)
    assert any("without freezing" in r.getMessage() for r in caplog.records), caplog.records
    assert not any(g.frozen for g in rep.graphs), [g.frozen for g in rep.graphs]


class _RelativeBias(nn.Module):
    """Swin's relative-position bias: a [49, heads] table gathered by a [16, 16] index buffer
    into [heads, 16, 16] (more elements than the table and the index hold), added to scores."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Parameter(torch.randn(49, 2))
        self.register_buffer("index", torch.randint(0, 49, (16, 16)), persistent=False)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        bias = self.table[self.index.view(-1)].view(16, 16, -1).permute(2, 0, 1).contiguous()
        return (scores + bias.unsqueeze(0)).softmax(-1)


def _frozen_relative_bias():
    """:class:`_RelativeBias` compiled with freezing, checked against eager; its graph's report."""
    net = _RelativeBias().eval()
    scores = torch.randn(4, 2, 16, 16)
    with torch.no_grad(), recording() as rep:
        got = torch.compile(net, backend="coil", options={"freezing": True})(scores)
        expected = net(scores)
    torch.testing.assert_close(got, expected)
    (graph,) = rep.graphs
    return graph


def test_a_gather_of_frozen_tables_is_computed_once() -> None:
    """A gather of a frozen table by a frozen index is folded into a constant, although it
    holds more elements than its inputs (the fold stores no broadcast, but a gather is
    none): the kernel adds the stored bias instead of gathering it on every call."""
    graph = _frozen_relative_bias()
    assert "2 of 2 parameters held as constants" in graph.frozen, graph.frozen
    assert not any("index" in k.name for k in graph.kernels), [k.name for k in graph.kernels]


def test_a_gather_beyond_the_limit_is_left_to_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gather of frozen tables larger than its inputs and than ``GATHER_LIMIT`` elements is
    computed where it is read, as a broadcast is: no constant of that size is stored."""
    from coil import constant_fold
    monkeypatch.setattr(constant_fold, "GATHER_LIMIT", 256)  # the bias holds 512 elements
    graph = _frozen_relative_bias()
    assert "0 of 2 parameters held as constants" in graph.frozen, graph.frozen


class _Folded(nn.Module):
    """Returns a value of parameters alone (folded into a constant), and one a later graph
    writes into after a graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.randn(4, 8))
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = self.pos * self.scale
        torch._dynamo.graph_break()
        pos += x
        return pos, (self.pos * 2).t()


def test_a_folded_constant_returned_is_a_new_tensor_each_call() -> None:
    """The constant itself came back from every call: the next graph's ``pos += x`` drifted
    the results call by call, and a caller's write into one result changed the later ones
    (a hunt, session 37; Inductor's freezing does the same)."""
    torch.manual_seed(0)
    net = _Folded().eval()
    fn = torch.compile(net, backend="coil", options={"freezing": True})
    x = torch.randn(4, 8)
    with torch.no_grad():
        first = fn(x)
        for _ in range(3):
            got, want = fn(x), net(x)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
                assert g.stride() == w.stride()
        assert got[1].data_ptr() != first[1].data_ptr()
        got[1].zero_()
        torch.testing.assert_close(fn(x)[1], net(x)[1], rtol=0, atol=0)
