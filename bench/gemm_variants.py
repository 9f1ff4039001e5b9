"""Hopper main-loop variants of the fused ``gelu(x @ w.T + b)`` GEMM (bf16, 8192^3), timed side
by side, to choose what ``plugins/template_gemm`` should render.

Every kernel has the epilogue Coil's Triton backend writes after the template: the product
plus the bias, rounded once to bfloat16, then erf-GELU in float32, stored as bfloat16 (masked
pointer stores, except the variants named ``tma_store``). ``x`` is (M, K) row-major, ``w`` is
(N, K) row-major (so the template's ``b = w.T`` is column-major), ``bias`` is (N,). Sizes are
constexprs, as the template renders static sizes as literals.

Variants:
  ptr           the current template's loop: pointer tiles, ``tl.dot`` pipelined by num_stages
                (cp.async), one tile per program, GROUP_M tile-row groups;
  tma           the same with on-device TMA descriptors (``tl.make_tensor_descriptor``);
  persistent    TMA, a grid of one program per SM, each looping over tiles (flattened loop:
                the next tile's loads are issued during this tile's epilogue);
  persistent_ws the same with ``warp_specialize=True``: on sm_90 Triton 3.6 builds a 4-warp TMA
                producer and two 4-warp consumer groups (half the tile's rows each). It
                applies only with num_warps=4 and flatten off; otherwise the plain loop is
                built, silently (``--build-only`` shows which: warps=12);
  cublas        ``F.linear`` alone, and ``F.gelu(F.linear(...))`` (the eager baseline).
Rows marked NO-GELU store the linear alone: against their GELU twin they give the epilogue's
cost in that loop.

Usage (CUDA):  python bench/gemm_variants.py [--only SUBSTR] [--reps 25] [--rounds 2]
Without a GPU: python bench/gemm_variants.py --build-only
  compiles every Triton variant for sm_90 (``triton.compile`` with a GPUTarget), reports
  shared memory, warps, global scratch, and (through the bundled ptxas -v) registers and
  spills. Shared memory over 232448 bytes (227 KB) fails to launch on an H100/H200.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

M = N = K = 8192
H100_SMEM_LIMIT = 232448
SQRT1_2 = tl.constexpr(0.7071067811865476)


# --- shared pieces ---------------------------------------------------------------------------


@triton.jit
def _tile_of(tile, M: tl.constexpr, N: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
             GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile ``tile``: tiles walked column by column in groups of GROUP_M tile
    rows, as the template does."""
    tiles_m = (M + XBLOCK - 1) // XBLOCK
    tiles_n = (N + RBLOCK - 1) // RBLOCK
    group = GROUP_M * tiles_n
    first_m = (tile // group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % group_m
    pid_n = (tile % group) // group_m
    return pid_m, pid_n


@triton.jit
def _bias_gelu(acc, offs_n, bias_ptr, N: tl.constexpr, GELU: tl.constexpr):
    """The backend's epilogue values: (acc + bias) rounded to bf16, GELU(erf) in float32
    (without GELU: the linear alone, to measure what the GELU costs)."""
    bias = tl.load(bias_ptr + offs_n[None, :], mask=offs_n[None, :] < N, other=0.0)
    v = (acc + bias.to(tl.float32)).to(tl.bfloat16)
    if GELU:
        v = v.to(tl.float32)
        v = (0.5 * v * (1.0 + tl.math.erf(v * SQRT1_2))).to(tl.bfloat16)
    return v


@triton.jit
def _store(acc, offs_m, offs_n, bias_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr,
           GELU: tl.constexpr):
    """The backend's store: masked pointer tile."""
    y = _bias_gelu(acc, offs_n, bias_ptr, N, GELU)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], y, mask=mask)


