"""The C++ plugin's row schedules against eager: masked loads read through row pointers
(plugins/cpu_cpp/masked_rows.py: pooling windows over the padding, channels-last and NCHW,
``cat`` and ``pad``) and small tables of what varies along the innermost loop and few others
(plugins/cpu_cpp/tables.py: a channels-last batch norm's per-channel scale, a gate per image
and channel), at odd sizes, with padding, ceil_mode, dilation, infinities and NaN, in the
float dtypes."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import coil  # noqa: F401  (registers the backend)

from conftest import TEST_BACKEND
from helpers import check

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cpu_cpp", reason="C++ plugin schedules")

CL = torch.channels_last


def _special(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Ties (values rounded to halves), NaN, infinities and -0.0 among random values."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 2).round() / 2
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=gen)
    n = max(flat.numel() // 20, 1)
    for k, value in enumerate((math.nan, -math.inf, math.inf, -0.0)):
        flat[picks[k * n:(k + 1) * n]] = value
    return x.to(dtype)


def _all_minus_inf_corner(x: torch.Tensor) -> torch.Tensor:
    """A corner of -inf wide enough that some padded window holds nothing else."""
    x = x.clone()
    x[..., :3, :3] = -math.inf
    return x


def _layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.contiguous(memory_format=CL) if channels_last else x


def _pool_source(report) -> str:
    return "\n".join(k.source for k in report.kernels)


#: (input shape, max_pool2d arguments)
MAX_POOLS = {
    "k3s2p1": ((2, 19, 13, 11), dict(kernel_size=3, stride=2, padding=1)),
    "k3s1p1": ((1, 5, 7, 9), dict(kernel_size=3, stride=1, padding=1)),
    "k2s2_ceil": ((2, 6, 7, 9), dict(kernel_size=2, stride=2, ceil_mode=True)),
    "k3s2p1_ceil": ((1, 17, 10, 12), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    "k3s2p1_dilated": ((2, 7, 13, 12), dict(kernel_size=3, stride=2, padding=1, dilation=2)),
    "k5x3_mixed": ((1, 33, 11, 9), dict(kernel_size=(5, 3), stride=(2, 1), padding=(2, 1))),
}


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("name", sorted(MAX_POOLS))
def test_max_pool_matches_eager_with_nan_and_infinities(name, channels_last):
    shape, kwargs = MAX_POOLS[name]
    x = _layout(_all_minus_inf_corner(_special(shape, seed=len(name))), channels_last)
    r = check(lambda x: F.max_pool2d(x, **kwargs), x, atol=0, rtol=0)
    assert not r.fallbacks, r.fallbacks
    got = r.result
    assert got.is_contiguous(memory_format=CL) == channels_last


def test_channels_last_max_pool_reads_padded_rows_through_row_pointers():
    """Channels-last windows over the padding: the taps off the input read a row of -inf,
    chosen once per output position, so the channel loop holds no branch."""
    x = _layout(_special((2, 24, 15, 15), seed=3), True)
    r = check(lambda x: F.max_pool2d(x, 3, 2, 1), x, atol=0, rtol=0)
    source = _pool_source(r)
    assert "std::fill_n(fill0" in source and "infinity" in source, source
    assert "if (" not in source.split("#pragma omp simd")[-1], source


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "nchw"])
def test_max_pool_of_an_inlined_scale_shift_relu(channels_last):
    """A cheap producer inlined into every tap: its loads read through row pointers too (fill
    rows of zeros), and the padding's -inf is selected after it, so no tap is under an ``if``;
    that select is a bitwise blend (``coil::row_select``): as a ``?:`` GCC 12 left the loop
    scalar (8x64x112x112, one thread: 26 ms against 2.0 ms)."""
    x = _layout(_all_minus_inf_corner(_special((2, 19, 13, 11), seed=9)), channels_last)
    w, b = torch.randn(19), torch.randn(19)
    r = check(lambda x: F.max_pool2d(torch.relu(x * w[:, None, None] + b[:, None, None]), 3, 2, 1), x)
    if channels_last:
        inner = _pool_source(r).split("#pragma omp simd")[-1]
        assert "if (" not in inner and "infinity" in inner and "coil::row_select<float>(" in inner, inner


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_half_and_double_channels_last_max_pool(dtype):
    x = _layout(_special((2, 9, 11, 10), seed=5, dtype=dtype), True)
    check(lambda x: F.max_pool2d(x, 3, 2, 1), x, atol=0, rtol=0)


def test_max_pool_with_indices_channels_last():
    """Values and eager's flat indices, windows of -inf included."""
    x = _layout(_all_minus_inf_corner(_special((2, 5, 9, 11), seed=7)), True)
    check(lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), x, atol=0, rtol=0)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "nchw"])
