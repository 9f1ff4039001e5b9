"""Max-pool indices saved for the backward as int8 window offsets (``coil.pool_offsets``): the
ops' eager meaning, the joint-graph rewrite, and training through both plugins, against eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coil import pool_offsets
from coil.report import recording
from helpers import cpu_routed_to, cpu_tensors, special_values

aten = torch.ops.aten
coil_ops = torch.ops.coil

#: (input shape, channels_last, kernel, stride, padding, ceil_mode)
CASES = [
    ((2, 3, 12, 13), False, [3, 3], [2, 2], [1, 1], False),
    ((2, 5, 12, 13), True, [3, 3], [2, 2], [1, 1], False),
    ((2, 3, 7, 9), False, [3, 3], [1, 1], [1, 1], False),
    ((2, 3, 9, 11), False, [3, 3], [2, 2], [1, 1], True),
    ((1, 4, 7, 9), True, [2, 2], [2, 2], [0, 0], True),
    ((2, 3, 9, 10), False, [2, 3], [3, 1], [1, 0], False),
    ((3, 9, 11), False, [3, 3], [2, 2], [1, 1], False),
]


@pytest.fixture(autouse=True)
def _cpu_tensors():
    with cpu_tensors():
        yield


@pytest.fixture(params=["cpu_cpp", "triton"])
def plugin(request):
    with cpu_routed_to(request.param, f"pool-offsets-{request.param}") as backend:
        yield backend


def _input(case, seed: int) -> torch.Tensor:
    x = special_values(case[0], seed=seed)
    return x.to(memory_format=torch.channels_last) if case[1] else x


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_offset_ops_mean_what_the_aten_ops_mean(case):
    x = _input(case, 0)
    _, _, kernel, stride, padding, ceil_mode = case
    values, indices = aten.max_pool2d_with_indices(x, kernel, stride, padding, [1, 1], ceil_mode)
    got_values, offsets = coil_ops.max_pool2d_offsets(x, kernel, stride, padding, ceil_mode)
    assert offsets.dtype == torch.int8 and offsets.stride() == indices.stride()
    assert torch.equal(values.isnan(), got_values.isnan())
    assert torch.equal(values.nan_to_num(), got_values.nan_to_num())
    assert torch.equal(pool_offsets.offsets_to_indices(offsets, kernel, stride, padding, x.shape[-1]), indices)
    grad = torch.randn(values.shape).to(memory_format=torch.channels_last) if case[1] else torch.randn(values.shape)
    want = aten.max_pool2d_with_indices_backward(grad, x, kernel, stride, padding, [1, 1], ceil_mode, indices)
    got = coil_ops.max_pool2d_offsets_backward(grad, x, kernel, stride, padding, ceil_mode, offsets)
    assert torch.equal(got, want) and got.stride() == want.stride()
    sized = coil_ops.max_pool2d_offsets_backward_sized(grad, offsets, list(x.shape), list(x.stride()),
                                                      kernel, stride, padding, ceil_mode)
    assert torch.equal(sized, want) and sized.stride() == want.stride()


class Stem(torch.nn.Module):
    """A ResNet stem: convolution, ReLU, a 3x3/2 max pooling, and what reads it."""

    def __init__(self, pool: dict) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.pool = pool

    def forward(self, x):
        return F.max_pool2d(self.conv(x).relu(), **self.pool) * 2


def _train(model: torch.nn.Module, x: torch.Tensor):
    """Eager's and Coil's output and gradients, the graph reports, and the dtypes of the
    tensors Coil's forward saved for its backward."""
    torch.manual_seed(0)
    eager = model(x)
    grad = torch.randn(eager.shape)
    eager.backward(grad)
    want = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    saved: list[torch.dtype] = []
    with recording() as record, torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.dtype) or t, lambda t: t):
        out = torch.compile(model, backend="coil")(x)
        out.backward(grad)  # the backward graph compiles here
    got = [p.grad for p in model.parameters()] + [x.grad]
    return eager, out, want, got, record, saved


def _kernel_names(record) -> str:
    return " ".join(k.name for g in record.graphs for k in g.kernels)


def test_training_saves_int8_offsets(plugin):
    x = torch.randn(2, 3, 15, 17, requires_grad=True)
    eager, out, want, got, record, saved = _train(Stem(dict(kernel_size=3, stride=2, padding=1)), x)
    torch.testing.assert_close(out, eager)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    names = _kernel_names(record)
    assert "max_pool2d_offsets" in names and "max_pool2d_offsets_backward" in names, names
    assert torch.int8 in saved and torch.int64 not in saved, saved


def test_indices_the_caller_reads_stay_int64(plugin):
    """Indices returned to the caller are eager's int64 ones: no rewrite."""
    def fn(x):
        values, indices = F.max_pool2d(x.relu(), 3, 2, 1, return_indices=True)
        return values * 2, indices

    x = special_values((2, 3, 11, 12), seed=1).requires_grad_()
    values, indices = fn(x)
    values.sum().backward()
    want = x.grad.clone()
    x.grad = None
    with recording() as record:
        got_values, got_indices = torch.compile(fn, backend="coil")(x)
        got_values.sum().backward()
    assert got_indices.dtype == torch.int64 and torch.equal(got_indices, indices)
    assert torch.equal(x.grad, want)
    assert "offsets" not in _kernel_names(record)


@pytest.mark.parametrize("pool", [dict(kernel_size=6, stride=2, padding=1),  # 36 taps: ATen calls
                                  dict(kernel_size=3, stride=1, padding=1, dilation=2)],  # no rewrite
                         ids=["past_unrolled_taps", "dilated"])
def test_pools_coil_does_not_unroll_train_as_eager(plugin, pool):
    x = torch.randn(2, 3, 16, 18, requires_grad=True)
    eager, out, want, got, record, _ = _train(Stem(pool), x)
    torch.testing.assert_close(out, eager)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    calls = " ".join(op for g in record.graphs for op in g.fallback_ops)
    if "dilation" in pool:
        assert "offsets" not in _kernel_names(record) + calls
    else:  # the forward is Coil's offset op run by its eager implementation; the backward
        # gathers over 3x3 windows per element, which Coil lowers
        assert "coil.max_pool2d_offsets.default" in calls, calls
        assert "max_pool2d_offsets_backward" in _kernel_names(record) + calls


class StemBN(torch.nn.Module):
    """ResNet's stem: convolution, batch norm, ReLU, a 3x3/2 max pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(6)

    def forward(self, x):
        return F.max_pool2d(self.bn(self.conv(x)).relu(), 3, 2, 1) * 2


def test_the_pooling_backward_does_not_hold_its_input(plugin):
    """The backward takes the input's size, not the input: the partitioner saves the
    convolution's output alone and recomputes the ReLU's from it, as for Inductor (before,
    ResNet-50's stem saved both, 12 MiB more at batch 8)."""
    x = torch.randn(2, 3, 16, 18, requires_grad=True)
    model = StemBN()
    eager, out, want, got, record, _ = _train(model, x)
    torch.testing.assert_close(out, eager)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    shapes: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        torch.compile(model, backend="coil")(x)
    assert shapes.count((2, 6, 16, 18)) == 1, shapes
