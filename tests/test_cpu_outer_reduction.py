"""The C++ plugin's outer reduction schedule (``x.sum(0)`` of a row-major matrix: lanes along
the kept dim, plugins/cpu_cpp/reduction_loops.py) against eager: blocks as wide as the
threads allow, reduced elements taken in groups per lane, and partial states per chunk of
the reduced dim, combined into the lanes' states; for every reduction type the schedule
generates, at sizes that do and do not divide the group and the chunk, and with symbolic
sizes."""
from __future__ import annotations

import pytest
import torch

import coil  # noqa: F401  (registers the backend)

from conftest import TEST_BACKEND
from helpers import check

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cpu_cpp", reason="C++ plugin schedules")

#: (reduced, kept): grouped and chunked; grouped, one chunk; chunked, not grouped (1001 is
#: odd); narrow kept dim (elements one at a time); a reduced dim of 2; kept wider than the
#: widest block.
SHAPES = [(1000, 512), (96, 300), (1001, 272), (520, 64), (2, 400), (12, 5000)]


def _source(report: coil.explain) -> str:
    return "\n".join(k.source for k in report.kernels)


@pytest.mark.parametrize("shape", SHAPES)
def test_sums_over_the_outer_dim(shape):
    r = check(lambda x: x.sum(0), torch.randn(*shape), atol=1e-4, rtol=1e-5)
    src = _source(r)
    assert "outer_block" in src
    rows, kept = shape
    assert ("r0_group" in src) == (kept > 256 and rows % 4 == 0 and rows > 2)
    assert ("part_" in src) == (rows > 128)


@pytest.mark.parametrize("shape", SHAPES[:3])
@pytest.mark.parametrize("op", ["amax", "argmax", "var_mean", "prod"])
def test_other_reductions_over_the_outer_dim(shape, op):
    x = torch.randn(*shape)
    x[3, 5] = float("nan")  # max and argmax carry a NaN through the chunks' combine
    x[7, 9] = x[8, 9] = x.abs().max() + 1  # argmax: the first of two equal maxima
    fn = {"amax": lambda x: x.amax(0), "argmax": lambda x: x.argmax(0),
          "var_mean": lambda x: torch.var_mean(x, 0), "prod": lambda x: (x * 0.01 + 1).prod(0)}[op]
    r = check(fn, x, atol=1e-4, rtol=1e-4)
    assert "outer_block" in _source(r)


def test_symbolic_sizes_are_chunked():
    r = check(lambda x: x.sum(0), torch.randn(700, 300), atol=1e-4, rtol=1e-5, dynamic=True)
    src = _source(r)
    assert "part_" in src and "r0_group" not in src  # a group needs a static extent
    f = torch.compile(lambda x: x.sum(0), backend="coil", dynamic=True)
    for rows in (700, 129, 128, 5):
        x = torch.randn(rows, 300)
        torch.testing.assert_close(f(x), x.sum(0), atol=1e-4, rtol=1e-5)


def test_a_long_sum_is_about_as_accurate_as_eager():
    """Taken one element after the other, x.sum(0) of 65536x64 was 4.8e-3 off a float64 sum
    (eager's cascade: 1.1e-4); in chunks of 128 it is 3.1e-4."""
    torch.manual_seed(0)
    x = torch.randn(65536, 64)
    exact = x.double().sum(0)
    got = coil.explain(lambda x: x.sum(0), x, dynamic=False).result
    eager_err = (x.sum(0).double() - exact).abs().max().item()
    assert (got.double() - exact).abs().max().item() < 10 * eager_err


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_longer_sum_settles_its_chunks(dynamic):
    """Past 128 chunks the partials settle in a second state: x.sum(0) of 2^18 x 64 (a bias's
    gradient over many tokens) was 1.3e-6 off a float64 sum, relatively, eager's 2.9e-7 (a
    hunt, session 37); settled, 2.0e-7."""
    torch.manual_seed(0)
    x = torch.randn(1 << 18, 64) + 1
    exact = x.double().sum(0)
    r = coil.explain(lambda x: x.sum(0), x, dynamic=dynamic)
    assert "mid_" in _source(r)
    eager_err = ((x.sum(0).double() - exact) / exact).abs().max().item()
    assert ((r.result.double() - exact) / exact).abs().max().item() < 2 * eager_err


@pytest.mark.parametrize("op", ["var", "mean"])
def test_a_long_inner_reduction_settles_its_lanes(op):
    """The inner and split schedules' lanes combine their partial states into settled ones
    every few chunks: ``x.var()`` of 2**24 float32 had been 2.1e-5 off a float64 variance
    (Inductor 8.4e-8, Coil now 3.2e-7)."""
    torch.manual_seed(0)
    x = torch.randn(1 << 22) + 1.0
    fn = {"var": lambda x: x.var(), "mean": lambda x: x.view(2048, 2048).mean()}[op]
    exact = fn(x.double())
    r = coil.explain(fn, x, dynamic=False)
    assert "unsettled" in _source(r)
    eager_err = max((fn(x).double() - exact).abs().item(), 1e-8)
    assert (r.result.double() - exact).abs().item() < 20 * eager_err


