"""Reductions and scans at their edges, as eager computes them (found by a hunt against eager,
session 29): a float32 cumulative sum or product on the CPU carries a double running value
(eager's CPU kernels do; Coil's float32 one stopped counting at 2**24), ``max``/``min`` over an
empty dim raise (Coil returned -inf and index -1), the variance of one element is NaN when the
element is inf or NaN (Coil gave 0), and ``any``/``all`` over ``dim=()`` reduce nothing (Coil,
as Inductor, reduced every dim)."""
from __future__ import annotations

import pytest
import torch

from conftest import TEST_BACKEND
from helpers import check, cpu_routed_to, cpu_tensors

NAN, INF = float("nan"), float("inf")
ON_THE_CPU = TEST_BACKEND == "cpu_cpp" and torch.get_default_device().type == "cpu"


@pytest.mark.skipif(not ON_THE_CPU, reason="eager's CPU scans run in double; its CUDA ones in float")
@pytest.mark.parametrize("f", [lambda x: torch.cumsum(x, 1), lambda x: torch.cumprod(x, 1),
                               lambda x: torch.cumsum(x.t(), 0)], ids=["cumsum", "cumprod", "cumsum_dim0"])
def test_a_float32_scan_keeps_a_double_running_value_as_eager_on_the_cpu(f):
    x = torch.randn(5, 3000) * 2 + 1
    if "cumprod" in f.__code__.co_names:
        x = 1 + x / 3000
    check(f, x, atol=0, rtol=0)
    ones = torch.ones(1, 2**24 + 8)
    got = torch.compile(lambda x: torch.cumsum(x, 1)[:, -1], backend="coil")(ones)
    assert got.item() == 2**24 + 8  # a float32 running sum stops at 2**24


@pytest.mark.parametrize("f", [lambda x: x.max(1), lambda x: x.min(1), lambda x: x.max(),
                               lambda x: x.min(), lambda x: x.argmax(1)],
                         ids=["max_dim", "min_dim", "max", "min", "argmax"])
def test_max_and_min_over_an_empty_dim_raise_as_in_eager(f):
    x = torch.randn(4, 0)
    with pytest.raises((IndexError, RuntimeError)):
        f(x)
    with pytest.raises((IndexError, RuntimeError), match="non-zero size|numel\\(\\) == 0"):
        torch.compile(f, backend="coil")(x)


@pytest.mark.parametrize("f", [lambda x: x.var(1, correction=0), lambda x: x.std(1, correction=0),
                               lambda x: torch.var_mean(x, 1, correction=0),
                               lambda x: x[2:3].var(correction=0)],
                         ids=["var", "std", "var_mean", "one_element"])
def test_the_variance_of_one_inf_or_nan_element_is_nan_as_in_eager(f):
    x = torch.tensor([[1.0], [INF], [NAN], [-INF]])
    check(f, x)


@pytest.mark.parametrize("f", [lambda x: torch.any(x, dim=()), lambda x: torch.all(x, dim=()),
                               lambda x: torch.any(x, dim=(), keepdim=True)],
                         ids=["any", "all", "any_keepdim"])
def test_any_and_all_over_no_dims_reduce_nothing_as_in_eager(f):
    x = torch.tensor([[1.0, 0.0], [0.0, NAN]])
    check(f, x)
    check(f, x > 0)


@pytest.mark.parametrize("f", [lambda x: x.std(), lambda x: (x / 200).std(), lambda x: x / x.std(),
                               lambda x: x.view(10, 100).std(1, correction=0)])
def test_float16_std_takes_its_root_before_rounding(f):
    """A float16 variance above 65504 is inf; eager's standard deviation is not (Coil rounded
    the variance to float16, then took the root: inf, session 30)."""
    h = torch.tensor([60000.0, 60000.0, -60000.0, -59000.0] * 250, dtype=torch.float16)
    torch.testing.assert_close(torch.compile(f, backend="coil")(h), f(h))
    torch._dynamo.reset()


