"""The C++ GEMM template (``coil_template_gemm.cpp_gemm``) against ``torch.mm``/``bmm``.

A small harness stands in for the backend: it wraps the rendered statements in an
``extern "C"`` function whose epilogue *adds* each tile (optionally ``relu(acc + bias)``) into
a zeroed output, builds it with Coil's toolchain (its flags, ``-march=native``) and calls it
through cffi. Adding rather than storing makes a tile delivered twice, or a tile of partial K
sums delivered early, show up as a wrong value; relu makes a partial sum wrong even once.
Sizes and strides reach the function as runtime values (``d[i]``, the way a backend with
symbolic shapes passes them), so one library per dtype pair, blocking and ISA serves every
shape here."""
from __future__ import annotations

import dataclasses
import functools
import re
import sys

import cffi
import pytest
import sympy
import torch

from coil.sdk.templates import GemmProblem, Operand, TemplateConfig
from coil_cpu_cpp import toolchain
from coil_template_gemm.cpp_gemm import CppGemm

TEMPLATE = CppGemm()
C_TYPES = {torch.float32: "float", torch.bfloat16: "uint16_t"}

_SOURCE = """#include "coil_cpu.h"
extern "C" void gemm(const void* a, const void* b, float* out, const float* bias, int relu,
                     const int64_t* d) {{
  auto epilogue = [&](int64_t bi, int64_t m0, int64_t n0, int64_t mt, int64_t nt,
                      const float* acc, int64_t ldacc) {{
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) {{
        float v = acc[i * ldacc + j];
        if (relu) v = std::max(v + bias[n0 + j], 0.0f);
        out[(bi * d[1] + m0 + i) * d[2] + n0 + j] += v;
      }}
  }};
{body}
}}
"""


# --- the harness ----------------------------------------------------------------------------


def _operand(name: str, t: torch.Tensor) -> Operand:
    return Operand(name, t.dtype, tuple(sympy.Integer(s) for s in t.shape),
                   tuple(sympy.Integer(s) for s in t.stride()), sympy.Integer(t.storage_offset()))


def problem_of(a: torch.Tensor, b: torch.Tensor,
               out_dtype: torch.dtype = torch.float32) -> GemmProblem:
    return GemmProblem("bmm" if a.dim() == 3 else "mm", _operand("a", a), _operand("b", b),
                       out_dtype, "cpu")


def _names(op: str) -> dict[str, str]:
    """Sizes and strides as reads of the runtime array ``d``: B, M, N, K, then a's and b's
    (batch, row, column) strides."""
    names = {"a": "a", "b": "b", "epilogue": "epilogue", "B": "d[0]", "M": "d[1]", "N": "d[2]",
             "K": "d[3]"}
    first = 0 if op == "bmm" else 1
    for o, base in (("a", 4), ("b", 7)):
        for dim in range(first, 3):
            names[f"{o}_stride{dim - first}"] = f"d[{base + dim}]"
    return names


@functools.lru_cache(maxsize=None)
def _library(op: str, a_dtype: torch.dtype, b_dtype: torch.dtype, config: TemplateConfig,
             flags: tuple[str, ...] = ()):
    # render reads only the op, the dtypes and the blocking: any operands of them stand in
    shape = (2, 2, 2) if op == "bmm" else (2, 2)
    problem = problem_of(torch.empty(shape, dtype=a_dtype), torch.empty(shape, dtype=b_dtype))
    body = TEMPLATE.render(problem, _names(op), config)
    ffi = cffi.FFI()
    ffi.cdef("void gemm(const void*, const void*, float*, const float*, int, const int64_t*);")
    lib = ffi.dlopen(str(toolchain.library_for(_SOURCE.format(body=body), extra_flags=list(flags))))
    return ffi, lib


