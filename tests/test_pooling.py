"""Pooling lowered into Coil's kernels (``core/lowering/pooling.py``) against eager, on both
shipped plugins: the C++ plugin and the Triton plugin under Triton's interpreter (each test
routes the ``cpu`` device to one, whatever ``COIL_TEST_BACKEND`` says). Max pooling's values and
indices must be eager's bit for bit, NaN, -inf, infinities, signed zeros and ties included;
gradients too, except half-type sums over overlapping windows, which Coil adds in float32 and
rounds once (eager's CPU kernel rounds after every addition): those equal eager's float32
gradient rounded, and are close to eager's own. Many cases go through one compiled function,
so that each plugin compiles a few graphs only."""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import coil
from coil import ir
from coil.report import recording
from helpers import cpu_routed_to, cpu_tensors, special_values as _special

NAN, INF = math.nan, math.inf


@pytest.fixture(autouse=True)
def _cpu_tensors():
    with cpu_tensors():
        yield


@pytest.fixture(params=["cpu_cpp", "triton"])
def plugin(request):
    """The backend serving ``cpu`` for the test: the C++ plugin or interpreted Triton."""
    with cpu_routed_to(request.param, f"pooling-{request.param}") as backend:
        yield backend


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN, and the same signs of zero."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = a.isnan()
    return (torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])
            and torch.equal(a.signbit()[~nan], b.signbit()[~nan]))


# ----------------------------------------------------------------------------- max pooling

