"""The Triton GEMM template (``coil_template_gemm.triton_gemm``) against ``torch.mm``/``bmm``.

A small harness stands in for the backend: it wraps the rendered statements in a
``@triton.jit`` function that stores ``acc`` (masked) into a contiguous output, and runs it
under Triton's interpreter on CPU tensors, one launch per candidate configuration. Every
configuration of a few problems is also compiled for Hopper (sm_90) without a GPU, in this
process, as ``tests/test_triton_mathlib.py`` does: interpreted launches go through
``mathlib.load_source(..., interpret=True)``, which undoes its patches of
``triton.language`` when each launch ends."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import sympy
import torch

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from coil.sdk.templates import GemmProblem, Operand, TemplateConfig  # noqa: E402
from coil_cuda_triton import mathlib  # noqa: E402
from coil_template_gemm import triton_gemm  # noqa: E402
from coil_template_gemm.triton_gemm import TritonGemm  # noqa: E402

TEMPLATE = TritonGemm()
#: Shared memory a Hopper block may opt into (227 KB).
HOPPER_SMEM = 232448
TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


# --- the harness ----------------------------------------------------------------------------


def _operand(name: str, t: torch.Tensor) -> Operand:
    return Operand(name, t.dtype, tuple(sympy.Integer(s) for s in t.shape),
                   tuple(sympy.Integer(s) for s in t.stride()), sympy.Integer(t.storage_offset()))


def problem_of(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> GemmProblem:
    return GemmProblem("bmm" if a.dim() == 3 else "mm", _operand("a", a), _operand("b", b),
                       out_dtype, "cuda")


def names_of(problem: GemmProblem) -> dict[str, str]:
    """The contract's names as a backend with static sizes would print them: literals."""
    names = {"a": "p_a", "b": "p_b"}
    sizes = problem.static_sizes()
    assert sizes is not None
    names.update(zip("BMNK", map(str, sizes)))
    for key, op in (("a", problem.a), ("b", problem.b)):
        names.update({f"{key}_stride{i}": str(s) for i, s in enumerate(op.stride)})
        names[f"{key}_offset"] = str(op.offset)
    return names


def kernel_source(problem: GemmProblem, names: dict[str, str] | None = None) -> str:
    """The rendered body in a full kernel, with the store the backend would write."""
    body = TEMPLATE.render(problem, names or names_of(problem), None)
    _, M, N, _ = problem.static_sizes()
    lines = ["@triton.jit",
             "def gemm(p_a, p_b, p_out, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, "
             "KBLOCK: tl.constexpr, GROUP_M: tl.constexpr):"]
    lines += ["    " + line for line in body.splitlines()]
    lines += [f"    mm_mask = (offs_m[:, None] < {M}) & (offs_n[None, :] < {N})",
              f"    mm_out = p_out + (pid_b * {M} + offs_m)[:, None] * {N} + offs_n[None, :]",
              "    tl.store(mm_out, acc.to(p_out.dtype.element_ty), mask=mm_mask)"]
    return "\n".join(lines) + "\n"


def _constexprs(config: TemplateConfig) -> dict[str, int]:
    return {"XBLOCK": config.block_m, "RBLOCK": config.block_n, "KBLOCK": config.block_k,
            "GROUP_M": config.group_m}