def test_avg_pool_matches_eager(channels_last, ceil_mode, count_include_pad):
    x = _layout(torch.randn(2, 21, 11, 13), channels_last)
    check(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=count_include_pad), x)


def test_pooling_of_infinities_in_the_padding_of_an_average():
    """A row pointer's fill is the masked value (0 for an average), never a neighbour's."""
    x = _layout(torch.full((1, 3, 5, 5), math.inf), True)
    x[..., 0, :] = -math.inf
    check(lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels", [3, 24, 70])
def test_channels_last_batch_norm_computes_its_scale_once_per_channel(dtype, channels):
    """An eval-mode batch norm over channels-last data: ``1 / sqrt(var + eps)`` depends on the
    channel (the innermost loop) only, so it is computed into an array before the loop nest."""
    bn = torch.nn.BatchNorm2d(channels).eval()
    bn.running_var.uniform_(0.5, 2.0)
    bn.running_mean.normal_()
    bn.weight.data.normal_()
    bn = bn.to(dtype)
    x = _layout(torch.randn(2, channels, 5, 7), True).to(dtype)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    with torch.no_grad():
        r = check(lambda x: F.silu(bn(x)), x, atol=tol, rtol=tol)
    source = r.kernels[0].source
    assert "tab0_0[x3]" in source and source.index("std::sqrt") < source.index("for (int64_t x0"), source


@pytest.mark.parametrize("shape", [(4, 32, 20, 20), (3, 7, 5, 9), (2, 70, 9, 9)])
def test_gate_is_computed_once_per_image_and_channel(shape):
    """A squeeze-and-excitation gate, ``sigmoid`` of a per-(image, channel) value, over a
    channels-last activation: one table over images and channels, not a sigmoid per point."""
    n, c = shape[:2]
    x = _layout(torch.randn(shape), True)
    g, b = torch.randn(n, c, 1, 1), torch.randn(c, 1, 1)
    r = check(lambda x, g: F.silu(x) * torch.sigmoid(g + b) + 1, x, g)
    source = r.kernels[0].source
    nest = source.index("for (int64_t x1")
    assert source.count("coil::sigmoid") == 2 and source.index("coil::sigmoid") < nest, source
    assert f"tab0_0[({c}*x0 + x3)]" in source[nest:], source


def test_column_arrays_with_symbolic_sizes():
    """Sizes that change between calls: the arrays are filled only where the kernel has points."""
    bn = torch.nn.BatchNorm2d(16).eval()
    bn.running_var.uniform_(0.5, 2.0)
    with torch.no_grad():
        for hw in (5, 9, 6):
            x = _layout(torch.randn(2, 16, hw, hw + 1), True)
            check(lambda x: torch.relu(bn(x)), x, dynamic=True)


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "nchw"])
def test_cat_and_pad_read_through_row_pointers_match_eager(channels_last):
    a = _layout(_special((2, 5, 7, 9), seed=11), channels_last)
    b = _layout(_special((2, 3, 7, 9), seed=12), channels_last)
    check(lambda a, b: torch.cat([a, b * 2], dim=1) + 1, a, b, atol=0, rtol=0)
    check(lambda a: F.pad(a, (1, 2, 3, 0), value=-1.5) * 3, a, atol=0, rtol=0)
    check(lambda a: F.pad(a, (0, 0, 0, 0, 2, 1)) - 1, a, atol=0, rtol=0)


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "nchw"])
def test_symbolic_sizes_keep_the_branches(channels_last):
    """An inner loop of unknown length gets no fill row: the masked loads stay under ``if``."""
    for hw in (9, 12, 7):
        x = _layout(_special((2, 4, hw, hw + 2), seed=hw), channels_last)
        check(lambda x: F.max_pool2d(x, 3, 2, 1), x, atol=0, rtol=0, dynamic=True)
