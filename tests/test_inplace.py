"""In-place buffers (``coil.inplace``, ``coil.memory``): a kernel stores an output over an input
that dies in it only where it reads that input at the index it writes. Every case runs on
the C++ plugin and on the Triton plugin under Triton's interpreter, against eager and
bit for bit against Coil with ``inplace_buffers`` off, and checks in the report that buffers
went in place where they should (and not where they must not)."""
from __future__ import annotations

import math

import pytest
import sympy
import torch
import torch.nn.functional as F

import coil
from coil import config, plugins
from coil.inplace import dense
from helpers import clone_args, cpu_tensors, flat_tensors, wrapper_source

BACKENDS = ["cpu_cpp", "triton"]


@pytest.fixture(autouse=True)
def _cpu_tensors():
    """These tests route the ``cpu`` device to each plugin and count its in-place writes:
    CPU tensors, also under ``COIL_TEST_DEVICE=cuda``."""
    with cpu_tensors():
        yield


@pytest.fixture(params=BACKENDS)
def backend(request):
    """The ``cpu`` device served by the C++ plugin, or by the Triton plugin interpreted."""
    plugins.reset()
    if request.param == "cpu_cpp":
        yield request.param
    else:
        triton = pytest.importorskip("triton")
        if not triton.knobs.runtime.interpret:
            pytest.skip("Triton's interpreter is off (TRITON_INTERPRET must be set before triton "
                        "is imported; tests/conftest.py sets it where there is no GPU)")
        from coil_cuda_triton import mathlib
        from coil_cuda_triton.backend import TritonBackend
        backend = TritonBackend(interpret=True)
        backend.device_type = "cpu"
        coil.register_backend_for_device("cpu", backend, name="triton-interpreter-inplace")
        with mathlib.interpreting():
            yield request.param
    plugins.reset()


def check(fn, *args, inplace: int | None = None, atol: float = 1e-5, rtol: float = 1e-5):
    """Run ``fn`` eagerly, through Coil, and through Coil without in-place buffers; compare,
    and check the number of buffers that went in place (``inplace``: exactly, when given)."""
    expected = fn(*clone_args(args))
    report = coil.explain(fn, *clone_args(args))
    torch.testing.assert_close(report.result, expected, atol=atol, rtol=rtol, equal_nan=True)
    torch._dynamo.reset()
    with config.override(inplace_buffers=False):
        plain = coil.explain(fn, *clone_args(args))
    assert plain.inplace == 0
    # writing over a dying input changes where values live, never what they are: bit for bit
    # where kernels are not tuned at run time (on a GPU each source tunes on its own, and a
    # kernel that writes in place may pick another configuration, so another rounding)
    for got, want in zip(flat_tensors(report.result), flat_tensors(plain.result)):
        if got.device.type == "cpu":
            assert torch.equal(got, want), "in-place buffers changed a result"
        else:
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if inplace is not None:
        assert report.inplace == inplace, f"{report.inplace} buffer(s) in place, expected {inplace}\n{report}"
    return report


# ----------------------------------------------------------------------------- where it applies


def test_pointwise_chain_over_a_matmul_result(backend):
    a, b = torch.randn(32, 48), torch.randn(48, 64)
    report = check(lambda a, b: torch.sigmoid(a @ b) * 3 - 1, a, b, inplace=1)
    assert "# in place over" in wrapper_source(report)
    assert "in place" in str(report)


def test_planned_peak_counts_an_in_place_output_once(backend):
    a, b = torch.randn(32, 48), torch.randn(48, 64)
    fn = lambda a, b: torch.softmax(a @ b, -1) * 2  # noqa: E731
    one = 32 * 64 * 4  # the matmul's result, then the softmax over it: one buffer's bytes
    assert coil.explain(fn, a, b).peak_bytes == one
    torch._dynamo.reset()
    with config.override(inplace_buffers=False):
        assert coil.explain(fn, a, b).peak_bytes == 2 * one


