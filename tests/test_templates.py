"""Templates through the core (coil.templates, the scheduler's epilogue fusion) and both
shipped backends' dialects, with small reference templates defined here: what the core
offers, what fuses, what runs instead, and that every result equals eager's, forward and
backward. The shipped templates (coil_template_gemm) have tests of their own
(tests/test_template_*_gemm.py) and run through this path in the whole suite."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import coil
import coil.report
from coil import plugins
from coil.sdk.templates import Template, TemplateConfig


def _idx(names: dict, p, op: str, batch: str, row: str, col: str) -> str:
    """``op``'s element (row, col) of batch ``batch`` as a C++/Triton offset expression."""
    dims = ([f"{batch} * {names[op + '_stride0']}"] if p.op == "bmm" else [])
    first = 1 if p.op == "bmm" else 0
    dims += [f"({row}) * {names[f'{op}_stride{first}']}", f"({col}) * {names[f'{op}_stride{first + 1}']}"]
    return " + ".join(dims)


class NaiveCpp(Template):
    """The simplest correct "cpp" template: 8x8 tiles, a dot product per element."""

    name, dialect = "naive_cpp", "cpp"

    def __init__(self, prefer: bool = True) -> None:
        self._prefer = prefer

    def supports(self, p):
        return None if p.a.dtype == torch.float32 else "float32 only"

    def prefer(self, p):
        return self._prefer

    def configs(self, p):
        return [TemplateConfig(8, 8, 8)]

    def render(self, p, n, config):
        a = _idx(n, p, "a", "bb", "m0 + i", "k")
        b = _idx(n, p, "b", "bb", "k", "n0 + j")
        return "\n".join([
            "#pragma omp parallel for collapse(2)",
            f"for (int64_t bb = 0; bb < {n['B']}; ++bb)",
            f"for (int64_t m0 = 0; m0 < {n['M']}; m0 += 8) {{",
            f"  for (int64_t n0 = 0; n0 < {n['N']}; n0 += 8) {{",
            "    float tile[64] = {0};",
            f"    int64_t mt = std::min<int64_t>(8, {n['M']} - m0), nt = std::min<int64_t>(8, {n['N']} - n0);",
            "    for (int64_t i = 0; i < mt; ++i) for (int64_t j = 0; j < nt; ++j) {",
            "      float s = 0;",
            f"      for (int64_t k = 0; k < {n['K']}; ++k) s += {n['a']}[{a}] * {n['b']}[{b}];",
            "      tile[i * 8 + j] = s;",
            "    }",
            f"    {n['epilogue']}(bb, m0, n0, mt, nt, tile, 8);",
            "  }",
            "}"])


class NaiveTriton(Template):
    """The simplest correct "triton" template: masked loads, one ``tl.dot`` per K block."""

    name, dialect = "naive_triton", "triton"

    def supports(self, p):
        return None if p.a.dtype == torch.float16 else "float16 only"

    def configs(self, p):
        return [TemplateConfig(16, 16, 16, 1, 1, 1), TemplateConfig(32, 16, 16, 1, 1, 1)]

    def render(self, p, n, config):
        a = _idx(n, p, "a", "pid_b", "offs_m[:, None]", "offs_k[None, :]")
        b = _idx(n, p, "b", "pid_b", "offs_k[:, None]", "offs_n[None, :]")
        return "\n".join([
            "pid = tl.program_id(0)",
            f"tiles_m = tl.cdiv({n['M']}, XBLOCK)",
            f"tiles_n = tl.cdiv({n['N']}, RBLOCK)",
            "pid_b = pid // (tiles_m * tiles_n)",
            "rest = pid % (tiles_m * tiles_n)",
            "offs_m = (rest // tiles_n) * XBLOCK + tl.arange(0, XBLOCK)",
            "offs_n = (rest % tiles_n) * RBLOCK + tl.arange(0, RBLOCK)",
            "acc = tl.zeros([XBLOCK, RBLOCK], dtype=tl.float32)",
            f"for k0 in range(0, {n['K']}, KBLOCK):",
            "    offs_k = k0 + tl.arange(0, KBLOCK)",
            f"    a = tl.load({n['a']} + {n['a_offset']} + {a}, mask=(offs_m[:, None] < {n['M']}) "
            f"& (offs_k[None, :] < {n['K']}), other=0.0)",
            f"    b = tl.load({n['b']} + {n['b_offset']} + {b}, mask=(offs_k[:, None] < {n['K']}) "
            f"& (offs_n[None, :] < {n['N']}), other=0.0)",
            "    acc += tl.dot(a, b)"])


