"""The C++ GEMM template (dialect ``"cpp"``): a cache-blocked, register-blocked float32
product whose output tiles go to the backend's fused epilogue.

The output is cut into tiles of MC x NC (``block_m`` x ``block_n``); OpenMP threads share
them out, each tile wholly one thread's. A thread packs a column block of B (all of K, NC
columns, in NR-column panels) once and reuses it for every tile of that column it owns; per
tile it walks K in KC (``block_k``) steps, packs that step's MC x KC block of A into rows,
and runs the micro-kernel on every MR x NR register tile of a float accumulator tile, which
it hands to ``epilogue`` after the last step. Packing converts to float (bf16 is widened
exactly), zero-pads to whole register tiles, aligns to 64 bytes, and transposes a
column-major operand VL x VL in registers.

The micro-kernel keeps MR x NR accumulators in vector registers (GCC vector extensions,
multiplied and added by FMA builtins where GCC targets FMA, so a build with
``-ffp-contract=off`` keeps them) and takes its shape from the ISA the
compiler targets, so one source serves every x86 level and other architectures: 12 x 32
with AVX-512 (24 of 32 zmm registers), 6 x 16 with AVX/AVX2 (12 of 16 ymm), 4 x 8 with
16-byte vectors elsewhere (which GCC lowers to scalars where a machine has none). Blocks
are rounded down to whole register tiles.

The figures behind the blocking and :meth:`CppGemm.prefer` come from ``bench/gemm_cpu.py``
on a 2-core Sapphire Rapids VM (``docs/templates.md``).
"""
from __future__ import annotations

from typing import Mapping

import sympy
import torch

from coil.sdk import CodeWriter, GemmProblem, Operand, Template, TemplateConfig

#: Input dtypes the template reads (converted to float while packing) and the C++ element
#: type it reads them as: bf16 as its raw bits, widened exactly to float.
_ELEMENT = {torch.float32: "float", torch.bfloat16: "uint16_t"}
#: Output dtypes: the product is float32; the backend's epilogue rounds it.
_OUT_DTYPES = (torch.float32, torch.bfloat16)

#: Register-tile rows each ISA's micro-kernel uses; cache blocks that are multiples of all of
#: them (and of the widest NR, 32) waste no padded rows whichever path the compiler takes.
_MR_LCM = 12
_NR_MAX = 32

#: Products smaller than this (flops) run on one thread: a parallel region costs a few
#: microseconds, which is the whole product below this size.
_PARALLEL_FLOPS = 1 << 20

#: Cache blockings (MC, NC, KC), best guess first. Measured on one core (2 MiB L2, 48 KiB
#: L1d) at 1024^3 and 2048^3, alternating runs: 192 x 512 x 256 a few percent ahead of
#: 96 x 256 x 256 at 2048 (A is read from memory N / NC times), the others within noise. Its
#: A block (192 KiB) stays in L2 and a 32 KiB B panel (KC x NR) in L1; KC 128 was slower.
_BLOCKINGS = [(192, 512, 256), (96, 256, 256), (96, 512, 384), (48, 128, 512)]
#: The most floats of packed B a thread keeps (16 MiB): NC shrinks for a very deep K.
_B_PANEL_FLOATS = 1 << 22
#: Where :meth:`CppGemm.prefer` picks the template untuned: products under this many flops
#: with at least this many rows (the measurements are in its comment).
_PREFER_MAX_FLOPS = 1 << 22
#: Whether ``prefer`` takes the small products where the template measured faster (off: the
#: compile time it adds outweighs microseconds per call; see ``prefer``).
PREFER_SMALL_PRODUCTS = False
_PREFER_MIN_ROWS = 16
#: Tiles per thread to aim for when shrinking blocks for parallelism, and the floor of each.
_TILES_PER_THREAD = 4
_MIN_BLOCK_M, _MIN_BLOCK_N = 24, 64