def test_pointwise_chain_over_a_kernel_result(backend):
    # the cumsum (a scan kernel) writes a buffer that the pointwise kernel then overwrites
    x = torch.randn(16, 40)
    check(lambda x: torch.tanh(x.cumsum(-1)) * 0.5 + 1, x, inplace=1)


def test_softmax(backend):
    a, b = torch.randn(24, 16), torch.randn(16, 96)
    check(lambda a, b: torch.softmax(a @ b, -1), a, b, inplace=1)


def test_softmax_of_a_long_row(backend):
    # past the Triton plugin's persistent limit (8192): a looped reduction, two passes over the
    # row, with a barrier before the pass that stores over what the first one read
    a, b = torch.randn(2, 8), torch.randn(8, 9000)
    report = check(lambda a, b: torch.softmax(a @ b, -1), a, b, inplace=1, atol=1e-6)
    if backend == "triton":
        assert "tl.debug_barrier()" in "\n".join(k.source for k in report.kernels)


def test_softmax_times_its_input_reads_the_input_after_the_stash(backend):
    # the C++ plugin stashes exp(x - max) in the output during the sum pass; in place, that
    # overwrites x, which the last pass still reads outside the stashed value
    a, b = torch.randn(8, 16), torch.randn(16, 64)

    def fn(a, b):
        m = a @ b
        return torch.softmax(m, -1) * m

    check(fn, a, b, inplace=1)


def test_layer_norm(backend):
    a, b = torch.randn(16, 24), torch.randn(24, 128)
    w, bias = torch.randn(128), torch.randn(128)
    check(lambda a, b, w, bias: F.layer_norm(a @ b, (128,), w, bias), a, b, w, bias,
          inplace=1, atol=1e-4, rtol=1e-4)


def test_graph_output_may_take_a_dying_buffer(backend):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    check(lambda a, b: torch.relu(a @ b), a, b, inplace=1)


def test_gelu_mlp_training_step(backend):
    torch.manual_seed(0)
    n, d, h, k = 16, 24, 64, 10
    params = [torch.randn(d) * 0.1 + 1, torch.randn(d) * 0.1, torch.randn(h, d) / math.sqrt(d),
              torch.randn(h) * 0.02, torch.randn(k, h) / math.sqrt(h), torch.randn(k) * 0.02]
    x, target = torch.randn(n, d), torch.randint(0, k, (n,))

    def step(x, target, ln_w, ln_b, w1, b1, w2, b2):
        hidden = F.gelu(F.linear(F.layer_norm(x, (d,), ln_w, ln_b), w1, b1))
        loss = F.cross_entropy(F.linear(hidden, w2, b2), target)
        return loss, *torch.autograd.grad(loss, [ln_w, ln_b, w1, b1, w2, b2])

    args = [x, target, *(p.requires_grad_() for p in params)]
    report = check(step, *args, atol=1e-5, rtol=1e-4)
    backward = [g for g in report.graphs if g.kind == "backward"]
    assert backward and sum(g.inplace for g in backward) >= 1, str(report)


def test_symbolic_sizes(backend):
    a, b = torch.randn(8, 12), torch.randn(12, 20)
    fn = lambda a, b: torch.softmax(a @ b, -1) * 2  # noqa: E731
    report = coil.explain(fn, a, b, dynamic=True)
    torch.testing.assert_close(report.result, fn(a, b))
    assert report.inplace == 1 and any(g.symbolic for g in report.graphs)


# ----------------------------------------------------------------------------- where it must not


@pytest.mark.parametrize("other", ["transpose", "flip", "roll"], ids=str)
def test_dying_input_read_at_another_index(backend, other):
    a, b = torch.randn(16, 8), torch.randn(8, 16)
    moved = {"transpose": lambda m: m.t(), "flip": lambda m: m.flip(-1),
             "roll": lambda m: m.roll(1, -1)}[other]

    def fn(a, b):
        m = a @ b
        return m * 2 + moved(m)

    check(fn, a, b, inplace=0)