@pytest.mark.parametrize("shape", [(37, 4100), (3, 100003), (64, 64), (5, 70)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_welford_over_full_chunks_counts_once_per_chunk(shape, dynamic):
    """Inner and split schedules: a Welford state's count and its reciprocal once per full
    chunk (``welford_update_n``), the leftover elements per lane; against eager's var_mean
    and layer norm, at sizes with and without leftovers, settled (100003) or not."""
    x = torch.randn(*shape) * 3 + 2
    r = check(lambda x: torch.var_mean(x, -1), x, atol=1e-4, rtol=1e-4, dynamic=dynamic)
    assert "welford_update_n" in _source(r)
    w, b = torch.randn(shape[-1]), torch.randn(shape[-1])
    check(lambda x, w, b: torch.nn.functional.layer_norm(x, (shape[-1],), w, b), x, w, b,
          atol=1e-4, rtol=1e-4, dynamic=dynamic)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "cross_entropy", "norm_then_sum"])
def test_kernels_with_several_settled_reductions(op):
    """Rows long enough that each of a kernel's reduction loops settles its lanes (a softmax's
    maximum and sum of exponentials): each loop declares its own state."""
    x = torch.randn(6, 8200)
    fns = {"softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: x.log_softmax(-1),
           "cross_entropy": lambda x: torch.nn.functional.cross_entropy(x, torch.arange(6) * 7),
           "norm_then_sum": lambda x: (torch.nn.functional.layer_norm(x, (8200,)) * x).sum(-1)}
    r = check(fns[op], x, atol=1e-4, rtol=1e-4)
    assert _source(r).count("unsettled_") >= 2


@pytest.mark.parametrize("case", ["rows", "channels_last", "short"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_short_innermost_reduced_dim_chunks_the_outer_ones(case, dynamic):
    """Outer schedule, innermost reduced dim of CHUNK or fewer elements under longer outer
    reduced dims: a chunk is as many passes over it as fit (counted when the call runs where
    the size is symbolic), so the outer dims settle too, in as many levels as the elements
    need. ``[4000, 56, 64].sum((0, 1))`` was 3.7 off a float64 sum against eager's 0.074, a
    channels-last batch norm's sum over (N, H, W) 3.5 against 0.061, and under dynamic=True
    ``[2^20, 4, 17].sum((0, 1))`` 8.4 against 0.21 (session 39)."""
    torch.manual_seed(0)
    if case == "rows":
        x, dims = torch.randn(4000, 56, 64) + 1, (0, 1)
    elif case == "channels_last":
        x, dims = (torch.randn(64, 64, 56, 56) + 1).to(memory_format=torch.channels_last), (0, 2, 3)
    else:
        x, dims = torch.rand(1 << 20, 4, 17), (0, 1)
    exact = x.double().sum(dims)
    r = coil.explain(lambda x: x.sum(dims), x, dynamic=dynamic)
    if case != "short" or dynamic:  # static, 17 kept points take the split schedule
        assert "outer_block" in _source(r) and "part_buf0_count" in _source(r)
    eager_err = (x.sum(dims).double() - exact).abs().max().item()
    # the short case sums 4 million values near 0.5 into 2^21, where one float32 ulp is 0.25:
    # eager's cascade is about one ulp off, Coil's a few (each level adds up to 128 sums)
    assert (r.result.double() - exact).abs().max().item() < (5 if case == "short" else 3) * eager_err


def test_a_short_innermost_reduced_dim_of_the_lanes_settles_its_leftovers():
    """Inner schedule, innermost reduced dim of 3 (two lanes and one leftover element) under
    a long outer one: the leftovers went into one lane in a separate pass, a serial sum of
    300000 elements (40x further from float64 than eager); they now share the pass and
    settle with the lanes, which settle twice (``mid_`` and ``high_`` states)."""
    torch.manual_seed(0)
    x = torch.randn(8, 300_000, 3) + 1
    exact = x.double().sum((1, 2))
    r = coil.explain(lambda x: x.sum((1, 2)), x, dynamic=False)
    src = _source(r)
    assert "left_" in src and "high_" in src
    eager_err = (x.sum((1, 2)).double() - exact).abs().max().item()
    assert (r.result.double() - exact).abs().max().item() < 4 * eager_err


@pytest.mark.parametrize("shape", [(5, 700, 3), (4, 50, 67), (3, 9000, 5)])
@pytest.mark.parametrize("op", ["var_mean", "amax", "logsumexp", "sum"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_leftovers_in_the_outer_reduced_pass(shape, op, dynamic):
    """The leftover elements of each outer step go to states of their own (``left_``):
    Welford's full chunks give every lane the chunk's count, which a lane that also took
    leftover elements would not have."""
    x = torch.randn(*shape) * 3 + 2
    x[1, 9, shape[-1] - 1] = x.abs().max() + 1  # amax: a maximum among the leftovers
    fns = {"var_mean": lambda x: torch.var_mean(x, (1, 2)), "amax": lambda x: x.amax((1, 2)),
           "logsumexp": lambda x: x.logsumexp((1, 2)), "sum": lambda x: x.sum((1, 2))}
    check(fns[op], x, atol=1e-4, rtol=1e-4, dynamic=dynamic)


@pytest.mark.parametrize("op", ["sum", "mean", "var_mean"])
def test_an_empty_innermost_reduced_dim_under_symbolic_ones(op):
    """A reduced dim of 0 elements (specialised) beside symbolic sizes: the outer schedule's
    passes per chunk divided by it (ZeroDivisionError at compile; a hunt, session 39)."""
    fns = {"sum": lambda x: x.sum((0, 1)), "mean": lambda x: x.mean((0, 1)),
           "var_mean": lambda x: torch.var_mean(x, (0, 1))}
    check(fns[op], torch.randn(3, 0, 4), dynamic=True)
    check(lambda x: x.sum(0), torch.randn(0, 4), dynamic=True)