# The fixed part of the body, in a block of its own after the prologue. It reads no name
# of the backend's but those the prologue binds (``gm_*``), so its own short names cannot
# shadow one that an expression in ``names`` uses.
_ISA = """\
#if defined(__AVX512F__)
typedef float gm_vec __attribute__((vector_size(64)));
constexpr int64_t MR = 12, NV = 2;
#elif defined(__AVX__)
typedef float gm_vec __attribute__((vector_size(32)));
constexpr int64_t MR = 6, NV = 2;
#else
typedef float gm_vec __attribute__((vector_size(16)));
constexpr int64_t MR = 4, NV = 2;
#endif
typedef gm_vec gm_vecu __attribute__((aligned(4)));  // unaligned loads and stores
// c + a * b in one rounding, whatever -ffp-contract says (a product's own accumulation fuses, as
// a BLAS's does)
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#define GM_FMA(a, b, c) __builtin_ia32_vfmaddps512_mask((a), (b), (c), (unsigned short)-1, 4)
#elif defined(__GNUC__) && !defined(__clang__) && defined(__FMA__) && defined(__AVX__)
#define GM_FMA(a, b, c) __builtin_ia32_vfmaddps256((a), (b), (c))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__FMA__)
#define GM_FMA(a, b, c) __builtin_ia32_vfmaddps((a), (b), (c))
#else
#define GM_FMA(a, b, c) ((c) + (a) * (b))
#endif
constexpr int64_t VL = sizeof(gm_vec) / sizeof(float);
constexpr int64_t NR = NV * VL;
constexpr int64_t MC = gm_block_m < MR ? MR : gm_block_m / MR * MR;
constexpr int64_t NC = gm_block_n < NR ? NR : gm_block_n / NR * NR;
constexpr int64_t KC = gm_block_k;
"""

_HELPERS = """\
auto to_f32 = [](auto x) -> float {
  if constexpr (sizeof(x) == 2) return __builtin_bit_cast(float, uint32_t(x) << 16);
  else return x;
};
auto min64 = [](int64_t x, int64_t y) { return x < y ? x : y; };
// r[0..VL) := its transpose, in log2(VL) stages that each swap the off-diagonal h x h blocks.
// Packing a transposed operand with it costs a quarter of the scalar copy's time. It needs
// GCC's __builtin_shuffle (computed masks); other compilers pack with the scalar loops.
#if defined(__GNUC__) && !defined(__clang__)
constexpr bool FAST_TRANSPOSE = true;
#else
constexpr bool FAST_TRANSPOSE = false;
#endif
auto transpose = [](gm_vec* r) {
#if defined(__GNUC__) && !defined(__clang__)
  typedef int32_t ivec __attribute__((vector_size(sizeof(gm_vec))));
#pragma GCC unroll 4
  for (int s = 0; s < __builtin_ctz(VL); ++s) {
    const int h = VL >> (s + 1);
    ivec lo, hi;
#pragma GCC unroll 16
    for (int x = 0; x < VL; ++x) {
      lo[x] = x / h % 2 == 0 ? x : VL + x - h;
      hi[x] = x / h % 2 == 0 ? x + h : VL + x;
    }
#pragma GCC unroll 16
    for (int p = 0; p < VL; ++p)
      if (p / h % 2 == 0) {
        const gm_vec x = r[p], y = r[p + h];
        r[p] = __builtin_shuffle(x, y, lo);
        r[p + h] = __builtin_shuffle(x, y, hi);
      }
  }
#endif
};
"""

# A's MC x KC block -> rows of KC floats (row i of the block at [i * KC], its kc values
# first), rows past mt rounded up to MR zeroed. Rows, not the usual k-major panels: packing a
# row-major A is then a copy (the k-major transpose cost 17% at 1024^3), and the micro-kernel
# still reads each A value at a fixed offset from one pointer.
_PACK_A = """\
auto pack_a = [&](const gm_ta* src, int64_t mt, int64_t kc, float* __restrict dst) {
  const int64_t rows = (mt + MR - 1) / MR * MR;
  if (gm_sa2 == 1 || gm_sa1 != 1) {
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t k = 0; k < kc; ++k) dst[i * KC + k] = to_f32(src[i * gm_sa1 + k * gm_sa2]);
  } else {  // column-major A: VL x VL blocks transposed in registers, then the rest
    int64_t i_end = 0, k_end = 0;
    if constexpr (sizeof(gm_ta) == 4 && FAST_TRANSPOSE) {
      i_end = mt / VL * VL, k_end = kc / VL * VL;
      for (int64_t k0 = 0; k0 < k_end; k0 += VL)
        for (int64_t i0 = 0; i0 < i_end; i0 += VL) {
          gm_vec r[VL];
#pragma GCC unroll 16
          for (int64_t k = 0; k < VL; ++k) r[k] = *(const gm_vecu*)(src + i0 + (k0 + k) * gm_sa2);
          transpose(r);
#pragma GCC unroll 16
          for (int64_t i = 0; i < VL; ++i) *(gm_vecu*)(dst + (i0 + i) * KC + k0) = r[i];
        }
    }
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t k = i < i_end ? k_end : 0; k < kc; ++k)
        dst[i * KC + k] = to_f32(src[i + k * gm_sa2]);
  }
  for (int64_t i = mt; i < rows; ++i)
    for (int64_t k = 0; k < kc; ++k) dst[i * KC + k] = 0.0f;
};
"""

