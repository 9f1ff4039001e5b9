"""Random ops generated in kernels (``coil.lowering.random``): Philox4x32-10 against its known
answer and the reference executor bit for bit; uniform and normal moments (factories and the
in-place ``uniform_``/``normal_``); Bernoulli and dropout keep rates; dropout's kept values
equal eager's bit for bit, and the backward uses the forward's mask; p = 0 and p = 1 as eager;
reproducibility under ``torch.manual_seed``; fusion with neighbours (one kernel, no fallback);
a small MLP trained with dropout follows eager's loss curve; ops that are not safe to generate
stay in ATen. Every test runs on CPU tensors through the C++ plugin and through the Triton
plugin under Triton's interpreter (the reference backend once)."""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch import config as functorch_config
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil import config, plugins
from coil.compile import GraphReport, add_observer, compile_graph, remove_observer
from coil.lowering.random import SEED_HIGH, SEED_LOW
from coil.sdk.reference import ReferenceBackend, philox, philox_rand, philox_randn
from helpers import cpu_routed_to, cpu_tensors

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _cpu_tensors():
    """These tests route the ``cpu`` device to each plugin, so their tensors are CPU tensors
    even under ``COIL_TEST_DEVICE=cuda`` (which makes CUDA the default device)."""
    with cpu_tensors():
        yield


@pytest.fixture(params=["cpu_cpp", "triton"])
def plugin(request):
    """The ``cpu`` device routed to the C++ plugin or to interpreted Triton; yields its name."""
    with cpu_routed_to(request.param, f"random-{request.param}"):
        yield request.param


def _seed_after(manual_seed: int) -> torch.Tensor:
    """The seed a compiled graph draws first after ``torch.manual_seed(manual_seed)``."""
    torch.manual_seed(manual_seed)
    return torch.randint(SEED_LOW, SEED_HIGH, (), dtype=torch.int64)


def _sigmas(value: float, expected: float, std_error: float) -> float:
    return abs(value - expected) / std_error


def _nonzero(*size: int) -> torch.Tensor:
    """Values with no zeros (a dropped element is then exactly the zeros of the output)."""
    x = torch.randn(*size)
    return x + torch.where(x >= 0, 0.5, -0.5)


# ----------------------------------------------------------------------------- the generator


def test_philox_known_answer_and_the_reference_backend():
    """Random123's known answer for key 0, counter 0; the reference executor serves ``rand``."""
    words = philox(torch.tensor(0), torch.tensor(0))
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    plugins.reset()
    coil.register_backend_for_device("cpu", ReferenceBackend(), name="random-reference")
    try:
        compiled = torch.compile(lambda x: torch.rand_like(x), backend="coil")
        torch.manual_seed(11)
        out = compiled(torch.empty(2, 50))
        expected = philox_rand(_seed_after(11), torch.arange(100).view(2, 50))
        assert torch.equal(out, expected)
    finally:
        plugins.reset()


def test_rand_equals_the_reference_bit_for_bit(plugin):
    """``rand`` is integer arithmetic and an exact conversion: the same bits on every plugin;
    each op's counters follow the previous op's (2000 = 2 x 1000)."""
    compiled = torch.compile(lambda x: (torch.rand_like(x), torch.rand_like(x), torch.randn(7, 9)),
                             backend="coil")
    torch.manual_seed(5)
    first, second, normal = compiled(torch.empty(10, 100))
    seed = _seed_after(5)
    counters = torch.arange(1000).view(10, 100)
    assert torch.equal(first, philox_rand(seed, counters))
    assert torch.equal(second, philox_rand(seed, counters + 1000))
    expected = philox_randn(seed, torch.arange(63).view(7, 9) + 2000)
    torch.testing.assert_close(normal, expected, rtol=1e-5, atol=1e-5)  # libm's last place