def test_dying_input_read_after_the_store(backend):
    # one kernel: the sum pass also stores m * 2, the next pass reads m again; only the
    # output of the last reader may take m's memory
    a, b = torch.randn(8, 16), torch.randn(16, 32)

    def fn(a, b):
        m = a @ b
        return m * 2, m - m.sum(-1, keepdim=True)

    report = check(fn, a, b, inplace=1)
    assert len(report.kernels) == 1


def test_dying_input_that_is_a_graph_output(backend):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    check(lambda a, b: (lambda m: (m, torch.relu(m) + 1))(a @ b), a, b, inplace=0)


def test_view_of_a_live_buffer(backend):
    # ``unfold`` runs in ATen and returns a view of the matmul's result: the kernel reads the
    # view where it writes (it would qualify), but the memory is the matmul's, which the same
    # kernel also reads transposed
    a, b = torch.randn(8, 8), torch.randn(8, 8)

    def fn(a, b):
        m = a @ b
        return m.unfold(0, 1, 1).squeeze(-1) * 2 + m.t()

    report = check(fn, a, b, inplace=0)
    assert "aten.unfold.default" in report.fallbacks


def test_dtype_change_is_not_in_place(backend):
    a, b = torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64)
    check(lambda a, b: (a @ b).float() * 2, a, b, inplace=0)


def test_knob_off_means_no_buffer_in_place(backend):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with config.override(inplace_buffers=False):
        report = coil.explain(lambda a, b: torch.relu(a @ b), a, b)
    assert report.inplace == 0 and "in place over" not in wrapper_source(report)


def test_a_value_a_library_call_and_the_graph_both_take_is_written_once(backend):
    """GELU's output feeds a matmul (a library call) and leaves the graph (saved for the
    backward, say): one buffer, one store, not one per taker."""
    x, w = torch.randn(16, 32), torch.randn(32, 8)
    def f(x, w):
        g = F.gelu(x)
        return g @ w, g

    report = check(f, x, w)
    (kernel,) = report.kernels
    stores = kernel.source.count("tl.store(") if backend == "triton" else kernel.source.count("] = coil::cast")
    assert stores == 1, kernel.source


def test_plugin_older_than_the_aliasing_sdk_gets_no_pair(backend):
    """A plugin that declares an SDK before 0.7.0 may assume its pointers never alias
    (``__restrict__``): it never gets an output stored over an input."""
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    reg = plugins.registry()
    info = next(p for p in reg.plugins if p.name == reg.providers[a.device.type])
    declared = info.api_version
    info.api_version = "0.6.0"
    try:
        report = coil.explain(lambda a, b: torch.relu(a @ b), a, b)
    finally:
        info.api_version = declared
    assert report.inplace == 0 and "in place over" not in wrapper_source(report)
    assert coil.explain(lambda a, b: torch.relu(a @ b), a, b).inplace == 1


# ----------------------------------------------------------------------------- the rules


def _vars(n):
    return [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(n)]


def test_dense_index_maps():
    x0, x1, x2 = _vars(3)
    s = sympy.Symbol("s0", integer=True, positive=True)
    assert dense(64 * x0 + x1, [x0, x1], [8, 64])
    assert dense(x0 + 8 * x1, [x0, x1], [8, 64])  # a permutation of contiguous strides
    assert dense(s * x0 + x1 + 5, [x0, x1], [3, s])  # symbolic, with an offset
    assert dense(7 * x0 + x1, [x0, x1], [1, 7])  # a dim of extent 1 contributes nothing
    assert not dense(2 * x0, [x0], [8])  # gaps
    assert not dense(x0 + x1, [x0, x1], [8, 8])  # overlaps
    assert not dense(x0 + x1 + 5 * x2, [x0, x1, x2], [2, 2, 2])  # span == numel, still overlaps
    assert not dense(x0 * x1, [x0, x1], [4, 4])