# B's KC x NC block -> panels of NR columns, panel p holding element (k, j) at [k * NR + j];
# columns past nt are zeros.
_PACK_B = """\
auto pack_b = [&](const gm_tb* src, int64_t kc, int64_t nt, float* __restrict dst) {
  for (int64_t j0 = 0; j0 < nt; j0 += NR, dst += NR * kc, src += NR * gm_sb2) {
    const int64_t w = min64(NR, nt - j0);
    if (gm_sb2 == 1 && w == NR) {
      for (int64_t k = 0; k < kc; ++k)
        for (int64_t j = 0; j < NR; ++j) dst[k * NR + j] = to_f32(src[k * gm_sb1 + j]);
    } else if (gm_sb1 == 1 && w == NR) {  // column-major B: as for A
      int64_t k_end = 0;
      if constexpr (sizeof(gm_tb) == 4 && FAST_TRANSPOSE) {
        k_end = kc / VL * VL;
        for (int64_t k0 = 0; k0 < k_end; k0 += VL)
#pragma GCC unroll 4
          for (int64_t v = 0; v < NV; ++v) {
            gm_vec r[VL];
#pragma GCC unroll 16
            for (int64_t j = 0; j < VL; ++j)
              r[j] = *(const gm_vecu*)(src + (v * VL + j) * gm_sb2 + k0);
            transpose(r);
#pragma GCC unroll 16
            for (int64_t k = 0; k < VL; ++k) *(gm_vec*)(dst + (k0 + k) * NR + v * VL) = r[k];
          }
      }
      for (int64_t j = 0; j < NR; ++j)
        for (int64_t k = k_end; k < kc; ++k) dst[k * NR + j] = to_f32(src[j * gm_sb2 + k]);
    } else {
      for (int64_t k = 0; k < kc; ++k)
        for (int64_t j = 0; j < NR; ++j)
          dst[k * NR + j] = j < w ? to_f32(src[k * gm_sb1 + j * gm_sb2]) : 0.0f;
    }
  }
};
"""

# c[MR x NR] (+)= A panel x B panel over kc. The accumulators stay in registers: every loop
# over MR and NV is unrolled, so the arrays are scalars to the register allocator.
_MICRO_KERNEL = """\
auto micro = [](int64_t kc, const float* __restrict ap, const float* __restrict bp,
                float* __restrict c, int64_t ldc, bool accumulate) {
  gm_vec acc[MR][NV];
#pragma GCC unroll 16
  for (int64_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int64_t v = 0; v < NV; ++v)
      acc[i][v] = accumulate ? *(const gm_vec*)(c + i * ldc + v * VL) : gm_vec{};
  for (int64_t k = 0; k < kc; ++k, ++ap, bp += NR) {
    gm_vec b[NV];
#pragma GCC unroll 4
    for (int64_t v = 0; v < NV; ++v) b[v] = *(const gm_vec*)(bp + v * VL);
#pragma GCC unroll 16
    for (int64_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int64_t v = 0; v < NV; ++v) acc[i][v] = GM_FMA(ap[i * KC] - gm_vec{}, b[v], acc[i][v]);
  }
#pragma GCC unroll 16
  for (int64_t i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int64_t v = 0; v < NV; ++v) *(gm_vec*)(c + i * ldc + v * VL) = acc[i][v];
};
"""