@triton.jit
def _tma_store(acc, off_m, off_n, bias_ptr, c_desc, N: tl.constexpr, RBLOCK: tl.constexpr,
               SUBTILE: tl.constexpr, GELU: tl.constexpr):
    """The epilogue stored through a TMA descriptor (in two column halves with SUBTILE, which
    halves the shared-memory staging buffer)."""
    offs_n = off_n + tl.arange(0, RBLOCK)
    y = _bias_gelu(acc, offs_n, bias_ptr, N, GELU)
    if SUBTILE:
        XB: tl.constexpr = y.shape[0]
        halves = tl.permute(tl.reshape(y, (XB, 2, RBLOCK // 2)), (0, 2, 1))
        y0, y1 = tl.split(halves)
        c_desc.store([off_m, off_n], y0)
        c_desc.store([off_m, off_n + RBLOCK // 2], y1)
    else:
        c_desc.store([off_m, off_n], y)


# --- a: the current template's loop ----------------------------------------------------------


@triton.jit
def gemm_ptr(x_ptr, w_ptr, bias_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
             XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, KBLOCK: tl.constexpr, GROUP_M: tl.constexpr,
             GELU: tl.constexpr):
    # what TritonGemm.render gives for this problem (sizes divide every block: no clamps/masks)
    pid_m, pid_n = _tile_of(tl.program_id(0), M, N, XBLOCK, RBLOCK, GROUP_M)
    offs_m = pid_m * XBLOCK + tl.arange(0, XBLOCK)
    offs_n = pid_n * RBLOCK + tl.arange(0, RBLOCK)
    mm_k = tl.arange(0, KBLOCK)
    mm_a = x_ptr + (offs_m[:, None] * K + mm_k[None, :])
    mm_b = w_ptr + (mm_k[:, None] + offs_n[None, :] * K)
    acc = tl.full((XBLOCK, RBLOCK), 0.0, tl.float32)
    for mm_k0 in range(0, K, KBLOCK):
        acc = tl.dot(tl.load(mm_a), tl.load(mm_b), acc)
        mm_a += KBLOCK
        mm_b += KBLOCK
    _store(acc, offs_m, offs_n, bias_ptr, out_ptr, M, N, GELU)


# --- b: TMA, one tile per program -------------------------------------------------------------


@triton.jit
def gemm_tma(x_ptr, w_ptr, bias_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
             XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, KBLOCK: tl.constexpr, GROUP_M: tl.constexpr,
             GELU: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), M, N, XBLOCK, RBLOCK, GROUP_M)
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[XBLOCK, KBLOCK])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[RBLOCK, KBLOCK])
    off_m = pid_m * XBLOCK
    off_n = pid_n * RBLOCK
    acc = tl.full((XBLOCK, RBLOCK), 0.0, tl.float32)
    for k0 in range(0, K, KBLOCK):
        a = a_desc.load([off_m, k0])
        b = b_desc.load([off_n, k0])
        acc = tl.dot(a, b.T, acc)
    offs_m = off_m + tl.arange(0, XBLOCK)
    offs_n = off_n + tl.arange(0, RBLOCK)
    _store(acc, offs_m, offs_n, bias_ptr, out_ptr, M, N, GELU)


# --- c: persistent TMA ------------------------------------------------------------------------


@triton.jit
def gemm_persistent(x_ptr, w_ptr, bias_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr,
                    K: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
                    KBLOCK: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                    TMA_STORE: tl.constexpr, SUBTILE: tl.constexpr, GELU: tl.constexpr):
    start = tl.program_id(0)
    tiles = ((M + XBLOCK - 1) // XBLOCK) * ((N + RBLOCK - 1) // RBLOCK)
    k_tiles = (K + KBLOCK - 1) // KBLOCK
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[XBLOCK, KBLOCK])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[RBLOCK, KBLOCK])
    if TMA_STORE:
        c_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1],
                                           block_shape=[XBLOCK, RBLOCK // 2 if SUBTILE else RBLOCK])
    # the epilogue recomputes its tile from its own counter (as Triton's persistent tutorial
    # does): it breaks the dependency between the next tile's prologue and this epilogue
    tile_c = start - NUM_SMS
    for tile in tl.range(start, tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, M, N, XBLOCK, RBLOCK, GROUP_M)
        off_m = pid_m * XBLOCK
        off_n = pid_n * RBLOCK
        acc = tl.zeros((XBLOCK, RBLOCK), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * KBLOCK])
            b = b_desc.load([off_n, ki * KBLOCK])
            acc = tl.dot(a, b.T, acc)
        tile_c += NUM_SMS
        cm, cn = _tile_of(tile_c, M, N, XBLOCK, RBLOCK, GROUP_M)
        if TMA_STORE:
            _tma_store(acc, cm * XBLOCK, cn * RBLOCK, bias_ptr, c_desc, N, RBLOCK, SUBTILE, GELU)
        else:
            offs_m = cm * XBLOCK + tl.arange(0, XBLOCK)
            offs_n = cn * RBLOCK + tl.arange(0, RBLOCK)
            _store(acc, offs_m, offs_n, bias_ptr, out_ptr, M, N, GELU)