def test_variance_of_data_far_from_zero_is_as_precise_as_eagers():
    """Welford's running mean in float32 rounds by a step of the mean's size: a mean of 1e4
    and a spread of 1e-2 gave variances 2-4% off, where eager's CPU kernels keep the state in
    double (3e-8; a hunt against eager, session 32). The C++ plugin declares
    ``float32_variance_in_float64``; eager on CUDA keeps float32, as does the Triton plugin,
    and norms' statistics stay float32 everywhere (tests/golden/layer_norm.cpp)."""
    if torch.get_default_device().type != "cpu" or TEST_BACKEND != "cpu_cpp":
        pytest.skip("eager keeps a float32 variance's state in double on the CPU only")
    torch.manual_seed(0)
    x = 1e4 + 1e-2 * torch.randn(4, 3000)

    def f(x):
        return (x.var(1), x.std(1), torch.var_mean(x, 1), x.var(0, keepdim=True), torch.var_mean(x, (0, 1)),
                torch.var_mean(x.t(), 0, correction=0))

    got = torch.compile(f, backend="coil")(x)
    torch.testing.assert_close(got, f(x), rtol=1e-5, atol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("f", [lambda x: x.mean(dtype=torch.float64), lambda x: x.mean(0, dtype=torch.float64),
                               lambda x: x.mean(-1, keepdim=True, dtype=torch.float64) * 2],
                         ids=["all", "dim0", "last_keepdim"])
def test_mean_with_a_dtype_sums_in_that_dtype(f):
    """``mean(dtype=float64)`` sums ``x.to(float64)`` as eager does: Coil summed an int64 input
    as int64 (4 * 2**62 wrapped to 0, a mean of 0) and a float32 one in float32 (a hunt)."""
    big = torch.full((4, 4), 2**62, dtype=torch.int64)
    check(f, big, atol=0, rtol=0)
    torch._dynamo.reset()
    check(f, torch.full((64, 1000), 0.1) + torch.arange(1000) * 1e-3, atol=0, rtol=1e-15)


def _ints(low, high, size, seed, dtype=torch.int64):
    """Made at collection, on the CPU under any default device (a CUDA one refuses the CPU
    generator)."""
    return torch.randint(low, high, size, dtype=dtype, generator=torch.Generator().manual_seed(seed), device="cpu")


@pytest.mark.parametrize("plugin", ["cpu_cpp", "triton"])
@pytest.mark.parametrize("f, x", [
    (lambda x: x.t().amax(-1), _ints(-100, 100, (1025, 2), 0)),
    (lambda x: x.amax(), _ints(-100, 100, (3, 1025), 1, torch.int8)),
    (lambda x: x.amin(0), _ints(-9, 9, (70001, 3), 2, torch.int32)),
], ids=["int64_columns", "int8_whole", "int32_long_columns"])
def test_split_integer_max_and_min(plugin, f, x):
    """A split reduction of an integer max or min: the Triton plugin combined its partials
    with ``tl.reduce(v, 1, tl.maximum)``, which Triton refuses (a combine function must be
    jitted): a crash under the interpreter (a hunt)."""
    with cpu_tensors(), cpu_routed_to(plugin, f"split-int-{plugin}"):
        torch._dynamo.reset()
        check(f, x.cpu(), atol=0, rtol=0)


@pytest.mark.parametrize("plugin", ["cpu_cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_sum_of_one_negative_zero_is_positive_zero(plugin, dtype):
    """Eager's sum starts at +0.0, so the sum over a dim of size 1 of -0.0 is +0.0; Coil's sum
    of one element was the element itself (a hunt)."""
    with cpu_tensors(), cpu_routed_to(plugin, f"negzero-{plugin}"):
        x = torch.tensor([[-0.0, 1.0, -2.0], [0.0, -0.0, 3.0]]).to(dtype)
        for f in (lambda x: x[:1].sum(0), lambda x: x.unsqueeze(1).sum(1) * 2, lambda x: x[:, :1].mean(-1)):
            torch._dynamo.reset()
            got = torch.compile(f, backend="coil")(x)
            assert torch.equal(got, f(x)) and torch.equal(got.signbit(), f(x).signbit()), (got, f(x))


def test_bf16_scans_and_accumulating_scatters_round_to_nearest():
    """The Triton plugin's scans and serial scatters stored bf16 with a plain conversion, which
    Triton's interpreter truncates (the GPU rounds): index_add into bf16 drifted toward zero by
    several ulps per row, cumsum by one (a hunt). Both generators now agree bit for bit on
    the accumulating scatter (one serial order each) and the scan matches eager's bits."""
    got = {}
    with cpu_tensors():
        g = torch.Generator().manual_seed(0)
        src, idx = torch.randn(40, 2, generator=g).to(torch.bfloat16), torch.randint(0, 4, (40,), generator=g)
        base, x = torch.zeros(4, 2, dtype=torch.bfloat16), torch.randn(2, 64, generator=g).to(torch.bfloat16)
        for plugin in ("cpu_cpp", "triton"):
            with cpu_routed_to(plugin, f"bf16-store-{plugin}"):
                torch._dynamo.reset()
                got[plugin] = torch.compile(lambda b, i, s: b.index_add(0, i, s), backend="coil")(base, idx, src)
                torch._dynamo.reset()
                assert torch.equal(torch.compile(lambda x: x.cumsum(1), backend="coil")(x), x.cumsum(1)), plugin
    assert torch.equal(got["triton"], got["cpu_cpp"]), got
    torch.testing.assert_close(got["triton"], base.index_add(0, idx, src), atol=0.07, rtol=0.02)