# One output tile per iteration; the tile's float sum is complete before the epilogue sees
# it. Consecutive tiles go down the same columns of B, so a thread packs a column block of B
# (all of K) once and reuses it for every tile of that column it owns: packing B per tile
# cost a quarter of the time at 1024^3. A's block is packed per tile and K step.
_DRIVER = """\
const int64_t tiles_m = (gm_M + MC - 1) / MC, tiles_n = (gm_N + NC - 1) / NC;
const int64_t tiles_mn = tiles_m * tiles_n, tiles = gm_B * tiles_mn;
const int64_t a_floats = MC * KC, b_floats = gm_K * NC, tile_floats = MC * NC;
const bool parallel = tiles > 1 && 2.0 * gm_M * gm_N * gm_K * gm_B >= gm_parallel_flops;
#pragma omp parallel if (parallel)
{
  void* raw = __builtin_malloc(sizeof(float) * (a_floats + b_floats + tile_floats) + 192);
  auto align64 = [](void* p) { return (float*)(((uintptr_t)p + 63) & ~(uintptr_t)63); };
  float* const ap = align64(raw);
  float* const bp = align64(ap + a_floats);
  float* const tile = align64(bp + b_floats);
  int64_t packed = -1;  // the column block of B in bp: batch * tiles_n + column
#pragma omp for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t bi = t / tiles_mn, mi = t % tiles_mn % tiles_m, ni = t % tiles_mn / tiles_m;
    const int64_t m0 = mi * MC, n0 = ni * NC;
    const int64_t mt = min64(MC, gm_M - m0), nt = min64(NC, gm_N - n0);
    if (packed != bi * tiles_n + ni) {
      for (int64_t k0 = 0; k0 < gm_K; k0 += KC)
        pack_b(gm_b + bi * gm_sb0 + k0 * gm_sb1 + n0 * gm_sb2, min64(KC, gm_K - k0), nt,
               bp + k0 * NC);
      packed = bi * tiles_n + ni;
    }
    if (gm_K == 0)
      for (int64_t i = 0; i < tile_floats; ++i) tile[i] = 0.0f;
    for (int64_t k0 = 0; k0 < gm_K; k0 += KC) {
      const int64_t kc = min64(KC, gm_K - k0);
      pack_a(gm_a + bi * gm_sa0 + m0 * gm_sa1 + k0 * gm_sa2, mt, kc, ap);
      for (int64_t j0 = 0; j0 < nt; j0 += NR)
        for (int64_t i0 = 0; i0 < mt; i0 += MR)
          micro(kc, ap + i0 * KC, bp + k0 * NC + j0 * kc, tile + i0 * NC + j0, NC, k0 > 0);
    }
    gm_epilogue(bi, m0, n0, mt, nt, tile, NC);
  }
  __builtin_free(raw);
}
"""

_BODY = _ISA + _HELPERS + _PACK_A + _PACK_B + _MICRO_KERNEL + _DRIVER


def _static(e: sympy.Expr | int) -> int | None:
    e = sympy.sympify(e)
    return int(e) if e.is_number else None


def _unit_stride_refusal(operand: Operand, role: str) -> str | None:
    """Why ``operand``'s matrix dims have no unit stride (a size-1 dim may have any)."""
    sizes = [_static(s) for s in operand.size[-2:]]
    strides = operand.static_strides()[-2:]
    if any(st == 1 or sz == 1 for st, sz in zip(strides, sizes)):
        return None
    return f"{role} has no unit stride in its matrix dims (strides {strides})"


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _cdiv(x: int, m: int) -> int:
    return (x + m - 1) // m