@pytest.fixture
def templates(request):
    """Replace the registry's templates with ``request.param`` for one test."""
    reg = plugins.registry()
    saved = list(reg.templates)
    reg.templates[:] = request.param
    yield reg.templates
    reg.templates[:] = saved


@pytest.fixture
def cpp_backend():
    """The C++ plugin on the ``cpu`` device, whatever COIL_TEST_BACKEND routes there."""
    from coil_cpu_cpp.backend import CppBackend
    coil.register_backend_for_device("cpu", CppBackend(), name="cpu_cpp-templates")
    yield
    plugins.reset()


def _kernels(fn, *args, **options):
    with coil.config.override(**options):
        report = coil.explain(fn, *args)
    return [k for g in report.graphs for k in g.kernels], [f for g in report.graphs for f in g.fallbacks]


def _grads(fn, *args):
    inputs = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = fn(*inputs)
    (out if isinstance(out, torch.Tensor) else sum(o.float().sum() for o in out)).float().sum().backward()
    return out, [i.grad for i in inputs if i.requires_grad]


def _same(fn, *args, atol=1e-4, rtol=1e-4, **options):
    ref, ref_grads = _grads(fn, *args)
    compiled = torch.compile(fn, backend="coil", options=options)
    out, grads = _grads(compiled, *args)
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r, atol=atol, rtol=rtol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=atol, rtol=rtol)


CPP = pytest.mark.parametrize("templates", [[NaiveCpp()]], indirect=True)


@CPP
def test_linear_gelu_residual_fuses_through_the_view(templates, cpp_backend):
    w, bias = torch.randn(40, 48), torch.randn(40)

    def f(x):
        return F.gelu(F.linear(x, w, bias)) * 2 + x[..., :40]
    x = torch.randn(3, 20, 48)
    kernels, fallbacks = _kernels(f, x, templates="force")
    fused = [k for k in kernels if "coil_epilogue" in k.source]
    # the C++ plugin's linear is mm plus its bias (Capabilities.gemm_bias_epilogue False),
    # both in the template's kernel
    assert len(fused) == 1 and {"aten.addmm.default", "aten.mm.default"} & set(fused[0].ops), fused[0].ops
    assert not any(fb.op.startswith("aten.addmm") and fb.kind == "library" for fb in fallbacks) or fused
    _same(f, x, templates="force")


@CPP
def test_bmm_and_addmm_forms_forward_and_backward(templates, cpp_backend):
    c = torch.randn(24, 17)

    def f(a, b, y):
        scores = torch.relu(torch.bmm(y, y.transpose(1, 2)) + 1)
        mixed = torch.addmm(c, a, b.t(), beta=0.5, alpha=2.0)
        return scores, torch.tanh(mixed)
    a, b, y = torch.randn(24, 33), torch.randn(17, 33), torch.randn(4, 10, 12)
    _same(f, a, b, y, templates="force")


@CPP
def test_product_read_outside_the_kernel_is_stored(templates, cpp_backend):
    def f(a, b):
        p = a @ b
        return torch.sigmoid(p), p.sum(0)
    _same(f, torch.randn(19, 23), torch.randn(23, 29), templates="force")


@CPP
def test_nothing_to_fuse_runs_the_library(templates, cpp_backend):
    def f(a, b):
        return (a @ b).sum(1)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    kernels, _ = _kernels(f, a, b)  # templates="auto": the library's GEMM alone wins
    assert not any("coil_epilogue" in k.source for k in kernels)
    kernels, _ = _kernels(lambda a, b: torch.relu(a @ b), a, b, templates="off")
    assert not any("coil_epilogue" in k.source for k in kernels)


