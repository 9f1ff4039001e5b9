"""The C++ plugin's loop schedules against eager: tiled transposes (plugins/cpu_cpp/tiling.py)
and stashes in a float scratch row (plugins/cpu_cpp/stash.py), in every dtype they touch,
at sizes that do and do not divide the tile."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import coil  # noqa: F401  (registers the backend)
from coil_cpu_cpp import tiling

import isa
from conftest import TEST_BACKEND
from helpers import check

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cpu_cpp", reason="C++ plugin schedules")

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32]


def _tol(dtype: torch.dtype) -> float:
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5


def _rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape).to(dtype)
    return torch.randint(-100, 100, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 96), (70, 45), (33, 200)])
def test_transpose_add_is_tiled(dtype, shape):
    m, n = shape
    x, y = _rand(m, n, dtype=dtype), _rand(n, m, dtype=dtype)
    r = check(lambda x, y: x + y.t() * 2, x, y, atol=_tol(dtype), rtol=_tol(dtype))
    assert len(r.kernels) == 1 and "_tile" in r.kernels[0].source


def test_transpose_in_3d_and_transposed_store():
    x = torch.randn(3, 40, 50)
    r = check(lambda x: (x.transpose(1, 2) + 1).contiguous(), x)
    assert "_tile" in r.kernels[0].source
    y = torch.randn(2, 37, 64)
    check(lambda x, y: x.permute(0, 2, 1) * y[:, :1, :].permute(0, 2, 1).exp(), torch.randn(2, 37, 64), y)


@pytest.mark.parametrize("built", list(isa.FLAGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("shape", [(64, 96), (70, 45), (32, 32), (33, 200)])
def test_a_transposed_read_goes_through_a_local_tile(built, dtype, shape, threads):
    """A 4-byte tensor read across its rows is copied tile by tile into a local array through
    registers (``coil_transpose.h``: 16x16 blocks with AVX-512, 8x8 with AVX2, the ragged
    edges element by element), at sizes that are and are not whole blocks and tiles; the
    values are eager's exactly (NaN payloads kept: the copy moves bits)."""
    m, n = shape
    x, y = _rand(m, n, dtype=dtype), _rand(n, m, dtype=dtype)
    if dtype == torch.float32:
        y[3, 5] = torch.tensor(0x7FC01234, dtype=torch.int32).view(torch.float32)  # a NaN with a payload
    with isa.built_for(built):
        r = coil.explain(lambda x, y: x + y.t() * 2, x, y)
    expected = x + y.t() * 2
    whole = m % tiling.TILE == 0 and n % tiling.TILE == 0  # else a second copy for the edge tiles
    assert r.kernels[0].source.count("coil::transpose_tile") == (1 if whole else 2), r.kernels[0].source
    got = r.result
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32)) if dtype == torch.float32 \
        else torch.equal(got, expected)


@pytest.mark.parametrize("shape", [(64, 96), (70, 45), (33, 200)])
def test_a_transpose_under_dynamic_sizes_is_tiled(shape):
    """Under ``dynamic=True`` the transposed tensor's stride is a size symbol: the kernel is
    still tiled and copies tiles through registers (it was the untiled loop, 7x slower at
    1536x4096), with the edge tiles bounded by the sizes at run time."""
    m, n = shape
    x, y = torch.randn(m, n), torch.randn(n, m)
    r = check(lambda x, y: x + y.t() * 2, x, y, dynamic=True)
    source = r.kernels[0].source
    assert re.search(r"coil::transpose_tile\(&\w+\[[^]]*\], s\d+,", source), source  # a symbolic stride
    assert "_tile + 32 <= s" in source, source  # full tiles tested against the sizes