def run_template(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
                 config: TemplateConfig, source: str | None = None) -> torch.Tensor:
    problem = problem_of(a, b, out_dtype)
    batch, m, n, _ = problem.static_sizes()
    kernel = mathlib.load_source(source or kernel_source(problem), interpret=True)["gemm"]
    out = torch.full((batch, m, n) if a.dim() == 3 else (m, n), float("nan"), dtype=out_dtype)
    grid = batch * triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    # the operands' storage, the kernel adds their offsets itself
    base_a = a.as_strided((a.untyped_storage().nbytes() // a.element_size(),), (1,), 0)
    base_b = b.as_strided((b.untyped_storage().nbytes() // b.element_size(),), (1,), 0)
    kernel[(grid,)](base_a, base_b, out, **_constexprs(config))
    return out


def reference(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return torch.matmul(a.float(), b.float()).to(out_dtype)


def check_every_config(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
                       extra: tuple[TemplateConfig, ...] = ()) -> None:
    problem = problem_of(a, b, out_dtype)
    assert TEMPLATE.supports(problem) is None
    expected = reference(a, b, out_dtype)
    # fp32 accumulation either way; the order of the sum differs, and a narrow output rounds
    tol = {torch.float32: 1e-3, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[out_dtype]
    for config in [*TEMPLATE.configs(problem), *extra]:
        got = run_template(a, b, out_dtype, config)
        torch.testing.assert_close(got, expected, rtol=tol, atol=tol, msg=lambda m: f"{config}: {m}")


def _randn(*shape: int, dtype: torch.dtype = torch.float16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


#: A small blocking with several tile rows and columns, so the grouped tile order is walked.
SMALL = TemplateConfig(16, 16, 16, group_m=2, num_warps=4, num_stages=2)


@pytest.fixture
def bf16_dot(monkeypatch):
    """Triton's interpreter multiplies bfloat16 tiles as their uint16 bit patterns
    (triton-lang/triton#11584); widen them to float32 first, as the GPU's MMA does exactly."""
    from triton.runtime import interpreter
    original = interpreter.InterpreterBuilder.create_dot

    def widen(x):
        if x.dtype != tl.bfloat16:
            return x
        bits = x.data.astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, *args):
        return original(self, widen(a), widen(b), d, *args)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


# --- results against torch ------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mm_with_sizes_no_block_divides(out_dtype):
    a, b = _randn(100, 50), _randn(50, 37)
    check_every_config(a, b, out_dtype, extra=(SMALL,))


def test_mm_of_column_major_operands():
    a = _randn(72, 90).t()  # (90, 72), unit stride along M
    b = _randn(40, 72).t()  # (72, 40), unit stride along K
    assert a.stride() == (1, 90) and b.stride() == (1, 72)
    check_every_config(a, b, torch.float32, extra=(SMALL,))


def test_bmm_with_batch_strides_and_offsets():
    a = _randn(4, 33, 56)[1:, :, 3:51]  # offset, rows padded: strides (1848, 56, 1)
    b = _randn(48, 20).expand(3, 48, 20)  # one matrix for every batch: batch stride 0
    assert a.storage_offset() and b.stride(0) == 0
    check_every_config(a, b, torch.float32, extra=(SMALL,))


def test_bmm_column_major_out_bf16():
    a = _randn(3, 64, 40).transpose(1, 2)  # (3, 40, 64), unit stride along M
    b = _randn(3, 24, 64).transpose(1, 2)  # (3, 64, 24), unit stride along K
    check_every_config(a, b, torch.bfloat16)


@pytest.mark.parametrize("m", [1, 16])
def test_skinny_m(m):
    a, b = _randn(m, 96), _randn(96, 80)
    problem = problem_of(a, b, torch.float32)
    assert all(c.block_m == 16 for c in TEMPLATE.configs(problem))
    check_every_config(a, b, torch.float32)


def test_bfloat16_operands(bf16_dot):
    a, b = _randn(40, 48, dtype=torch.bfloat16), _randn(48, 24, dtype=torch.bfloat16)
    check_every_config(a, b, torch.float32, extra=(SMALL,))
    check_every_config(a, b, torch.bfloat16)


def test_no_masks_or_clamps_where_every_block_divides():
    a, b = _randn(128, 256), _randn(256, 64)
    problem = problem_of(a, b, torch.float32)
    body = TEMPLATE.render(problem, names_of(problem), None)
    assert "mask=" not in body and "offs_m %" not in body and "offs_n %" not in body
    assert body.count("tl.static_assert") == 3
    check_every_config(a, b, torch.float32)


def test_a_k_block_that_divides_k_is_chosen_over_a_masked_tail():
    """K = 96: every candidate steps through K in blocks of 32 (3 full steps), not 64 with a
    half-masked second step, which was the slower side of every pair measured on an H100 at
    Swin-tiny's first MLP (200704 x 96 x 384); with no candidate needing it, the mask is left
    out. A size that only some blocks divide (N = 96 against 64-wide tiles) gets a
    compile-time branch: each configuration builds the side it needs."""
    a, b = _randn(64, 96), _randn(96, 96)
    problem = problem_of(a, b, torch.float32)
    assert {c.block_k for c in TEMPLATE.configs(problem)} == {32}
    body = TEMPLATE.render(problem, names_of(problem), None)
    assert "mask=" not in body and "96 % KBLOCK == 0" in body
    assert "if 96 % RBLOCK == 0:" in body and "offs_n % 96" in body
    check_every_config(a, b, torch.float32, extra=(TemplateConfig(64, 64, 32), TemplateConfig(64, 128, 32)))


def test_a_block_that_needs_the_skipped_mask_fails_to_build():
    """Masks skipped for the listed configurations are guarded: another KBLOCK is refused
    instead of reading past K."""
    a, b = _randn(64, 64), _randn(64, 64)
    with pytest.raises(Exception, match="KBLOCK must divide K"):
        run_template(a, b, torch.float32, TemplateConfig(64, 64, 128))


def test_sizes_and_strides_given_as_expressions():
    """The backend may pass sums, not literals: each is parenthesised where it is used, and
    with no literal to show that a block divides, rows, columns and K are clamped and masked."""
    a, b = _randn(2, 64, 48).transpose(1, 2), _randn(2, 80, 32)[:, 16:]
    problem = problem_of(a, b, torch.float32)
    names = {k: v if k in "ab" else f"{int(v) + 3} - 3" for k, v in names_of(problem).items()}
    source = kernel_source(problem, names)
    assert "% (51 - 3)" in source and "mask=" in source
    for config in (TEMPLATE.configs(problem)[0], SMALL):
        got = run_template(a, b, torch.float32, config, source=source)
        torch.testing.assert_close(got, reference(a, b, torch.float32), rtol=1e-3, atol=1e-3)


def test_int64_indexing_renders_valid_code(monkeypatch):
    """Operands past 2**31 elements index in int64; the same code runs on small ones."""
    big = Operand("a", torch.float16, (sympy.Integer(70000), sympy.Integer(40000)),
                  (sympy.Integer(40000), sympy.Integer(1)))
    b = Operand("b", torch.float16, (sympy.Integer(40000), sympy.Integer(64)),
                (sympy.Integer(64), sympy.Integer(1)))
    problem = GemmProblem("mm", big, b, torch.float32, "cuda")
    assert ".to(tl.int64)" in TEMPLATE.render(problem, names_of(problem), None)

    monkeypatch.setattr(TritonGemm, "_needs_int64", staticmethod(lambda problem: True))
    a, b = _randn(2, 40, 50), _randn(2, 50, 24)
    source = kernel_source(problem_of(a, b, torch.float32))
    assert "pid_b.to(tl.int64)" in source
    got = run_template(a, b, torch.float32, SMALL, source=source)
    torch.testing.assert_close(got, reference(a, b, torch.float32), rtol=1e-3, atol=1e-3)


# --- what the template takes ----------------------------------------------------------------


def test_supports_refusals():
    a, b = _randn(64, 64), _randn(64, 64)
    assert TEMPLATE.supports(problem_of(a, b, torch.float32)) is None
    assert "float16" in TEMPLATE.supports(problem_of(a.float(), b.float(), torch.float32))
    assert "float16" in TEMPLATE.supports(problem_of(a, b.bfloat16(), torch.float32))
    assert "output" in TEMPLATE.supports(problem_of(a, b, torch.float64))
    assert "16" in TEMPLATE.supports(problem_of(a[:, :8], b[:8], torch.float32))
    assert "unit stride" in TEMPLATE.supports(problem_of(a[:, ::2], b[::2], torch.float32))
    # a single row read with a stride: a gather, not a matrix
    assert "unit stride" in TEMPLATE.supports(problem_of(a[:, :1].t(), b, torch.float32))

    s = sympy.Symbol("s0", positive=True, integer=True)
    symbolic = Operand("a", torch.float16, (s, sympy.Integer(64)), (sympy.Integer(64), sympy.Integer(1)))
    problem = GemmProblem("mm", symbolic, _operand("b", b), torch.float32, "cuda")
    assert "symbolic sizes" == TEMPLATE.supports(problem)
    strided = Operand("a", torch.float16, (sympy.Integer(64),) * 2, (s, sympy.Integer(1)))
    problem = GemmProblem("mm", strided, _operand("b", b), torch.float32, "cuda")
    assert "symbolic strides" in TEMPLATE.supports(problem)


def _problem(b: int, m: int, n: int, k: int, dtype: torch.dtype = torch.float16) -> GemmProblem:
    def op(name, rows, cols):
        size = (b, rows, cols) if b > 1 else (rows, cols)
        stride = (rows * cols, cols, 1) if b > 1 else (cols, 1)
        return Operand(name, dtype, tuple(map(sympy.Integer, size)), tuple(map(sympy.Integer, stride)))
    return GemmProblem("bmm" if b > 1 else "mm", op("a", m, k), op("b", k, n), torch.float16, "cuda")


SHAPES = [(1, 4096, 4096, 4096), (1, 8192, 8192, 8192), (1, 1024, 1024, 1024), (1, 1, 4096, 4096),
          (1, 32, 11008, 4096), (64, 512, 512, 64), (512, 64, 64, 64), (1, 100, 37, 50),
          (1, 3, 16, 16), (32, 2048, 2048, 128)]


@pytest.mark.parametrize("shape", SHAPES)
def test_configs_fit_hopper(shape):
    problem = _problem(*shape)
    configs = TEMPLATE.configs(problem)
    assert 1 <= len(configs) <= triton_gemm.MAX_CONFIGS
    assert len({(c.block_m, c.block_n, c.block_k) for c in configs}) == len(configs)
    for c in configs:
        for block in (c.block_m, c.block_n, c.block_k):
            assert block >= 16 and block & (block - 1) == 0, c
        assert triton_gemm.smem_bytes(c) <= triton_gemm.SMEM_BUDGET, c
    clocks = [triton_gemm.estimate_clocks(c, *shape) for c in configs]
    assert clocks == sorted(clocks), "best guess first"


def test_configs_follow_the_shape():
    square = TEMPLATE.configs(_problem(1, 4096, 4096, 4096))[0]
    assert (square.block_m * square.block_n, square.num_warps) == (128 * 256, 8)
    # 1024^2 has 32 tiles of 128x256: smaller tiles fill the 132 SMs
    medium = TEMPLATE.configs(_problem(1, 1024, 1024, 1024))[0]
    assert medium.block_m * medium.block_n <= 128 * 128
    decode = TEMPLATE.configs(_problem(1, 1, 4096, 4096))
    assert all(c.block_m == 16 and c.block_k >= 64 for c in decode)
    assert decode[0].block_n <= 32  # 4096 / 32 = 128 programs, about one per SM
    small = TEMPLATE.configs(_problem(1, 100, 37, 50))
    assert all(c.block_k == 64 and c.block_n == 64 and c.block_m <= 128 for c in small)


def test_prefer():
    assert TEMPLATE.prefer(_problem(1, 4096, 4096, 256))  # short K: the saved epilogue pass matters
    assert TEMPLATE.prefer(_problem(64, 512, 512, 64))
    assert not TEMPLATE.prefer(_problem(1, 4096, 4096, 4096))  # compute-bound: cuBLAS
    assert not TEMPLATE.prefer(_problem(1, 8192, 3072, 768))  # GPT-2's MLP: cuBLAS measured faster
    assert not TEMPLATE.prefer(_problem(1, 1, 4096, 4096))  # decode: cuBLAS' GEMV
    assert not TEMPLATE.prefer(_problem(1, 32, 11008, 4096))
    assert not TEMPLATE.prefer(_problem(1, 48, 48, 256))  # too small
    assert not TEMPLATE.prefer(_problem(1, 256, 256, 16384))  # 16 tiles: split-K territory
    assert not TEMPLATE.prefer(_problem(1, 4096, 4096, 4096, torch.float32))  # unsupported


# --- every configuration builds for Hopper --------------------------------------------------


def _compile_all(problem: GemmProblem) -> list:
    fn = mathlib.load_source(kernel_source(problem), interpret=False)["gemm"]
    out = TRITON_TYPES[problem.out_dtype]
    signature = {"p_a": f"*{TRITON_TYPES[problem.a.dtype]}", "p_b": f"*{TRITON_TYPES[problem.b.dtype]}",
                 "p_out": f"*{out}", "XBLOCK": "constexpr", "RBLOCK": "constexpr",
                 "KBLOCK": "constexpr", "GROUP_M": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(3)}
    built = []
    for c in TEMPLATE.configs(problem):
        source = ASTSource(fn=fn, signature=signature, constexprs=_constexprs(c), attrs=aligned)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": c.num_warps, "num_stages": c.num_stages})
        built.append((c, compiled))
    return built


def _with_dtypes(problem: GemmProblem, dtype: torch.dtype, out_dtype: torch.dtype) -> GemmProblem:
    return dataclasses.replace(problem, a=dataclasses.replace(problem.a, dtype=dtype),
                               b=dataclasses.replace(problem.b, dtype=dtype), out_dtype=out_dtype)


BUILDS = {
    "square-fp16": _with_dtypes(_problem(1, 4096, 4096, 4096), torch.float16, torch.float16),
    "ragged-bf16": _with_dtypes(_problem(1, 1000, 1000, 1000), torch.bfloat16, torch.float32),
    "decode-bf16": _with_dtypes(_problem(1, 1, 4096, 4096), torch.bfloat16, torch.bfloat16),
    "batched-fp16": _with_dtypes(_problem(64, 512, 512, 64), torch.float16, torch.float32),
    # Swin-tiny's first MLP: K blocks of 32, and N = 384 clamped only where 256 does not divide
    "swin-fc1-bf16": _with_dtypes(_problem(1, 200704, 384, 96), torch.bfloat16, torch.bfloat16),
}


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_config_builds_for_hopper(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # build, not a cache hit
    for config, compiled in _compile_all(BUILDS[name]):
        ptx = compiled.asm["ptx"]
        assert compiled.asm["cubin"] and ".target sm_90" in ptx, config
        assert compiled.metadata.shared <= HOPPER_SMEM, (config, compiled.metadata.shared)
        if config.block_m >= 64:
            assert "wgmma" in ptx, f"{config}: no warpgroup MMA"