@pytest.mark.parametrize("templates", [[NaiveCpp(prefer=False)]], indirect=True)
def test_heuristic_decline_keeps_the_library(templates, cpp_backend):
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    kernels, _ = _kernels(lambda a, b: torch.relu(a @ b), a, b)
    assert not any("coil_epilogue" in k.source for k in kernels)
    kernels, _ = _kernels(lambda a, b: torch.relu(a @ b), a, b, templates="force")
    assert any("coil_epilogue" in k.source for k in kernels)


@CPP
def test_symbolic_sizes_keep_the_library(templates, cpp_backend):
    def f(a, b):
        return torch.relu(a @ b)
    compiled = torch.compile(f, backend="coil", dynamic=True, options={"templates": "force"})
    for n in (8, 13):
        a, b = torch.randn(n, 16), torch.randn(16, 8)
        torch.testing.assert_close(compiled(a, b), f(a, b))


@pytest.mark.parametrize("templates", [[NaiveTriton()]], indirect=True)
def test_triton_measures_template_against_library(templates, tmp_path, monkeypatch):
    """Under the interpreter with tuning on, the first launch times the template's configs
    and the library's GEMM + the epilogue kernel, keeps the faster, and caches the choice."""
    pytest.importorskip("triton")
    from coil_cuda_triton.testing import conformance_backend
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    w = torch.randn(40, 48, dtype=torch.float16)

    def f(x):
        return F.gelu(x @ w.t()) * 2 + x[..., :40]
    x = torch.randn(3, 20, 48, dtype=torch.float16)
    with torch.no_grad():
        for round_ in range(2):
            torch._dynamo.reset()
            backend = conformance_backend()
            coil.register_backend_for_device("cpu", backend, name="triton-measured")
            out = torch.compile(f, backend="coil")(x)
            torch.testing.assert_close(out, f(x), atol=2e-2, rtol=2e-2)
            assert [t.choice for t in backend._templates] in (["template"], ["library"])
            assert backend.tuning_count == (3 if round_ == 0 else 0)  # two configs and the library
    plugins.reset()