def test_two_transposed_reads_and_a_batch_dim_each_get_a_tile():
    x, y, z = torch.randn(3, 40, 50), torch.randn(3, 50, 40), torch.randn(50, 40)
    r = check(lambda x, y, z: x.transpose(1, 2) * y + z + (x + y.transpose(1, 2)).transpose(1, 2), x, y, z)
    assert all(k.source.count("coil::transpose_tile") <= 4 for k in r.kernels)  # 2 per tile shape
    assert any("coil::transpose_tile" in k.source for k in r.kernels)


def test_other_element_sizes_keep_the_strided_loads():
    x, y = torch.randn(64, 96, dtype=torch.float64), torch.randn(96, 64, dtype=torch.float64)
    r = check(lambda x, y: x + y.t(), x, y)
    assert "_tile" in r.kernels[0].source and "coil::transpose_tile" not in r.kernels[0].source


def test_bias_per_row_is_not_tiled():
    # a per-row bias is unit-stride along the outer dim but broadcast along the inner one
    x, b = torch.randn(64, 128), torch.randn(64, 1)
    r = check(lambda x, b: x + b, x, b)
    assert "_tile" not in r.kernels[0].source


def test_short_dims_are_not_tiled():
    x, y = torch.randn(8, 300), torch.randn(300, 8)
    r = check(lambda x, y: x + y.t(), x, y)
    assert "_tile" not in r.kernels[0].source


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("cols", [7, 64, 1000])
def test_half_softmax_stashes_exp_in_a_float_row(dtype, cols):
    x = (torch.randn(37, cols) * 4).to(dtype)
    x[3, :3] = float("-inf")
    r = check(lambda x: torch.softmax(x, dim=-1), x, atol=_tol(dtype), rtol=_tol(dtype))
    assert len(r.kernels) == 1
    source = r.kernels[0].source
    last_pass = source[source.rindex("_combine<"):]  # after the sum's lanes are combined
    assert "coil::exp_" in source and "coil::exp_" not in last_pass
    assert ("scratch" in source) == (dtype in (torch.bfloat16, torch.float16))


def test_half_log_softmax_and_softmax_over_two_dims():
    x = torch.randn(6, 20, 30).to(torch.bfloat16)
    check(lambda x: F.log_softmax(x, dim=-1), x, atol=1e-2, rtol=1e-2)
    check(lambda x: torch.softmax(x.float(), dim=-1).to(torch.bfloat16) * x, x, atol=1e-2, rtol=1e-2)
    y = torch.randn(4, 8, 16).to(torch.float16)
    check(lambda y: torch.exp(y - y.amax(dim=(1, 2), keepdim=True)) /
          torch.exp(y - y.amax(dim=(1, 2), keepdim=True)).sum(dim=(1, 2), keepdim=True), y, atol=1e-2, rtol=1e-2)


def test_row_too_long_for_scratch_keeps_recomputing():
    x = torch.randn(2, 20000).to(torch.bfloat16)
    r = check(lambda x: torch.softmax(x, dim=-1), x, atol=1e-2, rtol=1e-2)
    assert "scratch" not in r.kernels[0].source


def test_few_rows_split_schedule_half_softmax():
    x = torch.randn(4, 50000).to(torch.bfloat16)
    check(lambda x: torch.softmax(x, dim=-1), x, atol=1e-2, rtol=1e-2)


