"""CPU GEMM benchmark: Coil's C++ GEMM template (``coil_template_gemm.cpp_gemm``) against the
BLAS torch uses, as GFLOP/s and as a fraction of the machine's measured FMA peak.

Usage::

    python bench/gemm_cpu.py [--shapes 1024,2048] [--threads 1,2] [--repeat 7] [--min-sample-s 0.3]
                             [--markdown-out FILE]

Rows are float32 products ``out = gelu(a @ b + bias)`` (and the bare product), one per shape
and thread count. A shape is ``S`` (a square) or ``MxNxK``, with a ``t`` suffix for a
transposed ``b`` (``b = w.t()``, as in ``nn.Linear``). Columns (GFLOP/s count only the
product's ``2 * M * N * K``):

* ``template+gelu``: the template forced, with a fused bias + exact-GELU epilogue written as
  Coil's C++ backend writes epilogues (an ``omp simd`` loop over a tile row, erf from glibc's
  vector math library);
* ``template``: the template with an epilogue that only stores the tile;
* ``mm``: ``torch.mm(a, b, out=...)`` (oneDNN / MKL);
* ``addmm+gelu``: eager ``F.gelu(torch.addmm(bias, a, b))``, what the template replaces;
* ``peak``: an FMA loop compiled like the template (its flags, but ``-ffp-contract=fast``; the
  vector width of its micro-kernel), on the same number of threads: the ceiling.

Each figure is the best of ``--repeat`` samples (each the mean over calls lasting at least
``--min-sample-s``), taken round-robin across the columns so that other work on the machine
hits all of them alike; the best, not the median, because on a shared machine the noise only
ever slows a sample down. On one thread the samples are CPU time of the calling thread (all
the work runs there), which time-sharing with other processes does not inflate; on more,
wall time. The template is built with Coil's toolchain (its compiler flags and
disk cache) through the same ``render`` the backend calls.
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time
from typing import Callable

import cffi
import sympy
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from coil.sdk import GemmProblem, Operand, TemplateConfig  # noqa: E402
from coil_cpu_cpp import toolchain  # noqa: E402
from coil_template_gemm.cpp_gemm import CppGemm  # noqa: E402

log = logging.getLogger("bench.gemm_cpu")

#: The tile epilogues: statements for one tile row (``src``: the float sums, ``dst``: the
#: output row, ``n0``: the tile's first column).
EPILOGUES = {
    "store": "dst[j] = src[j];",
    "bias_gelu": ("const float v = src[j] + bias[n0 + j]; "
                  "dst[j] = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));"),
}

_SOURCE = """{prelude}
#include "coil_cpu.h"
extern "C" void gemm(const float* a, const float* b, const float* bias, float* out) {{
  auto epilogue = [&](int64_t bi, int64_t m0, int64_t n0, int64_t mt, int64_t nt,
                      const float* acc, int64_t ldacc) {{
    for (int64_t i = 0; i < mt; ++i) {{
      const float* src = acc + i * ldacc;
      float* dst = out + (m0 + i) * {n} + n0;
#pragma omp simd
      for (int64_t j = 0; j < nt; ++j) {{ {epilogue} }}
    }}
  }};
{body}
}}
"""

#: The FMA ceiling: 24 independent accumulators of the micro-kernel's vector width per
#: thread (enough to cover FMA latency times two ports), nothing loaded.
_PEAK_SOURCE = """#include "coil_cpu.h"
#if defined(__AVX512F__)
typedef float vec __attribute__((vector_size(64)));
#elif defined(__AVX__)
typedef float vec __attribute__((vector_size(32)));
#else
typedef float vec __attribute__((vector_size(16)));
#endif
extern "C" double fma_loop(int64_t iters) {
  double flops = 0;
#pragma omp parallel reduction(+ : flops)
  {
    vec acc[24], x = vec{} + 1.0f, y = vec{} + 0.5f;
    for (int i = 0; i < 24; ++i) acc[i] = x + (float)i;
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
      for (int i = 0; i < 24; ++i) acc[i] = acc[i] * y + x;
    }
    float keep = 0;
    for (int i = 0; i < 24; ++i)
      for (size_t l = 0; l < sizeof(vec) / sizeof(float); ++l) keep += acc[i][l];
    flops += 2.0 * 24 * (sizeof(vec) / sizeof(float)) * iters + (keep == -1.0f);
  }
  return flops;
}
"""


def _operand(name: str, t: torch.Tensor) -> Operand:
    return Operand(name, t.dtype, tuple(sympy.Integer(s) for s in t.shape),
                   tuple(sympy.Integer(s) for s in t.stride()))


def build_template(a: torch.Tensor, b: torch.Tensor, epilogue: str,
                   config: TemplateConfig | None = None) -> Callable[..., None]:
    """``run(bias, out)``: the template for ``a @ b`` (2-D, float32) with an epilogue of
    :data:`EPILOGUES`, compiled with Coil's toolchain."""
    template = CppGemm()
    problem = GemmProblem("mm", _operand("a", a), _operand("b", b), torch.float32, "cpu")
    assert template.supports(problem) is None, template.supports(problem)
    names = {"a": "a", "b": "b", "epilogue": "epilogue", "B": "1", "M": str(a.shape[0]),
             "K": str(a.shape[1]), "N": str(b.shape[1])}
    names.update({f"{o}_stride{d}": str(s) for o, t in (("a", a), ("b", b))
                  for d, s in enumerate(t.stride())})
    body = template.render(problem, names, config or template.configs(problem)[0])
    source = _SOURCE.format(prelude=toolchain.vector_math_prelude(), n=b.shape[1],
                            epilogue=EPILOGUES[epilogue], body=body)
    ffi = cffi.FFI()
    ffi.cdef("void gemm(const float*, const float*, const float*, float*);")
    lib = ffi.dlopen(str(toolchain.library_for(source)))

    def ptr(t: torch.Tensor):
        return ffi.cast("float*", t.data_ptr())

    return lambda bias, out: lib.gemm(ptr(a), ptr(b), ptr(bias), ptr(out))