@pytest.mark.parametrize("templates", [[NaiveTriton()]], indirect=True)
@pytest.mark.parametrize("choice", ["template", "library"])
def test_triton_both_sides_compute_the_epilogue(templates, choice, tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from coil_cuda_triton import template as tmod
    from coil_cuda_triton.testing import interpreted_backend
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    backend = interpreted_backend()
    backend.tune_in_interpreter = choice == "library"
    if choice == "library":  # every candidate runs once, and the library wins

        def library_wins(candidates, run, bench):
            for cfg in candidates:
                run(cfg)()
            return tmod.LIBRARY, {str(c): 0.0 for c in candidates}
        monkeypatch.setattr(tmod.autotune, "select_interleaved",
                            lambda candidates, run, bench, warm_ms: library_wins(candidates, run, bench))
    coil.register_backend_for_device("cpu", backend, name="triton-sides")
    bias = torch.randn(24, dtype=torch.float16)

    def f(a, b):
        return torch.sigmoid(torch.addmm(bias, a, b)), torch.bmm(a.view(2, 8, 19), b.view(2, 19, 12)).relu()
    a, b = torch.randn(16, 19, dtype=torch.float16), torch.randn(19, 24, dtype=torch.float16)
    with torch.no_grad():
        out = torch.compile(f, backend="coil", options={"templates": "auto" if choice == "library" else "force"})(a, b)
    for o, r in zip(out, f(a, b)):
        torch.testing.assert_close(o, r, atol=2e-2, rtol=2e-2)
    assert {t.choice for t in backend._templates} == {choice}
    plugins.reset()


@pytest.mark.graph_cache
@pytest.mark.parametrize("templates", [[NaiveTriton()]], indirect=True)
def test_triton_library_side_computes_the_product_in_the_epilogues_output(templates, tmp_path, monkeypatch):
    """On the library side, ATen's GEMM writes into the epilogue's output where that buffer
    can hold the product (same sizes, strides, dtype; no memory shared with another argument),
    and the epilogue then runs in place: no scratch product beside it. An epilogue that widens
    to float32 cannot host a float16 product and gets a scratch buffer, as before."""
    pytest.importorskip("triton")
    from coil_cuda_triton import template as tmod
    from coil_cuda_triton.testing import interpreted_backend
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    backend = interpreted_backend()
    backend.tune_in_interpreter = True
    monkeypatch.setattr(tmod.autotune, "select_interleaved",
                        lambda candidates, run, bench, warm_ms: (tmod.LIBRARY, {}))
    hosted: list[bool] = []
    hosting = tmod.TemplateLauncher._hosting
    monkeypatch.setattr(tmod.TemplateLauncher, "_hosting",
                        lambda self, args: hosted.append(hosting(self, args) is not None) or hosting(self, args))
    coil.register_backend_for_device("cpu", backend, name="triton-library-host")
    bias = torch.randn(24, dtype=torch.float16)

    def f(a, b, c):
        return torch.sigmoid(torch.addmm(bias, a, b)) * c, torch.mm(a, b).float().exp()
    a, b = torch.randn(16, 19, dtype=torch.float16), torch.randn(19, 24, dtype=torch.float16)
    c = torch.randn(16, 24, dtype=torch.float16)
    with torch.no_grad():
        out = torch.compile(f, backend="coil", options={"templates": "auto"})(a, b, c)
    for o, r in zip(out, f(a, b, c)):
        torch.testing.assert_close(o, r, atol=2e-2, rtol=2e-2)
    assert sorted(hosted) == [False, True], hosted
    # the same graph again, from Coil's graph cache: its modules are imported, not compiled
    hosted.clear()
    torch._dynamo.reset()
    with torch.no_grad(), coil.report.recording() as report:
        out = torch.compile(f, backend="coil", options={"templates": "auto"})(a, b, c)
    assert [g.cached for g in report.graphs] == [True]
    for o, r in zip(out, f(a, b, c)):
        torch.testing.assert_close(o, r, atol=2e-2, rtol=2e-2)
    assert sorted(hosted) == [False, True], hosted
    plugins.reset()


def test_shipped_template_plugin_loads():
    reg = plugins.registry()
    assert not [e for e in reg.errors if "template" in e.plugin]
    assert {t.name for t in reg.templates} >= {"triton_gemm", "cpp_gemm"}
    assert {t.dialect for t in reg.templates} == {"triton", "cpp"}



def test_interleaved_selection_warms_up_takes_turns_and_medians(monkeypatch):
    """The template-or-library choice keeps the device busy first (for warm_ms of the host's
    clock; a bench call waits for the device), then times candidates turn by turn (A, B, A,
    B...) and keeps the lowest median, skipping a candidate that fails."""
    pytest.importorskip("triton")
    import types
    from coil_cuda_triton import autotune
    clock = [0.0]  # seconds: each bench call below takes the time it reports
    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    from coil_cuda_triton.configs import Config
    a, b, broken = Config(16), Config(32), Config(64)
    order, times = [], {a: iter([3.0, 3.0, 5.0, 1.0, 1.0, 9.0, 1.0]), b: iter([2.0] * 5)}

    def run(cfg):
        if cfg == broken:
            raise RuntimeError("out of shared memory")
        return lambda: order.append(cfg)

    def bench(call):
        call()
        ms = next(times[order[-1]])
        clock[0] += ms / 1000
        return ms
    best, timings = autotune.select_interleaved([a, b, broken], run, bench, rounds=5, warm_ms=5.0)
    assert best == a and timings == {str(a): 1.0, str(b): 2.0}
    assert order[:2] == [a, b]  # each candidate ran once before anything was timed
    assert order[2:4] == [a, a]  # warming up: 3 + 3 ms >= 5 ms on the first candidate
    assert order[4:] == [a, b] * 5


class NaiveTritonDeclines(NaiveTriton):
    """The same template, whose heuristic expects the library to win everywhere."""

    def prefer(self, p):
        return False


@pytest.mark.parametrize("templates", [[NaiveTritonDeclines()]], indirect=True)
def test_auto_builds_no_template_its_heuristic_declines_and_tune_measures_it(templates, tmp_path, monkeypatch):
    """``templates=auto`` asks ``prefer`` before building anything (each measured template is
    seconds of builds on a GPU's first call); ``tune`` measures every supported product."""
    pytest.importorskip("triton")
    from coil_cuda_triton.testing import conformance_backend
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    w = torch.randn(40, 48, dtype=torch.float16)

    def f(x):
        return F.gelu(x @ w.t()) * 2
    x = torch.randn(3, 20, 48, dtype=torch.float16)
    with torch.no_grad():
        for mode, measured in (("auto", False), ("tune", True)):
            torch._dynamo.reset()
            backend = conformance_backend()
            coil.register_backend_for_device("cpu", backend, name=f"triton-{mode}")
            out = torch.compile(f, backend="coil", options={"templates": mode})(x)
            torch.testing.assert_close(out, f(x), atol=2e-2, rtol=2e-2)
            assert bool(backend._templates) == measured, mode
            if measured:
                assert [t.choice for t in backend._templates] in (["template"], ["library"])
    plugins.reset()


@pytest.mark.parametrize("templates", [[NaiveTriton()]], indirect=True)
def test_triton_library_side_clones_its_own_in_place_arguments(templates, tmp_path, monkeypatch):
    """The library side of a measured template runs the epilogue as a kernel of its own,
    whose arguments are not the template's: its tuning clones the positions of its own
    buffers that it writes and reads. (It once took the template's positions: on the H200 an
    IndexError dropped the library from DistilBERT's measurements; a position in range would
    have cloned the wrong buffer.) Every kernel is made to report its last buffer as written
    and read, so the two kernels' positions differ."""
    pytest.importorskip("triton")
    from coil_cuda_triton import backend as triton_backend
    from coil_cuda_triton.testing import conformance_backend
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    real_mutated = triton_backend._mutated_args
    monkeypatch.setattr(triton_backend, "_mutated_args",
                        lambda k: sorted({*real_mutated(k), len(k.inputs) + len(k.outputs) - 1}))
    w = torch.randn(40, 48, dtype=torch.float16)

    def f(x, y):
        return F.gelu(x @ w.t()) + torch.cumsum(y, -1)  # the cumsum's buffer: one more argument
    x, y = torch.randn(60, 48, dtype=torch.float16), torch.randn(60, 40, dtype=torch.float16)
    backend = conformance_backend()
    coil.register_backend_for_device("cpu", backend, name="triton-tune-inplace")
    kernels = []
    real_compile = backend.compile
    monkeypatch.setattr(backend, "compile", lambda ks, name: (kernels.extend(ks), real_compile(ks, name))[1])
    failures = []
    real_select = triton_backend.autotune.select

    def select(configs, run, bench):
        best, timings = real_select(configs, run, bench)
        failures.extend(c for c in configs if str(c) not in timings)
        return best, timings
    monkeypatch.setattr(triton_backend.autotune, "select", select)
    with torch.no_grad():
        out = torch.compile(f, backend="coil", options={"templates": "tune"})(x, y)
    torch.testing.assert_close(out, f(x, y), atol=2e-2, rtol=2e-2)
    (k,) = [k for k in kernels if k.template is not None]
    unfused = k.template.unfused
    assert unfused is not None and len(unfused.args) != len(k.args)
    (launcher,) = backend._templates
    assert launcher.mutated == (len(k.inputs) + len(k.outputs) - 1,)
    assert launcher.unfused.mutated == (len(unfused.inputs) + len(unfused.outputs) - 1,)
    assert not failures  # every candidate that was measured ran
    plugins.reset()