#: name -> (input shape, channels_last, max_pool2d arguments)
MAX_CASES: dict[str, tuple[tuple[int, ...], bool, dict[str, Any]]] = {
    "k3s2p1": ((2, 3, 12, 13), False, dict(kernel_size=3, stride=2, padding=1)),
    "k3s2p1_channels_last": ((2, 5, 12, 13), True, dict(kernel_size=3, stride=2, padding=1)),
    "k2s2": ((2, 3, 8, 10), False, dict(kernel_size=2, stride=2)),
    "k3s1p1_overlapping": ((2, 3, 7, 9), False, dict(kernel_size=3, stride=1, padding=1)),
    "dilation2": ((1, 3, 11, 12), False, dict(kernel_size=3, stride=1, padding=1, dilation=2)),
    "ceil_mode_odd": ((2, 3, 9, 11), False, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    "ceil_mode_channels_last": ((1, 4, 7, 9), True, dict(kernel_size=2, stride=2, ceil_mode=True)),
    "rectangular": ((2, 3, 9, 10), False, dict(kernel_size=(2, 3), stride=(3, 1), padding=(1, 0))),
    "3d_input": ((3, 9, 11), False, dict(kernel_size=3, stride=2, padding=1)),
}
#: The cases the other dtypes run; float32 runs them all.
SHORT = ("k3s2p1", "k3s1p1_overlapping", "ceil_mode_channels_last", "3d_input")
SHORTER = ("k3s2p1", "ceil_mode_channels_last")


def _entries(cases: dict[str, Any], others: dict[torch.dtype, tuple[str, ...]]
             ) -> list[tuple[str, torch.dtype]]:
    """(case, dtype): every case in float32, and the ones ``others`` names in other dtypes.
    One compiled function runs them all, so each plugin compiles one graph (two with the
    backward): compiling is most of these tests' time."""
    return [(n, torch.float32) for n in cases] + [(n, d) for d, names in others.items() for n in names]


def _inputs(cases: dict[str, Any], entries: list[tuple[str, torch.dtype]],
            values: Any = None) -> list[torch.Tensor]:
    out = []
    for seed, (name, dtype) in enumerate(entries):
        shape, channels_last = cases[name][:2]
        x = _special(shape, dtype, seed) if values is None else values(shape).to(dtype)
        out.append(x.to(memory_format=torch.channels_last) if channels_last else x)
    return out


def _channels_last_calls(plugin, cases: dict[str, Any], entries: list[tuple[str, torch.dtype]]) -> int:
    """How many of ``entries`` stay ATen calls on ``plugin``: the channels-last ones, where
    its backend does not lay convolutions out channels-last (neither shipped plugin now)."""
    if plugin.capabilities.conv_channels_last:
        return 0
    return sum(1 for name, _ in entries if cases[name][1])


def test_max_pool_values_and_indices_match_eager(plugin):
    entries = _entries(MAX_CASES, {torch.float64: SHORTER, torch.bfloat16: SHORT,
                                    torch.float16: SHORTER})

    def pools(xs):
        return [F.max_pool2d(x, return_indices=True, **MAX_CASES[n][2]) for (n, _), x in zip(entries, xs)]

    xs = _inputs(MAX_CASES, entries)
    expected = pools(xs)
    report = coil.explain(pools, xs)
    assert len(report.fallbacks) == _channels_last_calls(plugin, MAX_CASES, entries), report.fallbacks
    for entry, (value, index), (want_value, want_index) in zip(entries, report.result, expected):
        assert _same_bits(value, want_value), entry
        assert torch.equal(index, want_index), entry
        assert value.stride() == want_value.stride() and index.stride() == want_index.stride(), entry


def test_a_window_that_misses_the_input_reports_eagers_index(plugin):
    """A dilated window can fall between input positions: eager gives -inf and the index its
    kernels start from (outside the window; here past the plane)."""
    x = torch.randn(1, 2, 2, 2)

    def pool(x):
        return F.max_pool2d(x, 2, stride=1, padding=1, dilation=3, return_indices=True)

    (value, index), (want_value, want_index) = coil.explain(pool, x).result, pool(x)
    assert torch.equal(value, want_value) and torch.equal(index, want_index)


def _train(fn, xs: list[torch.Tensor], grads_seed: int = 1):
    """Outputs and input gradients of ``fn`` in eager and compiled, with the graph reports."""
    outs = fn(xs)
    gen = torch.Generator().manual_seed(grads_seed)
    grads = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    expected = [x.grad for x in xs]
    copies = [x.detach().clone().requires_grad_() for x in xs]
    with recording() as record:
        got_outs = torch.compile(fn, backend="coil")(copies)
        torch.autograd.backward(got_outs, grads)
    return outs, got_outs, expected, [x.grad for x in copies], grads, record


class MaxPools(torch.nn.Module):
    def __init__(self, entries: list[tuple[str, torch.dtype]]) -> None:
        super().__init__()
        self.entries = entries

    def forward(self, xs):
        return [F.max_pool2d(x, **MAX_CASES[n][2]) for (n, _), x in zip(self.entries, xs)]


def test_max_pool_backward_matches_eager(plugin):
    entries = _entries(MAX_CASES, {torch.bfloat16: SHORT, torch.float16: SHORTER})
    xs = [x.requires_grad_() for x in _inputs(MAX_CASES, entries)]
    outs, got_outs, expected, got, grads, record = _train(MaxPools(entries), xs)
    assert [g.kind for g in record.graphs] == ["forward", "backward"]
    calls = [op for g in record.graphs for op in g.fallback_ops]
    assert len(calls) == 2 * _channels_last_calls(plugin, MAX_CASES, entries), calls
    for entry, o, go in zip(entries, outs, got_outs):
        assert _same_bits(go.detach(), o.detach()), entry
    for (name, dtype), x, g, want, have in zip(entries, xs, grads, expected, got):
        if dtype == torch.float32:
            assert torch.equal(have, want), name
            continue
        # Coil adds in float32 and rounds once: eager's float32 gradient, rounded
        x32 = x.detach().float().requires_grad_()
        F.max_pool2d(x32, **MAX_CASES[name][2]).backward(g.float())
        assert torch.equal(have, x32.grad.to(dtype)), (name, dtype)
        torch.testing.assert_close(have, want, rtol=2 ** -6, atol=2 ** -6)


def test_max_pool_then_relu_is_one_kernel(plugin):
    """ResNet's stem: a 3x3/2 max pooling and the ReLU after it fuse into one kernel, with no
    ATen call left; the pointwise op before it is computed in every tap."""
    x = torch.randn(2, 8, 16, 16)
    fn = lambda x: F.max_pool2d(x * 2 - 1, 3, 2, 1).relu()  # noqa: E731
    report = coil.explain(fn, x)
    assert not report.fallbacks and not report.library_calls
    assert len(report.kernels) == 1, [k.name for k in report.kernels]
    assert torch.equal(report.result, fn(x))


def test_values_alone_compute_no_index(plugin, monkeypatch):
    """Inference uses only the values: no kernel computes an index (an int64 selection)."""
    seen: list[Any] = []
    compile_kernels = plugin.compile

    def spy(kernels, graph_name):
        seen.extend(kernels)
        return compile_kernels(kernels, graph_name)

    monkeypatch.setattr(plugin, "compile", spy)
    x = torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        report = coil.explain(lambda x: F.max_pool2d(x, 3, 2, 1) * 2, x)
    assert not report.fallbacks and seen
    int64_ops = [v for k in seen for kn in k.nodes for v in ir.walk(kn.body)
                 if isinstance(v, ir.Op) and v.dtype == torch.int64]
    assert not int64_ops
    assert all(k.dtypes[b] == torch.float32 for k in seen for b in k.outputs)


def test_symbolic_sizes(plugin):
    """One compile (``dynamic=True``) serves other sizes: window bounds, clipped last windows
    and the backward's window ranges are index expressions of the size symbols."""
    def fn(x):
        return (F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
                F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False))

    compiled = torch.compile(fn, backend="coil", dynamic=True)
    with recording() as record:
        for shape in ((2, 3, 9, 11), (2, 3, 12, 7)):
            x = torch.randn(shape, requires_grad=True)
            outs = compiled(x)
            grads = [torch.randn_like(o) for o in outs]
            torch.autograd.backward(outs, grads)
            x_eager = x.detach().requires_grad_()
            want = fn(x_eager)
            torch.autograd.backward(want, grads)
            assert all(torch.equal(o, w) for o, w in zip(outs, want)), shape
            assert torch.equal(x.grad, x_eager.grad), shape
    assert all(g.symbolic for g in record.graphs) and len(record.graphs) == 2
    assert not [op for g in record.graphs for op in g.fallback_ops if "pool" in op]