def run_template(a: torch.Tensor, b: torch.Tensor, config: TemplateConfig | None = None,
                 bias: torch.Tensor | None = None, flags: tuple[str, ...] = ()) -> torch.Tensor:
    """``a @ b`` (``relu(a @ b + bias)`` with ``bias``) through the template, as float32."""
    problem = problem_of(a, b)
    assert TEMPLATE.supports(problem) is None, TEMPLATE.supports(problem)
    config = config or TEMPLATE.configs(problem)[0]
    ffi, lib = _library(problem.op, a.dtype, b.dtype, config, flags)
    batched = a.dim() == 3
    a3, b3 = (a, b) if batched else (a.unsqueeze(0), b.unsqueeze(0))
    batch, m, k = a3.shape
    n = b3.shape[2]
    out = torch.zeros(batch, m, n)
    bias_t = torch.zeros(n) if bias is None else bias.contiguous()
    d = torch.tensor([batch, m, n, k, *a3.stride(), *b3.stride()], dtype=torch.int64)
    lib.gemm(ffi.cast("void*", a.data_ptr()), ffi.cast("void*", b.data_ptr()),
             ffi.cast("float*", out.data_ptr()), ffi.cast("float*", bias_t.data_ptr()),
             int(bias is not None), ffi.cast("int64_t*", d.data_ptr()))
    return out if batched else out[0]


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def expect(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    ref = torch.bmm(a.float(), b.float()) if a.dim() == 3 else torch.mm(a.float(), b.float())
    torch.testing.assert_close(out, ref, atol=1e-4 * max(1, a.shape[-1]) ** 0.5, rtol=1e-4)


# --- products -------------------------------------------------------------------------------

SHAPES = [(37, 53, 29), (1, 64, 64), (130, 70, 257), (64, 1, 33), (5, 7, 1), (300, 200, 600),
          (3, 4, 0), (0, 5, 6)]


@pytest.mark.parametrize("m,n,k", SHAPES, ids=lambda v: str(v))
def test_mm_matches_eager(m, n, k):
    a, b = randn(m, k), randn(k, n)
    expect(run_template(a, b), a, b)


@pytest.mark.parametrize("layout", ["aT", "bT", "aT_bT", "sliced"])
def test_mm_layouts(layout):
    m, n, k = 130, 70, 257
    a = randn(k, m).t() if "aT" in layout else randn(m, k)
    b = randn(n, k).t() if "bT" in layout else randn(k, n)
    if layout == "sliced":  # row strides wider than the rows, and nonzero offsets
        a, b = randn(m + 3, k + 9)[2:-1, 5:-4], randn(k + 1, n + 40)[1:, 17:-23]
    expect(run_template(a, b), a, b)


def test_bmm_with_batch_strides():
    a = randn(37, 4, 53).permute(1, 0, 2)  # batch stride 53, row stride 212
    b = randn(53, 29).expand(4, 53, 29)  # batch stride 0
    expect(run_template(a, b), a, b)
    a2, b2 = randn(3, 70, 130).transpose(1, 2), randn(3, 70, 257)
    expect(run_template(a2, b2), a2, b2)


def test_every_config_and_final_sums_in_epilogue():
    a, b, bias = randn(300, 600), randn(600, 200), randn(200)
    problem = problem_of(a, b)
    configs = TEMPLATE.configs(problem)
    assert len(configs) >= 2 and all(c.block_k < 600 for c in configs[:1])
    for config in configs:
        expect(run_template(a, b, config), a, b)
        torch.testing.assert_close(run_template(a, b, config, bias=bias),
                                   torch.relu(torch.addmm(bias, a, b)), atol=1e-3, rtol=1e-4)


def test_blocks_smaller_than_the_register_tile_are_rounded_up():
    a, b = randn(45, 70), randn(70, 39)
    config = TemplateConfig(block_m=1, block_n=1, block_k=1, group_m=1, num_warps=1, num_stages=1)
    expect(run_template(a, b, config), a, b)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_counts(threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = randn(3, 190, 150), randn(3, 150, 300)
        expect(run_template(a, b, TemplateConfig(48, 64, 64)), a, b)
    finally:
        torch.set_num_threads(old)


def test_bf16_products_are_float32_sums():
    a, b = randn(70, 300, dtype=torch.bfloat16), randn(45, 300, dtype=torch.bfloat16).t()
    out = run_template(a, b)
    expect(out, a, b)  # bf16 -> float is exact, so this is the float32 product
    torch.testing.assert_close(out.bfloat16(), torch.mm(a, b), atol=0, rtol=1.6e-2)


# --- the other ISA paths, built for this machine with its widest vectors turned off ---------

def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    found = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(found.group(1).split()) if found else set()


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx",)], ids=["avx2", "portable"])
def test_narrower_isa_paths(flags):
    if flags == ("-mno-avx512f",) and "avx512f" not in _cpu_flags():
        pytest.skip("no AVX-512 here: the default build already takes the AVX2 path")
    for a, b in [(randn(130, 257), randn(70, 257).t()), (randn(3, 37, 29), randn(3, 29, 53))]:
        expect(run_template(a, b, TemplateConfig(48, 64, 96), flags=flags), a, b)
    a, b, bias = randn(37, 300), randn(300, 53), randn(53)
    out = run_template(a, b, TemplateConfig(48, 64, 96), bias=bias, flags=flags)
    torch.testing.assert_close(out, torch.relu(torch.addmm(bias, a, b)), atol=1e-3, rtol=1e-4)


def test_narrower_isa_paths_take_their_register_tile():
    problem = problem_of(randn(4, 4), randn(4, 4))
    body = TEMPLATE.render(problem, _names("mm"), TemplateConfig(48, 64, 96))
    assert "#if defined(__AVX512F__)" in body and "#elif defined(__AVX__)" in body


# --- what it refuses ------------------------------------------------------------------------

def _with(operand: Operand, **changes) -> Operand:
    return dataclasses.replace(operand, **changes)


def test_supports_refusals():
    base = problem_of(randn(8, 6), randn(6, 4))
    assert TEMPLATE.supports(base) is None
    s = sympy.Symbol("s0", positive=True, integer=True)
    cases = {
        "symbolic sizes": GemmProblem("mm", _with(base.a, size=(s, sympy.Integer(6))), base.b,
                                      torch.float32, "cpu"),
        "symbolic strides": GemmProblem("mm", _with(base.a, stride=(s, sympy.Integer(1))), base.b,
                                        torch.float32, "cpu"),
        "float64": problem_of(randn(8, 6).double(), randn(6, 4).double()),
        "float16": problem_of(randn(8, 6).half(), randn(6, 4).half()),
        "unit stride": problem_of(randn(8, 12)[:, ::2], randn(6, 4)),
        "output": problem_of(randn(8, 6), randn(6, 4), torch.float16),
    }
    for expected, problem in cases.items():
        reason = TEMPLATE.supports(problem)
        assert reason and expected.split()[-1] in reason, (expected, reason)
    # a size-1 dim may have any stride
    assert TEMPLATE.supports(problem_of(randn(1, 12)[:, ::2], randn(6, 4))) is None
    assert TEMPLATE.supports(problem_of(randn(8, 6), randn(6, 4), torch.bfloat16)) is None


def test_configs_fit_the_problem():
    small = TEMPLATE.configs(problem_of(randn(5, 7), randn(7, 3)))
    assert all(c.block_m <= 12 and c.block_n <= 32 and c.block_k <= 7 for c in small)
    big = TEMPLATE.configs(problem_of(randn(2048, 2048), randn(2048, 2048)))
    assert len(big) >= 2 and len(set(big)) == len(big)


def test_prefer_declines_by_default_and_only_small_float32_products_when_on(monkeypatch):
    assert not TEMPLATE.prefer(problem_of(randn(64, 64), randn(64, 64)))  # compile time first
    monkeypatch.setattr(sys.modules[type(TEMPLATE).__module__], "PREFER_SMALL_PRODUCTS", True)
    assert TEMPLATE.prefer(problem_of(randn(64, 64), randn(64, 64)))
    assert not TEMPLATE.prefer(problem_of(randn(1024, 1024), randn(1024, 1024)))
    assert not TEMPLATE.prefer(problem_of(randn(1, 64), randn(64, 64)))  # GEMV-like
    assert not TEMPLATE.prefer(problem_of(randn(64, 64, dtype=torch.bfloat16),
                                          randn(64, 64, dtype=torch.bfloat16)))