# --- the variants -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    """One kernel and launch configuration. ``gelu=False`` stores the linear alone (bias, no
    GELU): the difference to the GELU variant is what the epilogue costs in that loop."""

    name: str
    kernel: Any
    block: tuple[int, int, int]
    num_warps: int
    num_stages: int
    persistent: bool = False
    extra: tuple[tuple[str, int], ...] = ()
    gelu: bool = True
    group_m: int = 8

    def constexprs(self, num_sms: int) -> dict[str, int]:
        bm, bn, bk = self.block
        c = {"M": M, "N": N, "K": K, "XBLOCK": bm, "RBLOCK": bn, "KBLOCK": bk, "GROUP_M": self.group_m}
        if self.persistent:
            c["NUM_SMS"] = num_sms
        c.update(dict(self.extra))
        c["GELU"] = int(self.gelu)
        return c

    def grid(self, num_sms: int) -> int:
        bm, bn, _ = self.block
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        return min(tiles, num_sms) if self.persistent else tiles

    def config(self) -> str:
        bm, bn, bk = self.block
        words = [f"{bm}x{bn}x{bk} w{self.num_warps} s{self.num_stages}"]
        words += [k.lower() for k, v in self.extra if v]
        words += [f"group_m={self.group_m}"] if self.group_m != 8 else []
        words += [] if self.gelu else ["NO-GELU"]
        return " ".join(words)


def _persistent(name: str, block: tuple[int, int, int], warps: int, stages: int, *, flatten: bool = True,
                ws: bool = False, tma_store: bool = False, subtile: bool = False,
                gelu: bool = True, group_m: int = 8) -> Variant:
    extra = (("FLATTEN", int(flatten)), ("WARP_SPECIALIZE", int(ws)), ("TMA_STORE", int(tma_store)),
             ("SUBTILE", int(subtile)))
    return Variant(name, gemm_persistent, block, warps, stages, persistent=True, extra=extra, gelu=gelu,
                   group_m=group_m)


def _ws(block: tuple[int, int, int], stages: int) -> Variant:
    # Triton 3.6's Hopper warp specialization applies only with num_warps=4 and an unflattened
    # loop (num_warps=8 or flatten=True build the plain loop): a 4-warp TMA producer plus two
    # 4-warp consumer groups, each taking half the tile's rows (12 warps, setmaxnreg 40/256)
    return _persistent("persistent_ws", block, 4, stages, flatten=False, ws=True)


VARIANTS = [
    # a: the template's loop as it is (its best measured config first)
    Variant("ptr", gemm_ptr, (128, 256, 64), 8, 3),
    Variant("ptr", gemm_ptr, (256, 128, 64), 8, 3),
    Variant("ptr", gemm_ptr, (128, 256, 64), 8, 4),
    Variant("ptr", gemm_ptr, (128, 128, 64), 4, 4),
    Variant("ptr", gemm_ptr, (128, 256, 64), 8, 3, gelu=False),
    # b: TMA loads, one tile per program (128x128 s3: 96 KB, two programs per SM)
    Variant("tma", gemm_tma, (128, 256, 64), 8, 3),
    Variant("tma", gemm_tma, (128, 256, 64), 8, 4),
    Variant("tma", gemm_tma, (256, 128, 64), 8, 3),
    Variant("tma", gemm_tma, (128, 128, 64), 4, 4),
    Variant("tma", gemm_tma, (128, 128, 64), 4, 3),
    # c: persistent TMA
    _persistent("persistent", (128, 256, 64), 8, 3),
    _persistent("persistent", (128, 256, 64), 8, 4),
    _persistent("persistent", (128, 128, 64), 8, 4),
    _persistent("persistent", (128, 128, 64), 4, 4),
    _persistent("persistent", (128, 256, 64), 8, 3, gelu=False),
    _persistent("persistent", (128, 256, 64), 8, 3, flatten=False),
    # 16 tile rows a group: the 132 tiles in flight span ~16x8 tiles of 128x256, about square
    # in elements, so less DRAM traffic per wave than 8x16.5
    _persistent("persistent", (128, 256, 64), 8, 3, group_m=16),
    _persistent("persistent_tma_store", (128, 256, 64), 8, 3, tma_store=True, subtile=True),
    _ws((128, 256, 64), 3),
    _ws((128, 256, 64), 4),
    _ws((256, 128, 64), 3),
    _ws((128, 128, 64), 4),
]


# --- building without a GPU -------------------------------------------------------------------


def _why(e: BaseException) -> str:
    """The root cause of a (nested) compilation error, on one line."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip() and ln.strip() != "^"]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]


