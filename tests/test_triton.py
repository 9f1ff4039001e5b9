"""The Triton plugin's kernels against eager PyTorch, under Triton's interpreter on CPU
tensors (whatever ``COIL_TEST_BACKEND`` says): masks only where sizes need them, persistent
and looped reductions (Welford, argmax/argmin with ties and NaN, column sums, half and
integer types), symbolic sizes, scans, scatters, bounds checks, kernel names, and the
autotuner with its disk cache. Tensors are tiny: the interpreter runs each program in numpy."""
from __future__ import annotations

import dataclasses
import glob
import os

import re

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

import coil  # noqa: E402
from coil import plugins  # noqa: E402
from coil.sdk import KernelCompileError  # noqa: E402
from coil_cuda_triton import autotune, mathlib  # noqa: E402
from coil_cuda_triton import backend as triton_backend  # noqa: E402
from coil_cuda_triton.backend import TritonBackend  # noqa: E402
from coil_cuda_triton.configs import Config  # noqa: E402

from helpers import check  # noqa: E402

@pytest.fixture(autouse=True)
def _clean_language():
    """Interpreted launches patch ``triton.language`` and leave some patches behind, after
    which ``triton.compile`` fails in this process (tests/test_triton_mathlib.py compiles
    for Hopper); :func:`mathlib.interpreting` undoes them when the test ends."""
    with mathlib.interpreting():
        yield


def _route(backend: TritonBackend) -> TritonBackend:
    backend.device_type = "cpu"
    coil.register_backend_for_device("cpu", backend, name="triton-interpreter-tests")
    return backend


@pytest.fixture
def interpreted():
    """Route ``cpu`` to a fresh interpreted Triton backend; the registry is rebuilt after."""
    if not triton.knobs.runtime.interpret:
        pytest.skip("Triton's interpreter is off (TRITON_INTERPRET must be set before triton is "
                    "imported; tests/conftest.py sets it where there is no GPU)")
    plugins.reset()
    yield lambda **kw: _route(TritonBackend(interpret=True, **kw))
    plugins.reset()


@pytest.fixture
def backend(interpreted):
    return interpreted()


def _sources(report) -> list[str]:
    assert report.kernels, "no kernel reached the Triton backend"
    return [k.source for k in report.kernels]


# ----------------------------------------------------------------------------- pointwise


def test_pointwise_without_mask_when_every_block_divides(backend):
    x = torch.randn(4096)  # candidates XBLOCK=1024, 2048 both divide 4096
    report = check(lambda x: torch.sin(x) * 2 + 1, x)
    (source,) = _sources(report)
    assert "mask" not in source


@pytest.mark.parametrize("n", [1000, 3000])
def test_pointwise_ragged_size_is_masked(backend, n):
    report = check(lambda x, y: torch.relu(x) - y, torch.randn(n), torch.randn(n))
    (source,) = _sources(report)
    assert "xmask" in source


def test_transpose_and_broadcast(backend):
    x, b = torch.randn(24, 16), torch.randn(24)
    check(lambda x, b: (x.t() + b) * x.t().sigmoid(), x, b)


@pytest.mark.parametrize("shape, perm", [((64, 48), (1, 0)), ((4, 33, 40), (0, 2, 1)), ((40, 20), (1, 0))])
def test_transposing_copy_uses_2d_tiles(backend, shape, perm):
    """Reading along one dim and writing along another: [rows, columns] tiles (both sides
    coalesced on the GPU), masked where a tile overhangs."""
    report = check(lambda x: x.permute(*perm).contiguous() * 2, torch.randn(shape))
    (source,) = _sources(report)
    assert "columns = tl.cdiv(" in source and "rindex" in source


def test_cat_with_a_transposed_piece_uses_2d_tiles(backend):
    """Swin's window attention backward: q, k and v gradients of windows (k's transposed, as
    its matrix product leaves it) concatenated into the tokens' qkv gradient. The dims are
    folded by the views (divisions and remainders in the indices), so the transposed read is
    found by stepping the index, not from its coefficients."""
    w, h, n, d = 6, 3, 49, 32
    q, v = torch.randn(w, h, n, d), torch.randn(w, h, n, d)
    kt = torch.randn(w, h, d, n)

    def fn(q, kt, v):
        qkv = torch.stack([q * d ** -0.5, kt.transpose(-2, -1), v])
        return qkv.permute(1, 3, 0, 2, 4).reshape(w * n, 3 * h * d)
    report = check(fn, q, kt, v)
    (source,) = _sources(report)
    assert "columns = tl.cdiv(" in source and "rindex" in source, source