def test_uniform_and_normal_moments(plugin):
    n = 1 << 20
    u, z = torch.compile(lambda: (torch.rand(n), torch.randn(n)), backend="coil")()
    assert u.dtype == z.dtype == torch.float32
    assert 0.0 <= u.min() and u.max() < 1.0
    # standard errors: of the mean, sigma/sqrt(n); of a variance, about sqrt(mu4 - sigma^4)/sqrt(n)
    assert _sigmas(u.mean().item(), 0.5, math.sqrt(1 / 12 / n)) < 5
    assert _sigmas(u.var().item(), 1 / 12, math.sqrt(1 / 80 - 1 / 144) / math.sqrt(n)) < 5
    assert _sigmas(z.mean().item(), 0.0, 1 / math.sqrt(n)) < 5
    assert _sigmas(z.var().item(), 1.0, math.sqrt(2 / n)) < 5
    assert z.isfinite().all() and z.abs().max() < 6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_types_stay_below_one(plugin, dtype):
    u, z = torch.compile(lambda: (torch.rand(1 << 16, dtype=dtype), torch.randn(64, dtype=dtype)),
                         backend="coil")()
    assert u.dtype == z.dtype == dtype
    assert 0.0 <= u.min() and u.max() < 1.0 and len(u.unique()) > 100
    assert z.isfinite().all()


def test_reproducible_under_manual_seed_and_fresh_on_every_call(plugin):
    compiled = torch.compile(lambda x: F.dropout(x, 0.5, training=True) + torch.randn_like(x),
                             backend="coil")
    x = torch.ones(4096)
    torch.manual_seed(7)
    a, b = compiled(x), compiled(x)
    torch.manual_seed(7)
    assert torch.equal(compiled(x), a) and torch.equal(compiled(x), b)
    assert not torch.equal(a, b)


# ----------------------------------------------------------------------------- fusion and reports


def test_dropout_fuses_with_its_neighbours(plugin):
    x = torch.randn(64, 96)
    report = coil.explain(lambda x: F.dropout(torch.sin(x) * 2, 0.3, training=True).relu() + 1, x)
    assert not report.fallbacks and not report.library_calls
    (kernel,) = report.kernels
    assert "aten.native_dropout.default" in kernel.ops and "aten.sin.default" in kernel.ops


def test_random_factories_fuse_and_do_not_fall_back(plugin):
    x = torch.randn(33, 17)

    def fn(x):
        return (x + torch.rand_like(x) * torch.randn_like(x), torch.bernoulli(x.sigmoid()),
                torch.bernoulli(x, 0.25), torch.empty_like(x).uniform_(),
                torch.empty_like(x).normal_())

    report = coil.explain(fn, x)
    assert not report.fallbacks
    assert len(report.kernels) == 1, [k.name for k in report.kernels]


def test_uniform_and_normal_in_place(plugin):
    """``Tensor.uniform_`` and ``normal_`` (functionalized) are scaled draws: range and moments."""
    n = 1 << 18
    def fn(x):
        return torch.empty_like(x).uniform_(-1, 2), torch.empty_like(x).normal_(2, 3)

    u, z = torch.compile(fn, backend="coil")(torch.empty(n))
    assert -1 <= u.min() and u.max() < 2
    assert _sigmas(u.mean().item(), 0.5, 3 * math.sqrt(1 / 12 / n)) < 5
    assert _sigmas(z.mean().item(), 2.0, 3 / math.sqrt(n)) < 5
    assert _sigmas(z.var().item(), 9.0, 9 * math.sqrt(2 / n)) < 5


# ----------------------------------------------------------------------------- Bernoulli, dropout