def test_division_by_a_row_invariant_matches_eager_at_the_edges():
    # the divisor is computed once per row and each element divided by it in float, as eager
    # divides: denormal, huge, zero, inf and NaN divisors must give eager's quotients (the
    # sums differ from eager's in the last places: they add in another order)
    x = torch.randn(8, 100)
    x[0] = x[0].abs() * 1e-41  # denormal row sum
    x[1] *= 1e37  # sums near the top of the float range
    x[2] = 0.0  # 0 / 0
    x[3, 5] = float("inf")
    x[4, 7] = float("nan")
    x[5] = torch.finfo(torch.float32).tiny / 4  # denormal elements and sum
    r = check(lambda x: x / x.sum(-1, keepdim=True), x, atol=0, rtol=1e-5)
    assert "/ v_buf0)" in r.kernels[0].source and "double" not in r.kernels[0].source
    y = torch.rand(16, 300) + 0.5
    check(lambda y: y / y.amax(-1, keepdim=True) + y / 3.0, y, atol=0, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eval_batch_norm_computes_its_per_channel_scale_once_per_row(dtype):
    """An eval-mode batch norm over NCHW: ``weight / sqrt(var + eps)`` depends on the channel
    only, so it is computed before the innermost (W) loop, not at every element."""
    bn = torch.nn.BatchNorm2d(6).eval()
    bn.running_var.uniform_(0.5, 2.0)
    bn.running_mean.normal_()
    bn = bn.to(dtype)
    x = torch.randn(2, 6, 5, 7).to(dtype)
    with torch.no_grad():
        r = check(lambda x: F.relu(bn(x)), x, atol=_tol(dtype), rtol=_tol(dtype))
    source = r.kernels[0].source
    assert source.index("std::sqrt") < source.index("#pragma omp simd"), source


def test_row_invariant_integer_division_matches_eager():
    """Integer divisions by a value the same along the row stay in the loop (never hoisted
    out of a body that guards them); the results are eager's."""
    x = torch.randint(-50, 50, (4, 9), dtype=torch.int64)
    d = torch.tensor([[0], [3], [0], [-7]], dtype=torch.int64)
    check(lambda x, d: torch.where(d != 0, x % torch.where(d == 0, 1, d), -1) + x // (d * d + 1), x, d)


# -- small kernels stay on one thread without OpenMP (plugins/cpu_cpp/cpp.py: parallel_for)


def _kernel_with(report, fragment: str):
    found = [k for k in report.kernels if fragment in k.name]
    assert found, [k.name for k in report.kernels]
    return found[0].source


@pytest.mark.parametrize("shape", [(32, 256), (7, 33), (1, 64), (4, 1000)])
def test_few_short_rows_use_the_inner_schedule(shape):
    """Few kept points over a short reduced dim: no parallel region per row (the split
    schedule's), OpenMP only where the passes over the rows add up to more than the
    parallel threshold (a log-softmax reads each row three times), and eager's values."""
    x = torch.randn(*shape)
    r = check(lambda x: torch.log_softmax(x, -1), x)
    source = r.kernels[0].source
    assert "ordered" not in source
    assert ("omp parallel" in source) == (3 * x.numel() > 16384 and torch.get_num_threads() > 1)
    r = check(lambda x: (x.sum(), x.amax(), x.var()), x, atol=1e-4, rtol=1e-4)  # no kept dims
    assert all("omp parallel" not in k.source for k in r.kernels)


@pytest.mark.parametrize("shape,dim", [((2, 1, 4, 5), 2), ((8, 4, 5), 1)])
def test_normalize_gradient_over_four_elements(shape, dim):
    """The kernel that segfaulted in the OpInfo gradient sweep: F.normalize's gradient sums 4
    elements per kept point on one thread (inner schedule, no OpenMP region), and GCC 12.2 put
    its lane array in the red zone at an address its aligned stores could not use (see
    FLAGS in plugins/cpu_cpp/toolchain.py). The first shape is the sweep's sample (10 kept
    points, on the split schedule while the rule was taken back); the second has 40, more than
    ``SMALL_X``, and crashed on the inner schedule either way."""
    x, w = torch.randn(*shape, requires_grad=True), torch.randn(*shape)

    def step(x, w):
        return torch.autograd.grad((F.normalize(x, dim=dim) * w).sum(), x)[0]
    got = torch.compile(step, backend="coil", dynamic=False)(x, w)
    torch.testing.assert_close(got, step(x, w), atol=1e-5, rtol=1e-5)


def test_few_long_rows_keep_the_split_schedule():
    x = torch.randn(4, 50000)
    r = check(lambda x: torch.softmax(x, dim=-1), x)
    assert "ordered" in r.kernels[0].source
    r = check(lambda x: x.sum(), x, atol=1e-3, rtol=1e-4)  # sums in another order than eager
    assert "ordered" in r.kernels[0].source


@pytest.mark.parametrize("shape", [(64, 200), (300, 300)])
def test_pointwise_pragma_by_size(shape):
    x = torch.randn(*shape)
    r = check(lambda x: torch.sigmoid(x) * 2 + x, x)
    parallel = shape[0] * shape[1] > 16384
    assert ("omp parallel" in r.kernels[0].source) == parallel
    assert "omp simd" in r.kernels[0].source


@pytest.mark.parametrize("rows,tokens", [(256, (2, 16)), (1000, (8, 512))])
def test_float_scatter_adds_run_in_order_and_equal_eager(rows, tokens):
    """The scatter-add of an embedding's gradient runs on one thread in the sources' order, as
    eager adds, however large: with atomic float adds shared by threads, every call gave other
    sums (found by a hunt, session 38). Integer adds stay atomic where threads share them."""
    weight = torch.randn(rows, 64, requires_grad=True)
    ids = torch.randint(0, rows, tokens)
    ids[0, :4] = 3  # repeated rows accumulate

    def step(weight, ids):
        return torch.autograd.grad(F.embedding(ids, weight).square().sum(), weight)[0]
    want = step(weight, ids)
    compiled = torch.compile(step, backend="coil")
    for _ in range(3):
        assert torch.equal(compiled(weight, ids), want)
    x = torch.randn(*tokens, 64)
    r = check(lambda x, ids: torch.zeros(rows, 64).index_put((ids,), x, accumulate=True), x, ids)
    assert "omp atomic" not in r.kernels[-1].source
    n = torch.randint(0, 9, (*tokens, 64))
    r = check(lambda n, ids: torch.zeros(rows, 64, dtype=torch.int64).index_put((ids,), n, accumulate=True), n, ids)
    assert ("omp atomic" in r.kernels[-1].source) == (ids.numel() * 64 > 16384)


# -- the outer schedule split at a divisor (plugins/cpu_cpp/divmod_split.py)


def test_attention_bias_gradient_sums_contiguous_columns():
    """A ViT block's qkv bias gradient: q, k and v gradients laid out (B, N, H, D), stacked
    and merged into (B*N, 3*H*D), summed over rows. The columns' index ``x % 64 +
    64*((x / 64) % 3)`` folds into ``x % 192``, so the column loop splits at 192 and every
    load is contiguous along the lanes."""
    def f(q, k, v):
        g = torch.stack([q, k, v]).permute(1, 3, 0, 2, 4).reshape(34, 576)
        return g.sum(0), g * 2
    q, k, v = (torch.randn(2, 17, 3, 64).transpose(1, 2) for _ in range(3))
    r = check(f, q, k, v)
    source = _kernel_with(r, "sum")
    assert "x0_hi" in source and "% 64" not in source and "/ 64" not in source
    check(lambda x: x.permute(1, 0, 2).reshape(5, 96).sum(0), torch.randn(2, 5, 48))


def test_fold_mod_chains_keeps_the_value():
    """The C++ plugin's loop split folds mod chains with the SDK's ``fold_divmod``."""
    import sympy
    from coil.sdk import FloorDiv, ModIdx
    from coil.sdk.symbolic import fold_divmod as fold_mod_chains
    x = sympy.Symbol("x0", integer=True, nonnegative=True)
    y = sympy.Symbol("r0", integer=True, nonnegative=True)
    cases = [ModIdx(x, 64) + 64 * ModIdx(FloorDiv(x, 64), 3) + 192 * y,
             2 * ModIdx(x, 4) + 8 * ModIdx(FloorDiv(x, 4), 2) + 16 * ModIdx(FloorDiv(x, 8), 3),
             ModIdx(x, 4) + 5 * ModIdx(FloorDiv(x, 4), 2)]  # not a chain: left alone
    folded = [fold_mod_chains(e) for e in cases]
    assert folded[0] == ModIdx(x, 192) + 192 * y
    assert folded[1] == 2 * ModIdx(x, 24)
    assert folded[2] == cases[2]
    for e, f in zip(cases, folded):
        for xv in range(0, 500, 7):
            assert e.subs({x: xv, y: 3}) == f.subs({x: xv, y: 3})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_over_channels_after_a_permute_uses_the_outer_schedule(dtype):
    """Swin's and Whisper's layer norm over the channels of a channels-first tensor: each row
    is strided by H*W in the input, contiguous in the output, and the weight and bias are
    read by channel alone. Those two loads are the same few elements for every row and do
    not vote for the lanes-over-the-row schedule; the lanes then run along the input's
    contiguous dim (the outer schedule)."""
    x = torch.randn(2, 32, 9, 17).to(dtype)
    w, b = torch.randn(32).to(dtype), torch.randn(32).to(dtype)
    r = check(lambda x, w, b: F.layer_norm(x.permute(0, 2, 3, 1), (32,), w, b), x, w, b,
              atol=_tol(dtype), rtol=_tol(dtype))
    assert len(r.kernels) == 1 and "OUTER_BLOCK" in r.kernels[0].source


def test_row_norm_keeps_the_inner_schedule():
    x, w, b = torch.randn(64, 96), torch.randn(96), torch.randn(96)
    r = check(lambda x, w, b: F.layer_norm(x, (96,), w, b), x, w, b)
    assert len(r.kernels) == 1 and "OUTER_BLOCK" not in r.kernels[0].source


# -- reductions: passes in the parallel threshold, gathered tables (reduction_loops.py, tables.py)


def _window_softmax(scores, table, index, mask):
    """Swin's shifted-window attention scores: a relative-position bias gathered through
    ``index`` (the same for every window) and a per-window mask, then a softmax."""
    bias = table[index.view(-1)].view(16, 16, -1).permute(2, 0, 1)
    s = scores.view(-1, 4, 2, 16, 16) + bias.unsqueeze(0).unsqueeze(0) + mask.unsqueeze(1).unsqueeze(0)
    return torch.softmax(s.view(-1, 2, 16, 16), dim=-1)


def test_gathered_bias_of_a_row_softmax_is_tabled_once_per_call():
    """The gather does not depend on the window: one table filled before the loop nest, read
    by the max and the exp passes, with the index's negative entries wrapped as eager does."""
    scores, table = torch.randn(32, 2, 16, 16), torch.randn(49, 2)
    index = torch.randint(-49, 49, (16, 16))
    mask = torch.where(torch.rand(4, 16, 16) > 0.8, -100.0, 0.0)
    r = check(_window_softmax, scores, table, index, mask)
    source = _kernel_with(r, "amax")
    nest = source.index("for (int64_t x0")
    assert "tab0_0[" in source[nest:] and source.index("tab0_0[") < nest, source
    assert not re.search(r"\bind\d+", source[nest:]), source  # no gather left in the nest


def test_gathered_values_in_a_pointwise_kernel_are_tabled():
    """A pointwise kernel gathering by the innermost dim alone: the gather runs once per
    column, not once per element; values as eager's, negative indices included."""
    x, table = torch.randn(64, 40), torch.randn(50)
    index = torch.randint(-50, 50, (40,))
    r = check(lambda x, t, i: x * 2 + t[i], x, table, index)
    source = r.kernels[0].source
    nest = source.index("for (int64_t x0")
    assert "tab0_0[" in source[nest:] and not re.search(r"\bind\d+", source[nest:]), source


def test_reduction_passes_count_toward_the_parallel_threshold():
    """1024 rows of 16: 16384 points, each visited by three passes of a softmax, so the
    threads share the rows; a sum over the same points (one pass) stays on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1024, 16)
        assert "omp parallel" in check(lambda x: torch.softmax(x, -1), x).kernels[0].source
        assert "omp parallel" not in check(lambda x: x.sum(-1), x, atol=1e-5).kernels[0].source
    finally:
        torch.set_num_threads(threads)


def test_repeated_per_channel_factors_do_not_vote_for_the_outer_schedule():
    """A batch-norm gradient over rows of 512 (nfnet's scaled weight standardisation, found
    by a hunt): its per-channel factors appear several times in the expression, and counted
    once per place they outvoted the contiguous rows; the outer schedule then read every row
    at a stride (60x slower than now at rows of 128) and GCC took 180 s to build it."""
    n = 512

    def grad(g, w, mean, invstd, gain):
        s1 = g.sum(1, keepdim=True)
        s2 = (g * (w - mean)).sum(1, keepdim=True)
        gi = (g - (w - mean) * (s2 / n * invstd * invstd) - s1 / n) * (invstd * gain * 0.158)
        return gi, s2 * invstd * 0.158
    args = [torch.randn(384, n), torch.randn(384, n), torch.randn(384, 1), torch.rand(384, 1) + 0.5,
            torch.randn(384, 1)]
    r = check(grad, *args, atol=1e-4, rtol=1e-4)
    assert all("OUTER_BLOCK" not in k.source for k in r.kernels)


def test_the_outer_schedule_groups_reduced_elements_only_over_contiguous_lanes():
    """The outer schedule's lanes take four reduced elements in turn where every access is
    contiguous along them (a column sum), and one at a time where one is strided (a
    transposed operand): GCC vectorises the grouped loop over gathers whatever the cost,
    and its build time grew from a few tenths of a second to minutes."""
    x, y = torch.randn(512, 1024), torch.randn(1024, 512)
    r = check(lambda x: (x * 2).sum(0), x, atol=1e-4, rtol=1e-4)
    assert "OUTER_BLOCK" in r.kernels[0].source and "r0_group" in r.kernels[0].source
    r = check(lambda x, y: (x * y.t() + x).sum(0), x, y, atol=1e-4, rtol=1e-4)
    assert "OUTER_BLOCK" in r.kernels[0].source and "r0_group" not in r.kernels[0].source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_over_merged_neighbours_splits_the_reduced_loop(dtype):
    """Swin's patch merging: the four 2x2 neighbours' channels side by side, normalised.
    The channel index reaches the source as ``r / 64``, ``(r / 32) % 2`` and ``r % 32``; the
    lanes run over ``r % 32`` (a split at 32), so no division is left inside them."""
    x = torch.randn(2, 16, 16, 32).to(dtype)
    w, b = torch.randn(128).to(dtype), torch.randn(128).to(dtype)

    def merge(x, w, b):  # timm's PatchMerging
        x = (x + 1).reshape(2, 8, 2, 8, 2, 32).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return F.layer_norm(x, (128,), w, b)
    r = check(merge, x, w, b, atol=_tol(dtype), rtol=_tol(dtype))
    source = _kernel_with(r, "var_mean")
    assert "r0_hi" in source and "r0_lo = lane" in source, source
    lanes = source[source.index("r0_lo = lane"):]
    assert "r0 /" not in lanes and "r0 %" not in lanes, source


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_interpolation_indices_stay_beside_their_tables(mode):
    """Interpolation reads its input through indices computed from the loop variables: what
    computes an index may be tabled, but the index itself is spelled by its symbol inside the
    load, so it must stay a local (tabling it left the symbol undeclared: a compile error)."""
    x = torch.randn(2, 3, 4, 4)
    check(lambda x: F.interpolate(x, size=(3, 5), mode=mode, align_corners=False), x, atol=1e-5, rtol=1e-5)
    check(lambda x: F.pad(x, (-1, 2, 1, -1), mode="replicate"), x)