# ----------------------------------------------------------------------------- reductions


def test_persistent_softmax(backend):
    report = check(lambda x: torch.softmax(x, -1), torch.randn(8, 100))
    (kernel,) = report.kernels
    assert "for roffset" not in kernel.source
    assert "amax" in kernel.name and "exp" in kernel.name


def test_looped_softmax_and_layer_norm(backend):
    x, w, b = torch.randn(4, 10000), torch.randn(10000), torch.randn(10000)
    report = check(lambda x: torch.softmax(x, -1), x, atol=1e-6, rtol=1e-4)
    assert all("for roffset" in s for s in _sources(report))
    report = check(lambda x, w, b: F.layer_norm(x, (10000,), w, b), x, w, b, atol=1e-4, rtol=1e-4)
    assert all("for roffset" in s for s in _sources(report))
    assert any("_cm2 = tl.sum(" in s for s in _sources(report))  # lane states of a looped Welford


def test_looped_online_softmax_edge_rows(backend):
    """The looped online max-and-sum (one exponential per element, ``exp(-|b - m|)``) on rows
    whose maximum rises, falls, and holds -inf, +inf or NaN, for softmax and logsumexp."""
    n = 12000  # looped: longer than a persistent row
    x = torch.randn(8, n)
    x[1] = torch.arange(n, dtype=torch.float32) / 100  # the maximum grows at every element
    x[2] = -torch.arange(n, dtype=torch.float32) / 100  # it never grows after the first
    x[3, ::3] = float("-inf")  # masked positions, as attention masks write them
    x[4] = float("-inf")  # a fully masked row
    x[5, 17] = float("inf")
    x[6, 9000] = float("nan")
    x[7] = 3.0  # ties everywhere
    report = check(lambda x: torch.softmax(x, -1), x, atol=1e-6, rtol=1e-4)
    assert any("_e = tl.exp(-tl.abs(" in s for s in _sources(report)), _sources(report)
    check(lambda x: torch.logsumexp(x, -1), x, atol=1e-6, rtol=1e-4)
    check(lambda x: F.cross_entropy(x[[0, 1, 2, 3, 5, 7]], torch.tensor([0, 11999, 1, 2, 17, 9])), x,
          atol=1e-5, rtol=1e-4)


def test_looped_welford_var_mean(backend):
    x = torch.randn(4, 10000) * 3 + 5
    report = check(lambda x: torch.var_mean(x, -1, correction=1), x, atol=1e-4, rtol=1e-4)
    assert any("for roffset" in s and "_cm2 = tl.sum(" in s for s in _sources(report))


