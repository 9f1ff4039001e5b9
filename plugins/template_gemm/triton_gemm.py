"""The Triton GEMM template: ``mm`` and ``bmm`` in float16/bfloat16 as a pipelined ``tl.dot``
loop, in the ``"triton"`` dialect of :mod:`coil.sdk.templates`, tuned for Hopper (H200).

Each program computes one ``XBLOCK x RBLOCK`` tile of ``out``, walking ``K`` in ``KBLOCK``
steps; programs visit tiles in groups of ``GROUP_M`` tile rows so that neighbouring programs
share operand tiles in L2. Loads are unmasked where the sizes allow it: rows past ``M`` and
columns past ``N`` are clamped (``% M``) rather than masked (the backend masks the stores),
and the K tail is masked only when some candidate ``KBLOCK`` does not divide ``K``. A
skipped mask is guarded by a ``tl.static_assert``, so a configuration outside
:meth:`TritonGemm.configs` fails to compile instead of reading out of bounds. Indices are
int64 only where an operand's element index can pass 2**31. There is no TMA descriptor and
no persistent loop: on sm_90 Triton 3.6 pipelines this loop's loads (``num_stages``) and
issues warpgroup MMA for tiles of 64 rows or more, ``mma.sync`` below.

Candidate blockings come from a small cost model of one H200 SM (below): each candidate's
time is its number of waves of programs over the 132 SMs times a program's time, the
slower of its tensor-core work and its operand traffic per K step. It ranks the candidates
(best guess first); the backend measures them where it tunes."""
from __future__ import annotations

import re
from typing import Callable, Mapping

import sympy
import torch

from coil.sdk import CodeWriter
from coil.sdk.templates import GemmProblem, Operand, Template, TemplateConfig

# --- the H200 as the cost model sees it -----------------------------------------------------

SMS = 132
#: Longest K for which the template is worth building and measuring: above it the product
#: is compute-bound and cuBLAS's GEMM (with its own bias epilogue) won every measurement on
#: the H200 (GPT-2's MLP at K=768: library 0.291 ms, template 0.347), while each measured
#: template costs seconds of first-call builds.
PREFER_MAX_K = 256
#: Bytes of operand tiles one program may keep in flight (all stages); an SM has 228 KB, and
#: the rest is left to the epilogue's layout conversions.
SMEM_BUDGET = 200 * 1024
#: float16 multiply-adds per clock per SM: 989 TFLOP/s dense / 132 SMs / 1.83 GHz / 2 with
#: warpgroup MMA (block_m a multiple of 64, warps a multiple of 4); ``mma.sync``, which
#: smaller tiles get, issues about half as fast.
MMA_PER_CLOCK = 1024
#: Bytes per clock per SM from L2 into shared memory, all SMs loading at once (~7.5 TB/s of
#: L2 bandwidth): a 128x128 tile is about balanced, larger tiles are compute-bound.
LOAD_PER_CLOCK = 32
#: Clocks a program spends outside its K loop: the first loads' latency and the epilogue.
PROGRAM_OVERHEAD = 1000
#: Candidates returned per problem (each is one compilation on a cold cache).
MAX_CONFIGS = 6

_C = TemplateConfig
#: Blockings for M > 64, most arithmetic per loaded byte first (ties in the cost model keep
#: this order): the 128x256 and 256x128 tiles are the ones that reach ~80% of peak on
#: Hopper; the smaller ones fill the SMs when there are too few big tiles.
GENERAL = (
    _C(128, 256, 64, num_warps=8, num_stages=3),
    _C(256, 128, 64, num_warps=8, num_stages=3),
    _C(128, 128, 64, num_warps=4, num_stages=4),
    _C(128, 128, 128, num_warps=8, num_stages=3),
    _C(64, 128, 64, num_warps=4, num_stages=4),
    _C(128, 64, 64, num_warps=4, num_stages=4),
    _C(64, 64, 64, num_warps=4, num_stages=4),
    _C(64, 64, 128, num_warps=4, num_stages=3),
)
#: Blockings for M <= 64 (decode-like): one tile row, so the parallelism is over N alone;
#: narrow tiles give more programs, deep K steps and more stages keep the weight stream in
#: flight. ``block_m`` is set from M (16, 32 or 64).
SKINNY = (
    _C(64, 32, 128, num_warps=4, num_stages=5),
    _C(64, 32, 256, num_warps=4, num_stages=4),
    _C(64, 64, 128, num_warps=4, num_stages=4),
    _C(64, 64, 256, num_warps=4, num_stages=3),
    _C(64, 16, 256, num_warps=4, num_stages=4),
    _C(64, 128, 128, num_warps=4, num_stages=4),
    _C(64, 128, 64, num_warps=4, num_stages=4),
)