@functools.lru_cache(maxsize=None)
def _peak_library():
    ffi = cffi.FFI()
    ffi.cdef("double fma_loop(int64_t iters);")
    # the loop's multiply-adds contracted into FMAs (the kernels' own flags keep them apart)
    return ffi.dlopen(str(toolchain.library_for(_PEAK_SOURCE, ["-ffp-contract=fast"])))


def fma_peak(seconds: float = 0.2) -> float:
    """FMA GFLOP/s of an FMA-only loop on ``torch.get_num_threads()`` threads."""
    lib = _peak_library()
    clock, iters = _clock(), 1 << 16
    while True:
        start = clock()
        flops = lib.fma_loop(iters)
        elapsed = clock() - start
        if elapsed >= seconds:
            return flops / elapsed / 1e9
        iters *= 2


def _clock() -> Callable[[], float]:
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def _sample(fn: Callable[[], object], min_s: float) -> float:
    """Seconds per call: the mean over calls lasting at least ``min_s``."""
    clock = _clock()
    calls, start = 0, clock()
    while True:
        fn()
        calls += 1
        elapsed = clock() - start
        if elapsed >= min_s:
            return elapsed / calls


def parse_shape(text: str) -> tuple[int, int, int, bool]:
    """``"1024"`` or ``"512x768x3072t"`` -> (M, N, K, b transposed)."""
    transposed = text.endswith("t")
    dims = [int(d) for d in text.rstrip("t").split("x")]
    m, n, k = dims * 3 if len(dims) == 1 else dims
    return m, n, k, transposed


def measure(shape: str, repeat: int, min_s: float) -> dict[str, float]:
    """Best GFLOP/s per column for one shape on the current thread count."""
    m, n, k, transposed = parse_shape(shape)
    gen = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(m, k, generator=gen)
    b = torch.randn(n, k, generator=gen).t() if transposed else torch.randn(k, n, generator=gen)
    bias = torch.randn(n, generator=gen)
    out = torch.empty(m, n)
    fused = build_template(a, b, "bias_gelu")
    bare = build_template(a, b, "store")
    fused(bias, out)
    torch.testing.assert_close(out, F.gelu(torch.addmm(bias, a, b)), atol=1e-3, rtol=1e-3)
    flops = 2.0 * m * n * k
    candidates: dict[str, Callable[[], object]] = {
        "template+gelu": lambda: fused(bias, out),
        "template": lambda: bare(bias, out),
        "mm": lambda: torch.mm(a, b, out=out),
        "addmm+gelu": lambda: F.gelu(torch.addmm(bias, a, b)),
    }
    best = dict.fromkeys(candidates, 0.0)
    best["peak"] = 0.0
    for fn in candidates.values():
        fn()
    for _ in range(repeat):
        for name, fn in candidates.items():
            best[name] = max(best[name], flops / _sample(fn, min_s) / 1e9)
        best["peak"] = max(best["peak"], fma_peak(min_s))
    return best


COLUMNS = ["template+gelu", "template", "mm", "addmm+gelu", "peak"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="1024,2048")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--min-sample-s", type=float, default=0.3)
    parser.add_argument("--markdown-out", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    header = ["shape", "threads", *COLUMNS, "template / mm", "template+gelu / addmm+gelu",
              "template / peak", "mm / peak"]
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for shape in args.shapes.split(","):
            best = measure(shape, args.repeat, args.min_sample_s)
            rows.append([shape, str(threads), *(f"{best[c]:.0f}" for c in COLUMNS),
                         f"{best['template'] / best['mm']:.2f}",
                         f"{best['template+gelu'] / best['addmm+gelu']:.2f}",
                         f"{best['template'] / best['peak']:.2f}",
                         f"{best['mm'] / best['peak']:.2f}"])
            log.info("measured %s", "  ".join(rows[-1]))
    right = [True] * len(header)
    print(f"GFLOP/s (best of {args.repeat}; 1 thread: thread CPU time, more: wall time), "
          f"float32, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print("\n".join(common.text_table(header, rows, right)))
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write("\n".join(common.markdown_table(header, rows, right)) + "\n")


if __name__ == "__main__":
    main()