# ----------------------------------------------------------------------------- average pooling

#: name -> (input shape, channels_last, avg_pool2d arguments)
AVG_CASES: dict[str, tuple[tuple[int, ...], bool, dict[str, Any]]] = {
    "k3s2p1": ((2, 3, 12, 13), False, dict(kernel_size=3, stride=2, padding=1)),
    "k2s2_channels_last": ((2, 5, 8, 10), True, dict(kernel_size=2, stride=2)),
    "exclude_pad_overlapping": ((2, 3, 7, 9), False, dict(kernel_size=3, stride=1, padding=1,
                                                          count_include_pad=False)),
    "ceil_mode": ((2, 3, 9, 11), False, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    "ceil_mode_exclude_pad": ((1, 3, 9, 11), False, dict(kernel_size=3, stride=2, padding=1,
                                                         ceil_mode=True, count_include_pad=False)),
    "divisor_override_rect": ((2, 3, 9, 10), False, dict(kernel_size=(2, 3), stride=(3, 1),
                                                          padding=(1, 0), divisor_override=5)),
    "stride_past_kernel_3d": ((3, 10, 11), False, dict(kernel_size=2, stride=3)),
}
ADAPTIVE_CASES: dict[str, tuple[tuple[int, ...], bool, tuple[int, int]]] = {
    "overlapping": ((2, 3, 9, 11), False, (4, 5)),
    "identity_channels_last": ((2, 5, 7, 7), True, (7, 7)),
    "upsampling_3d": ((3, 5, 4), False, (7, 6)),
    "rows_only": ((1, 3, 10, 6), False, (3, 6)),
}


AVERAGES = {**{f"avg_{k}": v for k, v in AVG_CASES.items()},
            **{f"adaptive_{k}": v for k, v in ADAPTIVE_CASES.items()}}


class AvgPools(torch.nn.Module):
    def __init__(self, entries: list[tuple[str, torch.dtype]]) -> None:
        super().__init__()
        self.entries = entries

    def forward(self, xs):
        out = []
        for (name, _), x in zip(self.entries, xs):
            args = AVERAGES[name][2]
            out.append(F.avg_pool2d(x, **args) if name.startswith("avg_") else
                       F.adaptive_avg_pool2d(x, args))
        return out


def test_average_pools_and_gradients_match_eager(plugin):
    entries = _entries(AVERAGES, {torch.bfloat16: tuple(AVERAGES)})
    xs = [x.requires_grad_() for x in _inputs(AVERAGES, entries, values=torch.randn)]
    outs, got_outs, expected, got, grads, record = _train(AvgPools(entries), xs)
    calls = [op for g in record.graphs for op in g.fallback_ops]
    assert len(calls) == 2 * _channels_last_calls(plugin, AVERAGES, entries), calls
    for entry, o, go in zip(entries, outs, got_outs):
        assert torch.equal(go, o), entry
    for (name, dtype), x, g, want, have in zip(entries, xs, grads, expected, got):
        if dtype == torch.float32:
            assert torch.equal(have, want), name
            continue
        # eager's CPU kernels divide and add in bfloat16; Coil in float32, rounding once
        x32 = x.detach().float().requires_grad_()
        AvgPools([(name, torch.float32)])([x32])[0].backward(g.float())
        assert torch.equal(have, x32.grad.to(dtype)), (name, dtype)
        torch.testing.assert_close(have, want, rtol=2 ** -6, atol=2 ** -7)


# ----------------------------------------------------------------------------- what stays ATen


def test_what_the_lowering_leaves_to_aten(plugin):
    """Each falls back with its reason, and the results are still eager's."""
    def fn(big, adaptive_cl, ints, grad, dilated):
        return (F.max_pool2d(big, 6),  # 36 taps
                F.adaptive_avg_pool2d(adaptive_cl, (4, 5)),  # eager divides lanes differently
                F.max_pool2d(ints, 2),
                # a dilated window can miss the input: eager's index for it then points past
                # the window (its backward writes out of bounds with it; zeros are safe here)
                torch.ops.aten.max_pool2d_with_indices_backward(
                    grad, dilated, [2, 2], [1, 1], [1, 1], [3, 3], False,
                    torch.zeros(grad.shape, dtype=torch.int64)))
    args = (torch.randn(1, 2, 12, 12), torch.randn(1, 8, 9, 11).to(memory_format=torch.channels_last),
            torch.randint(-9, 9, (1, 2, 4, 4)), torch.randn(1, 2, 1, 1), torch.randn(1, 2, 2, 2))
    report = coil.explain(fn, *args)
    for got, want in zip(report.result, fn(*args)):
        assert torch.equal(got, want)
    reasons = sorted(f"{f.op}: {f.reason}" for g in report.graphs for f in g.fallbacks
                     if f.kind == "fallback" and "pool" in f.op)
    assert len(reasons) == 4, reasons
    assert any("_adaptive_avg_pool2d.default" in r and ("channels-last" in r or "conv_channels_last" in r)
               for r in reasons)
    assert any("with_indices.default" in r and "36 window taps" in r for r in reasons)
    assert any("with_indices.default" in r and "dtype torch.int64" in r for r in reasons)
    assert any("indices_backward" in r and "miss the input" in r for r in reasons)


def test_channels_last_pooling_stays_aten_where_convolutions_are_not_channels_last(plugin):
    """A backend that does not lay convolutions out channels-last keeps ATen's channels-last
    pooling; one that does (both shipped plugins) generates it."""
    x = torch.randn(2, 8, 9, 9).to(memory_format=torch.channels_last)
    fn = lambda x: F.max_pool2d(x.relu(), 3, 2, 1) * 2  # noqa: E731
    report = coil.explain(fn, x)
    assert torch.equal(report.result, fn(x))
    lowered = not [f for f in report.fallbacks if "max_pool2d" in f]
    assert lowered == bool(plugin.capabilities.conv_channels_last), report.fallbacks