_INPUT_DTYPES = (torch.float16, torch.bfloat16)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT32_LIMIT = 2**31


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def smem_bytes(config: TemplateConfig, itemsize: int = 2) -> int:
    """Shared memory the pipelined operand tiles take: one A and one B tile per stage."""
    tile = config.block_m * config.block_k + config.block_k * config.block_n
    return tile * itemsize * config.num_stages


def _fit(config: TemplateConfig, m: int, n: int, k: int) -> TemplateConfig:
    """``config`` shrunk to the problem: no block past the next power of two of its size (and
    none under 16, ``tl.dot``'s least), a K block that divides K where one of 32 or more does
    (no masked tail step: at 200704 x 96 x 384 with a GELU epilogue on an H100, blocks of 32
    beat blocks of 64 at every tile size, by up to 40%), warps for the tile's area, no more
    stages than steps."""
    bm = min(config.block_m, max(16, _pow2_at_least(m)))
    bn = min(config.block_n, max(16, _pow2_at_least(n)))
    bk = min(config.block_k, max(16, _pow2_at_least(k)))
    dividing = bk
    while dividing > 32 and k % dividing:
        dividing //= 2
    if k % dividing == 0:
        bk = dividing
    warps = config.num_warps if bm * bn >= 128 * 128 else min(config.num_warps, 4)
    stages = max(2, min(config.num_stages, _cdiv(k, bk)))
    return config.replace(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)


def estimate_clocks(config: TemplateConfig, b: int, m: int, n: int, k: int) -> float:
    """The cost model: waves of programs over the SMs times one program's clocks."""
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    programs = b * _cdiv(m, bm) * _cdiv(n, bn)
    waves = _cdiv(programs, SMS)
    warpgroup_mma = bm % 64 == 0 and config.num_warps % 4 == 0
    mma = bm * bn * bk / (MMA_PER_CLOCK if warpgroup_mma else MMA_PER_CLOCK / 2)
    load = (bm + bn) * bk * 2 / LOAD_PER_CLOCK
    return waves * (_cdiv(k, bk) * max(mma, load) + PROGRAM_OVERHEAD)


# --- rendering helpers ----------------------------------------------------------------------


def _literal(expr: str) -> int | None:
    """The value of a Triton expression that is an integer literal, else None."""
    try:
        return int(expr)
    except ValueError:
        return None


def _atom(expr: str) -> str:
    """``expr`` parenthesised unless it is a name, a literal or a subscript: the names the
    backend passes may be sums and products."""
    return expr if re.fullmatch(r"[\w.]+(\[[^\]]*\])?", expr) else f"({expr})"


def _product(*factors: str) -> str:
    """``a * b`` with factors of 1 left out; "0" when a factor is 0."""
    if any(_literal(f) == 0 for f in factors):
        return "0"
    kept = [_atom(f) for f in factors if _literal(f) != 1]
    return " * ".join(kept) if kept else "1"


def _sum(*terms: str) -> str:
    kept = [t for t in terms if _literal(t) != 0]
    return " + ".join(kept) if kept else "0"


def _max_index(op: Operand, k_overrun: int) -> int | None:
    """The largest element index an operand's first pointer tile can form, or None when it
    is symbolic. Rows and columns are clamped into range; the K index over-runs by up to
    ``k_overrun`` in a masked tail (masked lanes still form addresses)."""
    strides = op.static_strides()
    sizes = [sympy.sympify(s) for s in op.size]
    offset = sympy.sympify(op.offset)
    if strides is None or not offset.is_number or not all(s.is_number for s in sizes):
        return None
    reach = sum((int(s) - 1) * abs(st) for s, st in zip(sizes, strides))
    return int(offset) + reach + k_overrun * max(abs(st) for st in strides[-2:])


def _per_config(w: CodeWriter, exact: list[bool], condition: str, write_exact: Callable[[], None],
                write_general: Callable[[], None]) -> None:
    """The code for the candidates where ``exact`` holds (a block divides its size: no clamp or
    mask) and for the others; where they differ, a branch on ``condition``, a constexpr test,
    so each configuration builds only its side."""
    if all(exact):
        write_exact()
    elif any(exact):
        with w.block(f"if {condition}:"):
            write_exact()
        with w.block("else:"):
            write_general()
    else:
        write_general()