def test_bernoulli_rates(plugin):
    n = 3 << 16
    probs = torch.tensor([0.0, 0.25, 1.0]).repeat_interleave(n // 3)
    scalar, tensor, inplace = torch.compile(
        lambda x, p: (torch.bernoulli(x, 0.3), torch.bernoulli(p), x.clone().bernoulli_(p)),
        backend="coil")(torch.empty(n), probs)
    assert scalar.dtype == torch.float32 and set(scalar.unique().tolist()) <= {0.0, 1.0}
    assert _sigmas(scalar.mean().item(), 0.3, math.sqrt(0.3 * 0.7 / n)) < 5
    for out in (tensor, inplace):
        chunks = out.view(3, -1)
        assert chunks[0].eq(0).all() and chunks[2].eq(1).all()
        assert _sigmas(chunks[1].mean().item(), 0.25, math.sqrt(0.25 * 0.75 / chunks.shape[1])) < 5


def _two_draw_hits(seed: torch.Tensor, n: int, p: torch.Tensor) -> torch.Tensor:
    """Where a probability ``p`` (float32) fires from the two draws at counters ``[0, n)`` and
    ``[n, 2n)``: bucket ``k`` of the first below ``p * 2^24``'s whole part, or at it with the
    second draw below its fraction (``coil.lowering.random._exactly_below``)."""
    k = philox_rand(seed, torch.arange(n)) * 2.0 ** 24
    scaled = p * 2.0 ** 24
    whole = scaled.floor()
    return (k < whole) | ((k == whole) & (philox_rand(seed, torch.arange(n) + n) < scaled - whole))


def test_a_probability_between_two_buckets_fires_at_its_rate(plugin):
    """One 24-bit draw fires with probability ``ceil(p * 2^24) / 2^24``: any ``p`` above 0 at
    least 2^-24 (a Bernoulli of 1e-9 fired 60 times too often; found by a hunt, session 38).
    Here each element's probability lies half a bucket above its own first draw, so one draw
    fires everywhere and two draws on about half; bit for bit against the reference."""
    n = 1 << 14
    torch.manual_seed(9)
    seed = _seed_after(9)
    first = philox_rand(seed, torch.arange(n))
    p = torch.where(first < 0.5, first + 2.0 ** -25, first)  # exact: first < 0.5 has ulp <= 2^-25
    torch.manual_seed(9)
    got = torch.compile(lambda p: torch.bernoulli(p), backend="coil")(p)
    expected = _two_draw_hits(seed, n, p)
    assert torch.equal(got, expected.float())
    assert 0.3 < got[first < 0.5].mean() < 0.7


def test_a_small_scalar_probability_uses_two_draws(plugin):
    """A number ``p`` below 2^-8 (Bernoulli, or dropout's keep probability) is drawn the same
    way, bit for bit; p = 1e-9 over 2^16 elements fires nowhere here."""
    n = 1 << 16
    for p in (2.0 ** -9 + 2.0 ** -25, 1e-9):
        torch.manual_seed(4)
        got = torch.compile(lambda x: torch.bernoulli(x, p), backend="coil")(torch.empty(n))
        expected = _two_draw_hits(_seed_after(4), n, torch.tensor(p, dtype=torch.float32))
        assert torch.equal(got, expected.float())
    assert got.sum() == 0


def test_uniform_never_returns_its_upper_bound(plugin):
    """``low + (high - low) * u`` rounds up to ``high`` where ``low`` is large against the
    width (122 of 4 million values for [1000, 1001)); eager's kernels give ``low`` there."""
    out = torch.compile(lambda x: x.uniform_(1000, 1001), backend="coil")(torch.zeros(1 << 20))
    assert out.max() < 1001 and out.min() >= 1000


@pytest.mark.parametrize("bounds", [(5.0, 2.0), (0.0, math.inf), (math.nan, 1.0), (-3e38, 3e38)], ids=str)
def test_uniform_bounds_eager_refuses_raise(plugin, bounds):
    """Found by a hunt (session 38): Coil drew numbers where eager raises."""
    with pytest.raises(RuntimeError, match="uniform_|out of bounds"):
        torch.zeros(16).uniform_(*bounds)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="uniform_|out of bounds"):
        torch.compile(lambda x: x.uniform_(*bounds), backend="coil")(torch.zeros(16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dropout_keeps_one_minus_p_and_scales_as_eager(plugin, dtype):
    """Kept elements equal eager's kept elements bit for bit (``x * mask * scale`` with the
    scale rounded as eager rounds it); dropped ones are zero; the mask is the keep pattern."""
    p, n = 0.3, 1 << 18
    x = _nonzero(n).to(dtype)
    out, mask = torch.compile(lambda x: aten.native_dropout(x, p, True), backend="coil")(x)
    assert out.dtype == dtype and mask.dtype == torch.bool
    assert torch.equal(mask, out != 0)
    assert _sigmas(mask.float().mean().item(), 1 - p, math.sqrt(p * (1 - p) / n)) < 5
    for eager in (aten.native_dropout(x, p, True)[0], F.dropout(x, p, training=True)):
        both = mask & (eager != 0)
        assert both.sum() > n // 4
        assert torch.equal(out[both], eager[both])


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_dropout_edge_probabilities_as_eager(plugin, p):
    x = torch.tensor([1.0, -3.0, 0.0, -0.0, math.inf, -math.inf, math.nan, 2.5])
    fns = {"native": lambda x: aten.native_dropout(x, p, True),
           "functional": lambda x: F.dropout(x, p, training=True),
           "eval": lambda x: aten.native_dropout(x, 0.5, False)}
    for name, fn in fns.items():
        report = coil.explain(fn, x)
        # p=1 stays in ATen (its CPU and CUDA kernels disagree on dropped infinities)
        expected = ["aten.native_dropout.default"] if p == 1.0 and name != "eval" else []
        assert report.fallbacks == expected, name
        for got, want in zip(_flat(report.result), _flat(fn(x))):
            # bitwise, signs of zeros and NaNs included
            assert got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan()), name
            assert torch.equal(got.nan_to_num().view(-1), want.nan_to_num().view(-1)), name
            if got.is_floating_point():
                assert torch.equal(got.signbit(), want.signbit()), name


def _flat(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def test_backward_uses_the_forward_mask(plugin):
    """The gradient is exactly ``mask * scale * grad_out`` with the forward's own mask."""
    p = 0.4
    x = _nonzero(64, 48).requires_grad_()
    graphs: list[GraphReport] = []
    add_observer(graphs.append)
    try:
        out = torch.compile(lambda x: F.dropout(x, p, training=True) * 3, backend="coil")(x)
        grad_out = torch.randn_like(out)
        out.backward(grad_out)
    finally:
        remove_observer(graphs.append)
    assert {g.kind for g in graphs} == {"forward", "backward"}
    assert not [op for g in graphs for op in g.fallback_ops]
    kept = out.detach() != 0
    assert 0.4 < kept.float().mean() < 0.8
    scale = torch.tensor(1 / (1 - p), dtype=torch.float32)  # backward: grad * (mask * scale)
    expected = torch.where(kept, grad_out * 3 * scale, torch.zeros(()))
    assert torch.equal(x.grad, expected)


def test_training_an_mlp_with_dropout_follows_eager(plugin):
    """Twenty SGD steps of a small MLP with dropout on: Coil's loss curve (averaged over
    windows of five steps) stays within the spread of eager's over four seeds (other random
    numbers, the same statistics), and it learns."""
    def train(compiled: bool, seed: int) -> list[float]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 48), nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 48),
                              nn.ReLU(), nn.Dropout(0.2), nn.Linear(48, 1))
        data = torch.Generator().manual_seed(1)
        inputs = torch.randn(128, 16, generator=data)
        targets = inputs @ torch.randn(16, 1, generator=data) / 4
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        step = torch.compile(model, backend="coil") if compiled else model
        torch.manual_seed(seed)
        losses = []
        for _ in range(20):
            loss = F.mse_loss(step(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    graphs: list[GraphReport] = []
    add_observer(graphs.append)
    try:
        coil_losses = torch.tensor(train(compiled=True, seed=1))
    finally:
        remove_observer(graphs.append)
    eager_losses = torch.tensor([train(compiled=False, seed=s) for s in range(1, 5)])
    assert not [op for g in graphs for op in g.fallback_ops]
    assert coil_losses[-1] < 0.4 * coil_losses[0]
    coil_windows, eager_windows = coil_losses.view(4, 5).mean(1), eager_losses.view(4, 4, 5).mean(2)
    mean, std = eager_windows.mean(0), eager_windows.std(0)
    assert ((coil_windows - mean).abs() <= 3 * std + 0.05 * mean).all(), (coil_losses, eager_losses)


# ----------------------------------------------------------------------------- what stays in ATen


def test_unsafe_random_ops_stay_in_aten(plugin):
    """An explicit generator (Dynamo breaks the graph on one, so this graph comes from make_fx)
    and a float64 ``rand`` are ATen's to draw; the results are the generator's own numbers."""
    if torch.torch_version.TorchVersion(torch.__version__) < "2.12" and os.environ.get("COIL_TEST_DEVICE"):
        pytest.skip("torch 2.11's make_fx rejects an explicit generator under a default device")
    generator = torch.Generator().manual_seed(3)
    gm = make_fx(lambda x: (torch.rand(8, generator=generator) + x,
                            aten.bernoulli.p(x, 0.5, generator=generator)))(torch.zeros(8))
    graphs: list[GraphReport] = []
    add_observer(graphs.append)
    try:
        generator.manual_seed(4)
        compiled = compile_graph(gm, [torch.zeros(8)], config.current(), "inference")
        result = compiled([torch.zeros(8)])
    finally:
        remove_observer(graphs.append)
    assert graphs[0].fallback_ops == ["aten.rand.generator", "aten.bernoulli.p"]
    expected = torch.Generator().manual_seed(4)
    assert torch.equal(result[0], torch.rand(8, generator=expected))
    assert torch.equal(result[1], torch.bernoulli(torch.zeros(8), 0.5, generator=expected))
    report = coil.explain(lambda x: torch.rand(8, dtype=torch.float64) + x, torch.zeros(8))
    assert report.fallbacks == ["aten.rand.default"]


def test_a_backend_without_random_ops_draws_in_aten(plugin):
    backend = plugins.registry().backends["cpu"]
    backend.capabilities = dataclasses.replace(backend.capabilities, random=False)
    x = _nonzero(1000)
    report = coil.explain(lambda x: F.dropout(x, 0.5, training=True) + 1, x)
    assert report.fallbacks == ["aten.native_dropout.default"]
    kept = report.result != 1
    assert torch.equal(report.result[kept], (x * 2 + 1)[kept])


def test_symbolic_sizes_claim_disjoint_counters(plugin):
    compiled = torch.compile(lambda x: (torch.rand_like(x), torch.rand_like(x)), backend="coil",
                             dynamic=True)
    for n in (300, 517):
        torch.manual_seed(2)
        a, b = compiled(torch.empty(n))
        seed = _seed_after(2)
        assert torch.equal(a, philox_rand(seed, torch.arange(n)))
        assert torch.equal(b, philox_rand(seed, torch.arange(n) + n))


@pytest.mark.parametrize("budget", [0.5, 0.0])
def test_a_memory_budget_never_recomputes_a_random_op(plugin, budget):
    """Below an ``activation_memory_budget`` of 1, torch's partitioner may recompute a random
    op in the backward graph, which draws other numbers (pytorch/pytorch#190758: every backend
    gave gradients through another mask; found by a hunt, session 38). Coil partitions such a
    graph with a budget of 1."""
    def fn(x):
        return (x * torch.rand(x.shape)).sin(), F.dropout(x, 0.4).cos()

    torch._dynamo.reset()
    x = (torch.rand(4096) + 0.5).requires_grad_()
    with functorch_config.patch(activation_memory_budget=budget):
        y, z = torch.compile(fn, backend="coil")(x)
        (y.sum() + z.sum()).backward()
    xd = x.detach()
    r = torch.asin(y.detach()) / xd
    mask = (torch.acos(z.detach()) / xd)  # 1 / (1 - p) where kept, 0 where dropped
    implied = torch.cos(xd * r) * r - torch.sin(xd * mask) * mask
    torch.testing.assert_close(x.grad, implied, rtol=1e-4, atol=1e-4)