def _fit(blocking: tuple[int, int, int], batch: int, m: int, n: int, k: int,
         threads: int) -> tuple[int, int, int]:
    """``blocking`` (MC, NC, KC) shrunk to the problem: no block past its dim, a column block
    of packed B (K x NC floats per thread) within :data:`_B_PANEL_FLOATS`, and, where the
    product is worth threads, tiles enough to share out evenly (smaller tiles before idle
    threads: 3 tiles on 2 threads leave one a third idle)."""
    bm, bn, bk = blocking
    bm = min(bm, _round_up(max(m, 1), _MR_LCM))
    deep_k_bn = _B_PANEL_FLOATS // max(k, 1) // _NR_MAX * _NR_MAX
    bn = min(bn, _round_up(max(n, 1), _NR_MAX), max(_NR_MAX, deep_k_bn))
    bk = max(1, min(bk, k))
    if 2 * batch * m * n * k >= _PARALLEL_FLOPS and threads > 1:
        while batch * _cdiv(m, bm) * _cdiv(n, bn) < _TILES_PER_THREAD * threads:
            if bn > _MIN_BLOCK_N and (bn >= 4 * bm or bm <= _MIN_BLOCK_M):
                bn = _round_up(bn // 2, _NR_MAX)
            elif bm > _MIN_BLOCK_M:
                bm = _round_up(bm // 2, _MR_LCM)
            else:
                break
    return bm, bn, bk


class CppGemm(Template):
    """Cache-blocked float32 GEMM in C++ with vector-extension micro-kernels (module
    docstring); bf16 inputs are widened to float while packing, so bf16 products are float32
    sums as in eager's CPU GEMM."""

    name = "cpp_gemm"
    dialect = "cpp"
    ops = frozenset({"mm", "bmm"})

    def supports(self, problem: GemmProblem) -> str | None:
        if problem.static_sizes() is None:
            return "symbolic sizes"
        for role, operand in (("a", problem.a), ("b", problem.b)):
            if operand.dtype not in _ELEMENT:
                return f"{role} is {operand.dtype} (float32 or bfloat16 only)"
            if operand.static_strides() is None:
                return f"{role} has symbolic strides"
            refusal = _unit_stride_refusal(operand, role)
            if refusal:
                return refusal
        if problem.out_dtype not in _OUT_DTYPES:
            return f"output is {problem.out_dtype} (float32 or bfloat16 only)"
        return None

    def configs(self, problem: GemmProblem) -> list[TemplateConfig]:
        sizes = problem.static_sizes()
        batch, m, n, k = sizes if sizes is not None else (1, 4096, 4096, 4096)
        threads = torch.get_num_threads()
        out: list[TemplateConfig] = []
        for blocking in _BLOCKINGS:
            bm, bn, bk = _fit(blocking, batch, m, n, k, threads)
            cfg = TemplateConfig(block_m=bm, block_n=bn, block_k=bk, group_m=1, num_warps=1,
                                 num_stages=1)
            if cfg not in out:
                out.append(cfg)
        return out

    def prefer(self, problem: GemmProblem) -> bool:
        # Measured (bench/gemm_cpu.py, one thread, float32), fused template against eager
        # addmm + gelu: it wins only where a library call and a separate pass cost as much
        # as the product (64^3: 1.6x, 96^3: 1.2x); from 2^22 flops up (128^3: 0.95x,
        # 32x128x512: 0.88x, 1024^3: 0.9-1.06x) the library's faster product is at parity or
        # ahead, and tuning, not a guess, should pick the template. Rows under 16 waste most
        # of a 12-row register tile (1x1024x1024: 0.28x). bf16 is widened to float32 here,
        # where oneDNN has AMX and AVX512-BF16.
        # Where it wins, it saves microseconds per call, and its micro-kernel adds about 0.6 s
        # of C++ compile to every graph that uses it (a linear + GELU graph: 2.8 s -> 3.4 s on
        # the 2-core machine): a fast first call is the CPU plugin's strength, so without
        # tuning the library keeps every product (``templates="force"`` opts in).
        if not PREFER_SMALL_PRODUCTS:
            return False
        sizes = problem.static_sizes()
        if sizes is None or problem.a.dtype != torch.float32 or problem.b.dtype != torch.float32:
            return False
        batch, m, n, k = sizes
        return m >= _PREFER_MIN_ROWS and 2 * batch * m * n * k < _PREFER_MAX_FLOPS

    def render(self, problem: GemmProblem, names: Mapping[str, str],
               config: TemplateConfig | None) -> str:
        config = config or self.configs(problem)[0]
        w = CodeWriter(indent="  ")
        with w.block("{", "}"):
            w.lines(self._prologue(problem, names, config))
            w.lines(_BODY.splitlines())
        return w.text()

    @staticmethod
    def _prologue(problem: GemmProblem, names: Mapping[str, str],
                  config: TemplateConfig) -> list[str]:
        """Binds the backend's names and the blocking to the ``gm_*`` names the body reads."""
        batched = problem.op == "bmm"

        def stride(operand: str, dim: int) -> str:
            if not batched and dim == 0:
                return "0"
            return names[f"{operand}_stride{dim - (0 if batched else 1)}"]

        ta, tb = _ELEMENT[problem.a.dtype], _ELEMENT[problem.b.dtype]
        lines = [
            f"typedef {ta} gm_ta;",
            f"typedef {tb} gm_tb;",
            f"const gm_ta* const gm_a = (const gm_ta*)({names['a']});",
            f"const gm_tb* const gm_b = (const gm_tb*)({names['b']});",
            f"auto&& gm_epilogue = {names['epilogue']};",
            f"const int64_t gm_B = {names['B'] if batched else '1'};",
        ]
        lines += [f"const int64_t gm_{d} = {names[d]};" for d in ("M", "N", "K")]
        lines += [f"const int64_t gm_s{o}{d} = {stride(o, d)};" for o in "ab" for d in range(3)]
        lines += [
            f"constexpr int64_t gm_block_m = {config.block_m}, gm_block_n = {config.block_n}, "
            f"gm_block_k = {config.block_k};",
            f"constexpr double gm_parallel_flops = {float(_PARALLEL_FLOPS)!r};",
        ]
        return lines