class TritonGemm(Template):
    """``mm``/``bmm`` as a grouped, pipelined ``tl.dot`` loop (module docstring)."""

    name = "triton_gemm"
    dialect = "triton"
    ops = frozenset({"mm", "bmm"})

    def supports(self, problem: GemmProblem) -> str | None:
        """Static sizes and strides, float16 or bfloat16 operands (float32 ones would run
        ``tl.dot`` in TF32), and row- or column-major matrices (any batch stride). M may be
        below 16: its rows are clamped into a 16-row tile."""
        sizes = problem.static_sizes()
        if sizes is None:
            return "symbolic sizes"
        a, b = problem.a, problem.b
        if a.dtype != b.dtype or a.dtype not in _INPUT_DTYPES:
            return f"operands {a.dtype}, {b.dtype}: needs both float16 or both bfloat16"
        if problem.out_dtype not in _OUT_DTYPES:
            return f"output dtype {problem.out_dtype}"
        _, m, n, k = sizes
        if m < 1 or n < 16 or k < 16:
            return f"M={m} N={n} K={k}: needs M >= 1, and N, K >= 16 (tl.dot's least block)"
        for op in (a, b):
            strides = op.static_strides()
            if strides is None:
                return f"symbolic strides of {op.name}"
            matrix = zip([int(s) for s in op.size[-2:]], strides[-2:])
            if not any(st == 1 and size > 1 for size, st in matrix):
                return f"{op.name} has no unit stride in its matrix dims (strides {strides})"
        return None

    def configs(self, problem: GemmProblem) -> list[TemplateConfig]:
        """The pool for the shape (:data:`GENERAL` or :data:`SKINNY`) fitted to the problem,
        within :data:`SMEM_BUDGET`, ranked by :func:`estimate_clocks`."""
        sizes = problem.static_sizes()
        if sizes is None:
            return [GENERAL[2]]
        b, m, n, k = sizes
        if m <= 64:
            block_m = max(16, _pow2_at_least(m))
            pool = [c.replace(block_m=block_m) for c in SKINNY]
        else:
            pool = list(GENERAL)
        fitted: dict[tuple[int, int, int], TemplateConfig] = {}
        for c in pool:
            c = _fit(c, m, n, k)
            if smem_bytes(c) <= SMEM_BUDGET:
                fitted.setdefault((c.block_m, c.block_n, c.block_k), c)
        # sorted is stable: equal estimates keep the pool's order of preference
        ranked = sorted(fitted.values(), key=lambda c: estimate_clocks(c, b, m, n, k))
        return ranked[:MAX_CONFIGS]

    def prefer(self, problem: GemmProblem) -> bool:
        """Products big enough for tensor cores, with enough tiles to fill the SMs and a
        short K (at most :data:`PREFER_MAX_K`); not decode-like ones (M <= 64 against a
        large B), which the library streams better."""
        sizes = problem.static_sizes()
        if sizes is None or self.supports(problem) is not None:
            return False
        b, m, n, k = sizes
        if m * n < 64 * 64 or k < 64:
            return False  # too little work for tensor cores to repay a kernel of its own
        if k > PREFER_MAX_K:
            return False  # compute-bound: cuBLAS's kernels win, the saved epilogue pass is small
        if m <= 64 and n * k >= 2**20:
            return False  # decode-like: the library's GEMV and split-K kernels stream weights better
        if b * _cdiv(m, 64) * _cdiv(n, 64) < SMS and k > 1024:
            return False  # too few tiles to fill the SMs, and no split-K here to make more
        return True

    def render(self, problem: GemmProblem, names: Mapping[str, str],
               config: TemplateConfig | None) -> str:
        """The statements of the dialect's contract. Clamps and masks are left out where
        every configuration of :meth:`configs` divides the (literal) size, behind a
        ``tl.static_assert``: launch the template with those configurations."""
        w = CodeWriter()
        configs = self.configs(problem)
        self._program_tile(w, problem, names)
        self._operand_pointers(w, problem, names, configs)
        self._k_loop(w, problem, names, configs)
        return w.text().rstrip("\n")

    # -- the three parts of the rendered body

    def _program_tile(self, w: CodeWriter, problem: GemmProblem, names: Mapping[str, str]) -> None:
        """``pid_b``, ``offs_m``, ``offs_n``: the batch and the tile of this program, tiles
        walked column by column within groups of GROUP_M tile rows."""
        M, N = names["M"], names["N"]
        w.line("mm_pid = tl.program_id(0)")
        # not tl.cdiv (nor tl.zeros below): JIT functions of Triton's library, which a process
        # that imported triton under TRITON_INTERPRET=1 holds interpreted and cannot compile
        w.line(f"mm_tiles_m = ({_atom(M)} + XBLOCK - 1) // XBLOCK")
        w.line(f"mm_tiles_n = ({_atom(N)} + RBLOCK - 1) // RBLOCK")
        if problem.op == "bmm":
            w.line("pid_b = mm_pid // (mm_tiles_m * mm_tiles_n)")
            w.line("mm_tile = mm_pid % (mm_tiles_m * mm_tiles_n)")
        else:
            w.line("pid_b = 0")
            w.line("mm_tile = mm_pid")
        w.line("mm_group = GROUP_M * mm_tiles_n")
        w.line("mm_first_m = (mm_tile // mm_group) * GROUP_M")
        w.line("mm_group_m = tl.minimum(mm_tiles_m - mm_first_m, GROUP_M)")
        w.line("mm_pid_m = mm_first_m + (mm_tile % mm_group) % mm_group_m")
        w.line("mm_pid_n = (mm_tile % mm_group) // mm_group_m")
        w.line("offs_m = mm_pid_m * XBLOCK + tl.arange(0, XBLOCK)")
        w.line("offs_n = mm_pid_n * RBLOCK + tl.arange(0, RBLOCK)")

    def _operand_pointers(self, w: CodeWriter, problem: GemmProblem, names: Mapping[str, str],
                          configs: list[TemplateConfig]) -> None:
        """``mm_a``/``mm_b``: pointer tiles of the first K step. Rows past M and columns past N
        are clamped into range unless every candidate block divides them."""
        wide = self._needs_int64(problem)
        cast = ".to(tl.int64)" if wide else ""
        for var, offs, size, block, attr in (("mm_rows", "offs_m", "M", "XBLOCK", "block_m"),
                                             ("mm_cols", "offs_n", "N", "RBLOCK", "block_n")):
            value = _literal(names[size])
            clamped = f"{offs} % {_atom(names[size])}"
            clamped = f"({clamped}).to(tl.int64)" if wide else clamped
            dividing = [value is not None and value % getattr(c, attr) == 0 for c in configs]
            if all(dividing):
                w.line(f'tl.static_assert({names[size]} % {block} == 0, "{block} must divide {size}: '
                       f'the template skipped the clamp")')
            _per_config(w, dividing, f"{names[size]} % {block} == 0",
                        lambda: w.line(f"{var} = {offs}{cast}"), lambda: w.line(f"{var} = {clamped}"))
        w.line(f"mm_k = tl.arange(0, KBLOCK){cast}")
        batch = "pid_b" if problem.op == "mm" or not wide else "pid_b.to(tl.int64)"
        first = 1 if problem.op == "bmm" else 0
        for operand, rows, cols in (("a", "mm_rows[:, None]", "mm_k[None, :]"),
                                    ("b", "mm_k[:, None]", "mm_cols[None, :]")):
            stride = [names[f"{operand}_stride{first + i}"] for i in range(2)]
            base = _sum(names[f"{operand}_offset"],
                        _product(batch, names[f"{operand}_stride0"]) if first else "0")
            index = _sum(base, _product(rows, stride[0]), _product(cols, stride[1]))
            w.line(f"mm_{operand} = {names[operand]} + ({index})")

    def _k_loop(self, w: CodeWriter, problem: GemmProblem, names: Mapping[str, str],
                configs: list[TemplateConfig]) -> None:
        """``acc``: the float32 product, one ``tl.dot`` per K step; the K tail is masked
        unless every candidate KBLOCK divides K."""
        K = names["K"]
        first = 1 if problem.op == "bmm" else 0
        a_step, b_step = names[f"a_stride{first + 1}"], names[f"b_stride{first}"]
        k = _literal(K)
        dividing = [k is not None and k % c.block_k == 0 for c in configs]
        if all(dividing):
            w.line(f'tl.static_assert({K} % KBLOCK == 0, "KBLOCK must divide K: '
                   f'the template skipped the mask")')
        w.line("acc = tl.full((XBLOCK, RBLOCK), 0.0, tl.float32)")
        with w.block(f"for mm_k0 in range(0, {K}, KBLOCK):"):
            _per_config(w, dividing, f"{K} % KBLOCK == 0", lambda: self._loads(w, None), lambda: self._loads(w, K))
            w.line("acc = tl.dot(mm_a_tile, mm_b_tile, acc)")
            w.line(f"mm_a += {_product('KBLOCK', a_step)}")
            w.line(f"mm_b += {_product('KBLOCK', b_step)}")

    @staticmethod
    def _loads(w: CodeWriter, K: str | None) -> None:
        """One K step's operand tiles, masked past ``K`` unless it is None."""
        if K is None:
            w.line("mm_a_tile = tl.load(mm_a)")
            w.line("mm_b_tile = tl.load(mm_b)")
        else:
            w.line(f"mm_a_tile = tl.load(mm_a, mask=mm_k[None, :] < {_atom(K)} - mm_k0, other=0.0)")
            w.line(f"mm_b_tile = tl.load(mm_b, mask=mm_k[:, None] < {_atom(K)} - mm_k0, other=0.0)")

    @staticmethod
    def _needs_int64(problem: GemmProblem) -> bool:
        """Whether an operand's element index can pass int32 (then indices are int64)."""
        for op in (problem.a, problem.b):
            extent = _max_index(op, k_overrun=256)
            if extent is None or extent >= _INT32_LIMIT:
                return True
        return False


__all__ = ["TritonGemm", "estimate_clocks", "smem_bytes"]