def _ptxas_usage(ptx: str) -> str:
    """Registers and spills as ptxas -v reports them (the bundled ptxas), or ''."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return ""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        got = subprocess.run([ptxas, "-v", "-arch=sm_90a", src, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True)
    text = got.stdout + got.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    out = f"regs={regs.group(1)}" if regs else "regs=?"
    if spill:
        out += f" spill_st={spill.group(1)}B spill_ld={spill.group(2)}B"
    return out


def build_only(variants: list[Variant], num_sms: int = 132) -> int:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    target = GPUTarget("cuda", 90, 32)
    failures = 0
    for v in variants:
        consts = v.constexprs(num_sms)
        sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16"}
        sig.update({name: "constexpr" for name in consts})
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
        t0 = time.perf_counter()
        try:
            b = triton.compile(ASTSource(fn=v.kernel, signature=sig, constexprs=consts, attrs=attrs),
                               target=target, options={"num_warps": v.num_warps, "num_stages": v.num_stages})
        except Exception as e:  # report and go on: a variant that does not build is a result
            failures += 1
            print(f"{v.name:22s} {v.config():40s} BUILD FAILED: {_why(e)}", flush=True)
            continue
        md = b.metadata
        smem = md.shared
        over = " OVER 227KB" if smem > H100_SMEM_LIMIT else ""
        ptx = b.asm["ptx"]
        wgmma = "wgmma" if "wgmma.mma_async" in ptx else "NO-wgmma"
        tma = "tma" if "cp.async.bulk.tensor" in ptx else "cp.async"
        # with setmaxnreg, ptxas -v reports the entry cap (65536 / threads), not the consumers'
        ws = " warp-specialized(setmaxnreg)" if "ttg.warp_specialize(" in b.asm["ttgir"] else ""
        print(f"{v.name:22s} {v.config():40s} built {time.perf_counter() - t0:5.1f}s "
              f"shared={smem}{over} warps={md.num_warps} scratch={md.global_scratch_size} "
              f"{wgmma} {tma} {_ptxas_usage(ptx)}{ws}", flush=True)
    return failures


# --- timing on a GPU --------------------------------------------------------------------------


def _median_ms(fn: Callable[[], Any], reps: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d = out.float() - ref
    return d.abs().max().item(), (d.norm() / ref.norm()).item()


@dataclasses.dataclass
class Case:
    name: str
    config: str
    fn: Callable[[], torch.Tensor]
    gelu: bool = True
    errors: tuple[float, float] | None = None
    failed: str = ""
    ms: list[float] = dataclasses.field(default_factory=list)


def run(variants: list[Variant], reps: int, rounds: int, include_cublas: bool, dev: str = "cuda") -> None:
    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5
    bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
    linear = F.linear(x.float(), w.float(), bias.float())  # float32 throughout (TF32 is off)
    refs = {False: linear, True: F.gelu(linear)}
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    # workspace for the on-device TMA descriptors (global_scratch of the descriptor kernels)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, device=dev, dtype=torch.int8))
    flops = 2 * M * N * K
    print(f"# {torch.cuda.get_device_name(0)}, {num_sms} SMs, torch {torch.__version__}, "
          f"triton {triton.__version__}; bf16 gelu(x @ w.T + b) {M}x{N}x{K}; median of {reps} "
          f"per round, best of {rounds} rounds; errors vs a float32 reference", flush=True)

    cases: list[Case] = []
    if include_cublas:
        cases.append(Case("cublas_linear", "F.linear", lambda: F.linear(x, w, bias), gelu=False))
        cases.append(Case("cublas_linear_gelu", "F.gelu(F.linear)", lambda: F.gelu(F.linear(x, w, bias))))
    for v in variants:
        out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)

        def call(v: Variant = v, out: torch.Tensor = out) -> torch.Tensor:
            v.kernel[(v.grid(num_sms),)](x, w, bias, out, **v.constexprs(num_sms),
                                         num_warps=v.num_warps, num_stages=v.num_stages)
            return out
        cases.append(Case(v.name, v.config(), call, gelu=v.gelu))

    for r in range(rounds):
        for c in cases:
            if c.failed:
                continue
            try:
                if c.errors is None:  # first call: compiles, and checks the result
                    t0 = time.perf_counter()
                    got = c.fn()
                    torch.cuda.synchronize()
                    first = time.perf_counter() - t0
                    d = got.float() - refs[c.gelu]
                    c.errors = (d.abs().max().item(), (d.norm() / refs[c.gelu].norm()).item())
                    del d
                    print(f"  first call {first:5.1f}s  {c.name} {c.config}", flush=True)
                c.ms.append(_median_ms(c.fn, reps))
            except Exception as e:  # report and go on (out of shared memory, no build...)
                c.failed = _why(e)
                print(f"{c.name:22s} {c.config:40s} FAILED: {c.failed}", flush=True)
                continue
            print(f"  round {r}: {c.ms[-1]:7.3f} ms {flops / c.ms[-1] / 1e9:6.1f} TFLOP/s  "
                  f"{c.name} {c.config}", flush=True)

    print("\n# summary, fastest first (NO-GELU rows and cublas_linear: without the GELU)")
    done = sorted((c for c in cases if c.ms), key=lambda c: min(c.ms))
    for c in done:
        ms = min(c.ms)
        mx, rel = c.errors or (float("nan"), float("nan"))
        print(f"{c.name:22s} {c.config:40s} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s "
              f"max_abs={mx:.2e} rel_l2={rel:.2e}", flush=True)
    for c in cases:
        if c.failed:
            print(f"{c.name:22s} {c.config:40s} FAILED: {c.failed}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-only", action="store_true", help="compile every variant for sm_90, no GPU")
    p.add_argument("--only", default="", help="variants whose name contains this")
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    variants = [v for v in VARIANTS if args.only in v.name]
    if args.build_only:
        if os.environ.get("TRITON_INTERPRET"):
            sys.exit("unset TRITON_INTERPRET: the interpreter cannot build kernels")
        sys.exit(1 if build_only(variants) else 0)
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: use --build-only")
    run(variants, args.reps, args.rounds, include_cublas=not args.only or "cublas" in args.only)


if __name__ == "__main__":
    main()