@pytest.mark.parametrize("cols", [100, 10000], ids=["persistent", "looped"])
def test_argmax_argmin_ties_and_nan(backend, cols):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (4, cols), generator=g).float()  # many ties: the first index wins
    x[1, cols // 3] = float("nan")
    x[2, cols // 2] = float("nan")
    x[2, cols - 1] = float("nan")  # the first NaN wins
    report = check(lambda x: (x.argmax(-1), x.argmin(-1)), x)
    looped = any("for roffset" in s for s in _sources(report))
    assert looped == (cols == 10000)


@pytest.mark.parametrize("shape", [(64, 32), (20000, 8)], ids=["short", "tall"])
def test_column_reductions(backend, shape):
    # tall: a looped Welford and a sum that may be split into partial and combining kernels
    check(lambda x: (x.sum(0), x.var(0)), torch.randn(shape), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_reductions(backend, dtype):
    x = torch.randn(8, 100).to(dtype)
    check(lambda x: (x.sum(-1), x.amax(-1), x.mean(-1) * 2), x, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_reductions(backend, dtype):
    x = torch.randint(-100, 100, (8, 100), dtype=dtype)
    check(lambda x: (x.sum(-1), x.amax(-1), x.amin(0), x.argmax(-1)), x)


# ----------------------------------------------------------------------------- symbolic sizes


def test_dynamic_shapes_compile_once(backend):
    def fn(x):
        return torch.softmax(x, -1) * 2 + x.sum(-1, keepdim=True)

    compiled = torch.compile(fn, backend="coil", dynamic=True)
    for rows, cols in [(3, 7), (5, 100), (2, 1500)]:
        x = torch.randn(rows, cols)
        torch.testing.assert_close(compiled(x), fn(x), atol=1e-4, rtol=1e-4)
        if rows == 3:
            kernels = len(backend.generated)
            assert kernels > 0
            assert all(src.params[len(src.buffers):] for src, _ in backend.generated), \
                "a kernel with static sizes under dynamic=True"
    assert len(backend.generated) == kernels, "a new size recompiled"


# ----------------------------------------------------------------------------- scans and scatters


def test_cumsum_and_cumprod(backend):
    x = torch.randn(4, 300)
    check(lambda x: x.cumsum(-1), x, atol=1e-4, rtol=1e-4)
    check(lambda x: (x * 0.01 + 1).cumprod(0), torch.randn(7, 5), atol=1e-5, rtol=1e-5)


def test_index_add_and_index_put_accumulate(backend):
    x, i, v = torch.randn(10, 3), torch.tensor([0, 2, 2, 9, 2]), torch.randn(5, 3)
    check(lambda x, i, v: x.index_add(0, i, v), x, i, v)
    check(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), x, i, v)
    # float amax has no Triton atomic: one program applies the sources in order
    check(lambda x, i, v: x.scatter_reduce(0, i, v, "amax"), torch.randn(10), i, torch.randn(5))


def test_accumulating_scatters_of_a_constant(backend):
    """A constant source (``ones``, ``full``, a 0-d value) reaches the atomic as one value
    broadcast to the block: the interpreter's atomics read it as if laid out, and wrote garbage
    over the whole output (a hunt, session 37)."""
    i = torch.tensor([0, 1, 1])
    check(lambda x, i: torch.index_put(x, (i,), torch.ones(3, 3), accumulate=True), torch.zeros(2, 3), i)
    check(lambda x, i: (x + 1).index_add(0, i, torch.full((3, 3), 2.0)), torch.zeros(2, 3), i)
    check(lambda x, i: torch.index_put(x.long(), (i,), torch.ones(3, 3, dtype=torch.long), accumulate=True),
          torch.zeros(2, 3), i)
    check(lambda x: torch.zeros(3).index_add_(0, torch.tensor([0, 2, 2, 2, 1]), torch.ones(5)) * x, torch.randn(3))
    check(lambda x, i: torch.index_put(x, (i,), x[0, 0] + 1, accumulate=True), torch.zeros(2, 3), i)


# ----------------------------------------------------------------------------- the autotuner


@pytest.fixture
def launchers(monkeypatch):
    """Every Launcher the Triton backend builds during the test."""
    made = []

    class Recorded(triton_backend.Launcher):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(triton_backend, "Launcher", Recorded)
    return made


def test_autotune_tunes_once_then_reads_the_disk_cache(interpreted, launchers, tmp_path):
    def fn(x):
        return torch.softmax(x, -1)

    x = torch.randn(8, 100)
    with coil.config.override(cache_dir=str(tmp_path)):
        interpreted(tune_in_interpreter=True)
        first = check(fn, x).result
        assert sum(la.tuned for la in launchers) > 0
        assert glob.glob(os.path.join(str(tmp_path), "triton-autotune", "*.json"))

        launchers.clear()
        interpreted(tune_in_interpreter=True)  # a new backend instance: nothing in memory
        second = check(fn, x).result
        assert launchers and sum(la.tuned for la in launchers) == 0
    torch.testing.assert_close(second, first)


def _fake_runs(times: dict[Config, float | Exception]):
    def run(cfg):
        def launch():
            outcome = times[cfg]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return launch
    return run


def _bench(launch):
    return launch()


def test_select_picks_the_fastest_and_skips_failures():
    a, b, c = Config(64), Config(128), Config(256)
    times = {a: 3.0, b: RuntimeError("out of resources"), c: 1.5}
    best, timings = autotune.select([a, b, c], _fake_runs(times), _bench)
    assert best == c
    assert timings == {str(a): 3.0, str(c): 1.5}


def test_select_raises_when_every_config_fails():
    a, b = Config(64), Config(128)
    times = {a: RuntimeError("no"), b: ValueError("neither")}
    with pytest.raises(KernelCompileError, match="every candidate configuration failed"):
        autotune.select([a, b], _fake_runs(times), _bench)


def test_repeated_layers_share_one_function_and_launcher(backend):
    """Layers that generate the same kernel under other buffer names (a transformer's twelve)
    load, build and tune one function, in one graph and across graphs."""
    def layers(x, *ws):
        for w in ws:
            x = F.layer_norm(x @ w, (64,)).relu() + x
        return x

    x, ws = torch.randn(8, 64), [torch.randn(64, 64) for _ in range(4)]
    report = check(layers, x, *ws, atol=1e-4, rtol=1e-4)
    n_kernels = len(report.kernels)
    assert n_kernels >= 4
    assert len(backend._functions) < n_kernels and len(backend._functions) <= 3, backend._functions.keys()
    before = len(backend._functions)
    check(lambda x, w1, w2, w3: layers(x, w1, w2, w3), x, *ws[:3], atol=1e-4, rtol=1e-4)
    # a new graph of three such layers: its middle layers are built already (its last one,
    # which stores what the 4-layer graph's third recomputes, is new)
    assert len(backend._functions) <= before + 1


def test_canonical_kernel_source_ignores_names_only():
    from coil_cuda_triton import dedup
    from coil_cuda_triton.codegen import KernelSource
    import sympy
    a = KernelSource("k3_add", "@jit\ndef k3_add(p_buf4, p_arg0):\n    t = tl.load(p_buf4) + buf4_m\n",
                     ["p_buf4", "p_arg0"], ["*fp32", "*fp32"], "pointwise", sympy.Integer(4),
                     buffers=["buf4", "arg0"])
    b = dataclasses.replace(a, name="k9_add", source=a.source.replace("k3_add", "k9_add")
                            .replace("buf4", "buf17").replace("arg0", "arg2"),
                            params=["p_buf17", "p_arg2"], buffers=["buf17", "arg2"])
    c = dataclasses.replace(a, source=a.source.replace("tl.load(p_buf4)", "tl.load(p_arg0)"))
    ca, cb = dedup.canonical(a), dedup.canonical(b)
    assert ca.source == cb.source and ca.name == cb.name and ca.params == ["p_q0", "p_q1"]
    assert f"def {ca.name}(p_q0, p_q1)" in ca.source and ca.buffers == ["q0", "q1"]
    assert dedup.canonical(c).name != ca.name


def test_kernels_of_one_text_but_other_sizes_or_dtypes_stay_apart(backend):
    """An unmasked pointwise kernel's text leaves its length out (it sets the grid only), and
    a load's dtype comes from its pointer: such kernels must not share a launcher."""
    def f(a, b, c):
        return torch.sin(a) * 2, torch.sin(b) * 2, torch.sin(c) * 2

    a, b = torch.randn(4096), torch.randn(8192)
    c = torch.randn(4096, dtype=torch.float64)
    report = check(f, a, b, c)
    assert len(report.kernels) == 1 or len(backend._functions) == len(report.kernels)


def test_dynamic_launch_size_in_a_torch_function(backend):
    """The launcher computes a kernel's length in Python: ``Max``/``//`` in it must be spelled
    as Python, not as Triton (``tl.maximum``), found on the H200."""
    x = torch.randn(2, 4, 1, 6, requires_grad=True)
    fn = lambda a: a.chunk(2, 3)[0] * 2  # noqa: E731
    out = torch.compile(fn, backend="coil", dynamic=True)(x)
    torch.testing.assert_close(out, fn(x))
    out.sum().backward()
    check(lambda a: F.max_pool2d(a, 2, ceil_mode=True).sin(), torch.randn(2, 3, 9, 7), dynamic=True)


def test_misaligned_half_precision_matmuls_are_padded(backend, monkeypatch):
    """A bf16 linear 33 wide (inner width 20) runs padded to 40 (and 24): the GEMM library's
    fast kernels want 16-byte rows (``Capabilities.gemm_alignment_bytes``). Matmuls below
    ``MIN_FLOPS`` are left alone (lowered here so that a small one is padded)."""
    from coil import pad_gemm
    monkeypatch.setattr(pad_gemm, "MIN_FLOPS", 1)
    lin = torch.nn.Linear(20, 33).to(torch.bfloat16)
    x = torch.randn(8, 20, dtype=torch.bfloat16)

    def f(x):
        return (lin(x).float() * 2).softmax(-1), lin(x) @ torch.ones(33, 8, dtype=torch.bfloat16)

    with torch.no_grad():
        report = check(f, x, atol=2e-2, rtol=2e-2)
    source = report.graphs[0].wrapper_source
    assert "(40,)" in source and "(8, 24)" in source, source


def _vocabulary_projection(monkeypatch):
    """A 16x24 input, a 37x24 weight (37 columns: padded to 40 in bf16), labels; every matmul
    padded however small (``MIN_FLOPS`` 1)."""
    from coil import pad_gemm
    monkeypatch.setattr(pad_gemm, "MIN_FLOPS", 1)
    torch.manual_seed(0)
    w = torch.randn(37, 24, dtype=torch.bfloat16, requires_grad=True)
    h = torch.randn(16, 24, dtype=torch.bfloat16, requires_grad=True)
    return h, w, torch.arange(16) % 37


def _backward_source(f, h, w) -> str:
    """The wrapper of the backward of ``f(h, w)`` compiled, whose gradients match eager's."""
    from coil.report import recording
    torch._dynamo.reset()
    with recording() as report:
        torch.compile(f, backend="coil")(h, w).backward()
    got = (h.grad, w.grad)
    h.grad = w.grad = None
    f(h, w).backward()
    for g, e in zip(got, (h.grad, w.grad)):
        torch.testing.assert_close(g, e, atol=1e-2, rtol=1e-2)
    return report.graphs[-1].wrapper_source


def test_transposed_misaligned_matmul_is_padded_along_m(backend, monkeypatch):
    """The backward of a vocabulary projection: the weight's gradient multiplies the logits'
    gradient transposed (column-major, M = 37 rows), the input's gradient reads it as is
    (K = 37). Both read one padding of it, 40 wide, and the gradients match eager's."""
    h, w, labels = _vocabulary_projection(monkeypatch)

    def f(h, w):
        return F.cross_entropy((h @ w.t()).float(), labels)

    backward = _backward_source(f, h, w)
    assert backward.count("((16, 40), (40, 1)") == 1 and "((40, 24), (24, 1)" in backward, backward


def test_a_cast_weight_is_padded_once_for_forward_and_backward(backend, monkeypatch):
    """Autocast's vocabulary projection: a float32 weight cast to bf16, 37 rows (padded to 40).
    The joint graph is padded before partitioning: the forward saves the padded cast and the
    backward reads it as is (GPT-2 padded it again there, 74 MiB). Gradients as eager's."""
    h, w, labels = _vocabulary_projection(monkeypatch)
    w = w.detach().float().requires_grad_()

    def f(h, w):
        return F.cross_entropy((h @ w.to(torch.bfloat16).t()).float(), labels)

    backward = _backward_source(f, h, w)
    assert re.search(r"restride\(arg\d+, \(40, 24\), \(24, 1\)\)", backward), backward  # saved padded
    assert "new_0((40, 24)" not in backward, backward  # not padded again


def test_a_padded_product_saved_for_the_backward_keeps_its_strides(backend, monkeypatch):
    """A vocabulary projection (37 wide, padded to 40) whose logits the forward returns and
    saves for the backward: their padded strides are reported to AOTAutograd, so the backward
    reads the saved view in place instead of copying it into the metadata's strides (BERT's
    logits: 0.62 ms a step on an H100); gradients and outputs as eager's."""
    from coil.report import recording
    h, w, labels = _vocabulary_projection(monkeypatch)

    def f(h, w):
        logits = h @ w.t()
        return F.cross_entropy(logits.float(), labels), logits

    torch._dynamo.reset()
    with recording() as report:
        loss, logits = torch.compile(f, backend="coil")(h, w)
        loss.backward()
    got = (h.grad, w.grad)
    h.grad = w.grad = None
    expected_loss, expected_logits = f(h, w)
    expected_loss.backward()
    torch.testing.assert_close(loss, expected_loss, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(logits, expected_logits, atol=1e-2, rtol=1e-2)
    assert logits.stride() == expected_logits.stride()  # the user's copy in eager's strides
    for g, e in zip(got, (h.grad, w.grad)):
        torch.testing.assert_close(g, e, atol=1e-2, rtol=1e-2)
    forward, backward = report.graphs[0], report.graphs[-1]
    assert forward.output_strides is not None and (40, 1) in forward.output_strides, forward.output_strides
    assert "(37, 1)): arg" not in backward.wrapper_source and "(40, 1)" in backward.wrapper_source, \
        backward.wrapper_source


def test_a_padded_product_returned_to_the_user_has_eager_strides(backend, monkeypatch):
    """A padded product (37 wide, run 40 wide) that the graph returns is copied into eager's
    strides, so ``view(-1)`` works on it as on eager's; a view of it too."""
    h, w, _ = _vocabulary_projection(monkeypatch)

    def f(h, w):
        logits = h @ w.t()
        return logits, logits.view(4, 4, 37), logits.t()

    with torch.no_grad():
        report = check(f, h, w, atol=1e-2, rtol=1e-2)
        got = torch.compile(f, backend="coil")(h, w)
    assert "(16, 40)" in report.graphs[0].wrapper_source  # padded
    for g, e in zip(got, f(h, w)):
        assert g.stride() == e.stride(), (g.stride(), e.stride())
    assert got[0].view(-1).shape == (16 * 37,)


def test_aligned_or_small_matmuls_are_not_padded(backend):
    lin = torch.nn.Linear(64, 1001).to(torch.bfloat16)
    with torch.no_grad():
        report = check(lin, torch.randn(4, 64, dtype=torch.bfloat16), atol=2e-2, rtol=2e-2)
    assert "1008" not in report.graphs[0].wrapper_source


def test_launch_parameter_block_layout():
    """The raw launcher's parameter block: one slot per parameter in signature order (pointers
    and i64 sizes 8 bytes, i32 sizes 4), then Triton's two null scratch pointers."""
    import ctypes
    from coil_cuda_triton.raw_launch import Params
    block = Params(["*fp32", "*bf16", "i32", "i64", "i32"])
    block.fill([16, 32], [3, 1 << 40, 7])
    kinds = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int32,
             ctypes.c_uint64, ctypes.c_uint64]
    assert [k.from_address(a).value for k, a in zip(kinds, block.params)] == [16, 32, 3, 1 << 40, 7, 0, 0]
    block.fill([48, 64], [5, 2, 9])
    assert [k.from_address(a).value for k, a in zip(kinds, block.params)] == [48, 64, 5, 2, 9, 0, 0]
    with pytest.raises(TypeError):
        Params(["*fp32", "fp32"])


def test_inference_conv_nets_run_channels_last(backend):
    """A device declaring ``conv_channels_last`` gets channels-last operands for an inference
    graph's convolutions, the kernels between them keep that layout, and the outputs keep
    eager's strides."""
    import torch.nn as nn
    backend.capabilities = dataclasses.replace(backend.capabilities, conv_channels_last=True)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.SiLU()).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        report = check(m, x, atol=1e-4, rtol=1e-4)
        assert report.result.is_contiguous()
    source = report.graphs[0].wrapper_source
    assert "(2048, 1, 128, 8)" in source, source  # an 8-channel 16x16 activation, channels-last
    assert source.count("restride(") == source.count("if ")  # checks only, no copies planned


def test_training_graphs_lay_convolutions_out_channels_last(backend):
    """The forward graph saves the convolution's output channels-last (reported to
    AOTAutograd); the input's gradient keeps eager's layout and values."""
    import torch.nn as nn
    backend.capabilities = dataclasses.replace(backend.capabilities, conv_channels_last=True)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with coil.config.override(training_channels_last=True):
        report = coil.explain(lambda x: m(x).square().sum(), x)
    forward = next(g for g in report.graphs if g.kind == "forward")
    assert "(512, 1, 64, 8)" in forward.wrapper_source and forward.output_strides is not None
    report.result.backward()  # the backward graph compiles now, with the saved layouts
    x2 = x.detach().clone().requires_grad_()
    m(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
    assert x.grad.stride() == x2.grad.stride()