def test_triton_tuning_runs_on_clones_of_an_in_place_pair():
    """The Triton autotuner launches every candidate on the real arguments; an input and the
    output stored over it must both be cloned, or the second run reads the first one's result."""
    triton = pytest.importorskip("triton")
    if not triton.knobs.runtime.interpret:
        pytest.skip("Triton's interpreter is off")
    from coil_cuda_triton import mathlib
    from coil_cuda_triton.backend import TritonBackend
    plugins.reset()
    backend = TritonBackend(interpret=True, tune_in_interpreter=True)
    backend.device_type = "cpu"
    coil.register_backend_for_device("cpu", backend, name="triton-interpreter-tuning")
    try:
        with mathlib.interpreting():
            # rows of 2048: a persistent softmax with several candidate configurations
            a, b = torch.randn(4, 16), torch.randn(16, 2048)
            report = check(lambda a, b: torch.softmax(a @ b, -1), a, b, inplace=1, atol=1e-6)
        assert backend.tuning_count > 1, "nothing was tuned: the test proves nothing"
        assert report.inplace == 1
    finally:
        plugins.reset()


def test_a_fused_batch_norm_and_activation_writes_over_the_convolutions_output():
    """The convolution's output is read by the batch norm's node and the activation's node
    writes: in a pointwise kernel of one loop, the earlier node's reads come before the
    write at every point, so the output takes the dying input's memory (EfficientNet-B0's
    allocated a fresh 73 MiB buffer per call on the CPU before)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                            torch.nn.Hardswish()).eval()
    x = torch.randn(2, 8, 32, 32)
    with torch.no_grad():
        report = coil.explain(m, x)
        torch.testing.assert_close(report.result, m(x))
    assert report.inplace == 1, [k.name for k in report.kernels]


def test_tuning_arguments_copy_only_the_mutated_buffers():
    pytest.importorskip("triton")
    from coil_cuda_triton import autotune
    a, b = torch.randn(8), torch.randn(8)
    b_before = b.clone()
    with autotune.trial_args([a, b, 5], [1]) as trial:
        assert trial[0] is a and trial[1] is not b and trial[2] == 5
        torch.testing.assert_close(trial[1], b)
        trial[1].add_(1)
    torch.testing.assert_close(b, b_before)  # the tuning runs wrote over the copy only
    assert trial == []


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.uint32])
def test_a_write_into_an_input_the_library_makes_is_kept(dtype):
    """Coil generates no complex or uint32 code, so the write-back into such an input is
    ATen's copy_; it was dropped as dead and the input kept its value (a hunt, session 33)."""
    def fn(p, g):
        p.copy_(g) if dtype == torch.uint32 else p.add_(g)
        return g.clone()

    p, g = torch.arange(6).to(dtype), torch.ones(6, dtype=dtype)
    q = p.clone()
    expected = fn(p, g)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="coil")(q, g)
    assert torch.equal(q, p) and torch.equal(got, expected)


def test_a_compiled_optimizer_step_updates_complex_parameters():
    torch.manual_seed(0)
    params = [torch.randn(4, 3, dtype=torch.complex64, requires_grad=True) for _ in range(2)]
    copies = [p.detach().clone().requires_grad_() for p in params]
    opts = [torch.optim.SGD(ps, lr=0.1, momentum=0.9) for ps in (params, copies)]
    step = torch.compile(opts[1].step, backend="coil")
    for _ in range(3):
        for ps in (params, copies):
            for p in ps:
                p.grad = (p.detach() * 0.5 + 1).clone()
        opts[0].step()
        step()
    for p, c in zip(params, copies):
        torch.testing.assert_close(c, p)
        torch.testing.assert_close(opts[1].state[c]["momentum_buffer"], opts[0].state[p]["momentum_buffer"])
