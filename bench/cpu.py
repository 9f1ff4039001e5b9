"""CPU benchmark: eager vs. ``inductor`` vs. ``coil`` side by side, in one process.

Usage::

    python bench/cpu.py [--backends eager,inductor,coil] [--workloads softmax,layernorm,...]
                        [--repeat N] [--markdown-out FILE] [--threads N] [--pin-malloc]

Every backend other than ``eager`` is used as ``torch.compile(fn, backend=NAME)``,
so any registered dynamo backend name works (e.g. ``aot_eager`` as a stand-in
for ``coil`` while coil is being written).

Workloads use one fixed size each: every float32 tensor is 24 MiB (6,291,456
floats, 1536x4096 for 2-D ones); the bf16 workload uses 3072x4096 so its tensors
are 24 MiB too.  24 MiB stays under glibc's 32 MiB maximum mmap threshold, so
once the allocator has warmed up, fresh outputs come from the heap and page
faults do not swamp the kernels.  That is not the whole story: glibc still
trims the heap when more than twice the threshold is free at its top, which
happens after an eager chain frees several 24 MiB intermediates, so eager (and
aot_eager) can still page-fault on every call.  The ``faults/call`` column shows
it; ``--pin-malloc`` fixes the mmap threshold and turns trimming off through
``mallopt`` to take the allocator out of the picture.  The GPT block and the
MLP training step are small and matmul-bound.

Columns of the table:

* ``median ms``: median over ``--repeat`` samples; each sample is the mean of
  back-to-back calls lasting at least ``MIN_SAMPLE_S`` after ``WARMUP_CALLS``
  warm-up calls (garbage collection disabled while sampling).  Samples are
  taken round-robin across backends so that drifting background load (this
  may be a shared 2-core machine) hits all backends alike.  ``IQR %`` is the
  inter-quartile range of the samples relative to the median (a noise gauge),
  and the per-workload ``background cores`` is the CPU that other processes
  used meanwhile (from /proc/stat).
* ``GB/s``: ideal bytes / median time, with ideal bytes = every distinct input
  tensor read once + every output tensor written once (``ideal_bytes``; for the
  training step the outputs are the loss and all parameter gradients).  This is
  only meaningful for bandwidth-bound workloads, so it is shown as ``-`` for the
  matmul-bound GPT block and MLP step (their ideal bytes are still listed in
  the per-workload table, computed the same way).  1 GB = 1e9 bytes.
* ``first call s``: wall time of the very first call of the compiled function,
  i.e. including dynamo tracing and backend compilation (and the backward
  compile for the training step).  Cache dirs (TORCHINDUCTOR_CACHE_DIR,
  TRITON_CACHE_DIR, COIL_CACHE_DIR) point to fresh temporary directories, and
  each backend first compiles one unrelated warm-up function so that one-time
  import/initialisation costs are not charged to the first workload.  For
  ``eager`` it is just an ordinary first call.
* ``vs eager`` / ``vs inductor``: this backend's median time divided by the
  eager / inductor median time (lower is better; 0.50 = twice as fast).
* ``faults/call``: page faults (minor + major) of the whole process during the
  timed samples, per call; 6,144 faults = 24 MiB of freshly touched 4 KiB pages.
* ``check``: the compiled outputs (first call) against an eager reference via
  ``torch.testing.assert_close`` with dtype-appropriate loose tolerances.  A
  mismatch or an exception is shown in the row; the run continues.

On a machine shared with other jobs, OpenMP-parallel kernels degrade badly as
soon as every core is busy (a parallel region waits for a descheduled
thread); the report warns when ``background cores`` is high, and ``--threads N``
(``torch.set_num_threads`` before anything compiles) keeps the numbers usable.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import math
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from common import log_failure  # noqa: E402  (bench/ is on sys.path)

log = logging.getLogger("bench.cpu")

NUMEL = 6_291_456  # float32 elements in 24 MiB
ROWS, COLS = 1536, 4096  # 2-D fp32 shape with NUMEL elements
WARMUP_CALLS = 3
MIN_SAMPLE_S = 0.05
CONTENDED_CORES = 0.2  # background CPU use (cores) above which the report warns
EAGER = "eager"
INDUCTOR = "inductor"
CACHE_ENV_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COIL_CACHE_DIR")

Tensors = tuple[torch.Tensor, ...]


# --------------------------------------------------------------------------- #
# Workloads
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Workload:
    """One benchmark case.

    ``fn(*make_inputs())`` is what gets compiled.  For ``training`` workloads
    ``fn`` returns a scalar loss; the timed step is forward + ``backward()`` and
    its outputs are the loss plus the gradients of every input that requires
    grad.  Inference workloads run under ``torch.no_grad()``.
    """

    name: str
    description: str
    make_inputs: Callable[[], Tensors]
    fn: Callable[..., torch.Tensor]
    bandwidth_bound: bool = True
    training: bool = False
    atol: float = 1e-4
    rtol: float = 1e-4


def _randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32).mul_(scale).to(dtype)


# 1. pointwise chain -------------------------------------------------------- #
def pointwise_inputs() -> Tensors:
    return (_randn(NUMEL),)


def pointwise_fn(x: torch.Tensor) -> torch.Tensor:
    y = x * 2.0 + 1.0
    y = torch.sin(y) * torch.sigmoid(x)
    y = torch.relu(y) - 0.25 * torch.tanh(x)
    return y * y + torch.exp(-x.abs())


# 2. bias + GELU + residual, bf16 ------------------------------------------- #
BF16_ROWS = 2 * ROWS  # bf16 tensors are 24 MiB too


def bias_gelu_residual_inputs() -> Tensors:
    return (
        _randn(BF16_ROWS, COLS, dtype=torch.bfloat16),
        _randn(COLS, dtype=torch.bfloat16),
        _randn(BF16_ROWS, COLS, dtype=torch.bfloat16),
    )


def bias_gelu_residual_fn(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias) + residual


# 3. softmax ---------------------------------------------------------------- #
def matrix_inputs() -> Tensors:
    return (_randn(ROWS, COLS),)


def softmax_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


# 4. layer norm --------------------------------------------------------------- #
def layernorm_inputs() -> Tensors:
    return (_randn(ROWS, COLS), 1.0 + _randn(COLS, scale=0.1), _randn(COLS, scale=0.1))


def layernorm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


# 5. RMS norm ----------------------------------------------------------------- #
def rmsnorm_inputs() -> Tensors:
    return (_randn(ROWS, COLS), 1.0 + _randn(COLS, scale=0.1))


def rmsnorm_fn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


# 6./7. sums ------------------------------------------------------------------ #
def sum_last_fn(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1)


def sum_first_fn(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=0)


# 8. cross-entropy ------------------------------------------------------------ #
CE_ROWS, CE_VOCAB = 768, 8192  # logits are NUMEL floats


def cross_entropy_inputs() -> Tensors:
    return (_randn(CE_ROWS, CE_VOCAB), torch.randint(0, CE_VOCAB, (CE_ROWS,), dtype=torch.int64))


def cross_entropy_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, targets)


# 9. GPT block forward -------------------------------------------------------- #
GPT_B, GPT_T, GPT_C, GPT_HEADS = 4, 128, 256, 4


def gpt_block_inputs() -> Tensors:
    c = GPT_C
    s = 1.0 / math.sqrt(c)
    return (
        _randn(GPT_B, GPT_T, c),  # x
        1.0 + _randn(c, scale=0.1), _randn(c, scale=0.1),  # ln1 weight, bias
        _randn(c, 3 * c, scale=s), _randn(3 * c, scale=0.02),  # qkv projection
        _randn(c, c, scale=s), _randn(c, scale=0.02),  # attention output projection
        1.0 + _randn(c, scale=0.1), _randn(c, scale=0.1),  # ln2 weight, bias
        _randn(c, 4 * c, scale=s), _randn(4 * c, scale=0.02),  # MLP up
        _randn(4 * c, c, scale=0.5 * s), _randn(c, scale=0.02),  # MLP down
    )


def gpt_block_fn(
    x: torch.Tensor,
    ln1_w: torch.Tensor, ln1_b: torch.Tensor,
    w_qkv: torch.Tensor, b_qkv: torch.Tensor,
    w_proj: torch.Tensor, b_proj: torch.Tensor,
    ln2_w: torch.Tensor, ln2_b: torch.Tensor,
    w_fc: torch.Tensor, b_fc: torch.Tensor,
    w_out: torch.Tensor, b_out: torch.Tensor,
) -> torch.Tensor:
    b, t, c = x.shape
    hd = c // GPT_HEADS
    h = F.layer_norm(x, (c,), ln1_w, ln1_b)
    q, k, v = (h @ w_qkv + b_qkv).split(c, dim=-1)
    q = q.view(b, t, GPT_HEADS, hd).transpose(1, 2)
    k = k.view(b, t, GPT_HEADS, hd).transpose(1, 2)
    v = v.view(b, t, GPT_HEADS, hd).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, c)
    x = x + (y @ w_proj + b_proj)
    h = F.layer_norm(x, (c,), ln2_w, ln2_b)
    return x + (F.gelu(h @ w_fc + b_fc) @ w_out + b_out)


# 10. MLP training step -------------------------------------------------------- #
MLP_BATCH, MLP_WIDTH = 256, 512


def mlp_train_inputs() -> Tensors:
    s = 1.0 / math.sqrt(MLP_WIDTH)
    params = [
        _randn(MLP_WIDTH, MLP_WIDTH, scale=s), _randn(MLP_WIDTH, scale=0.02),
        _randn(MLP_WIDTH, MLP_WIDTH, scale=s), _randn(MLP_WIDTH, scale=0.02),
        _randn(MLP_WIDTH, MLP_WIDTH, scale=s), _randn(MLP_WIDTH, scale=0.02),
    ]
    return (
        _randn(MLP_BATCH, MLP_WIDTH),
        torch.randint(0, MLP_WIDTH, (MLP_BATCH,), dtype=torch.int64),
        *(p.requires_grad_() for p in params),
    )


def mlp_train_fn(
    x: torch.Tensor, target: torch.Tensor,
    w1: torch.Tensor, b1: torch.Tensor,
    w2: torch.Tensor, b2: torch.Tensor,
    w3: torch.Tensor, b3: torch.Tensor,
) -> torch.Tensor:
    h = F.gelu(F.linear(x, w1, b1))
    h = F.gelu(F.linear(h, w2, b2))
    return F.cross_entropy(F.linear(h, w3, b3), target)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("pointwise", f"sin/sigmoid/relu/tanh/exp chain, fp32 [{NUMEL}]",
                 pointwise_inputs, pointwise_fn),
        Workload("bias_gelu_residual", f"gelu(x+bias)+residual, bf16 [{BF16_ROWS},{COLS}]",
                 bias_gelu_residual_inputs, bias_gelu_residual_fn, atol=5e-2, rtol=2e-2),
        Workload("softmax", f"softmax(dim=-1), fp32 [{ROWS},{COLS}]",
                 matrix_inputs, softmax_fn, atol=1e-6, rtol=1e-4),
        Workload("layernorm", f"F.layer_norm w/ weight+bias, fp32 [{ROWS},{COLS}]",
                 layernorm_inputs, layernorm_fn, atol=1e-4, rtol=1e-4),
        Workload("rmsnorm", f"x*rsqrt(mean(x^2,-1)+eps)*w, fp32 [{ROWS},{COLS}]",
                 rmsnorm_inputs, rmsnorm_fn, atol=1e-4, rtol=1e-4),
        Workload("sum_last", f"x.sum(-1), fp32 [{ROWS},{COLS}]",
                 matrix_inputs, sum_last_fn, atol=1e-3, rtol=1e-4),
        Workload("sum_first", f"x.sum(0), fp32 [{ROWS},{COLS}]",
                 matrix_inputs, sum_first_fn, atol=1e-3, rtol=1e-4),
        Workload("cross_entropy", f"F.cross_entropy, fp32 logits [{CE_ROWS},{CE_VOCAB}], int64 targets",
                 cross_entropy_inputs, cross_entropy_fn, atol=1e-4, rtol=1e-4),
        Workload("gpt_block", f"GPT block fwd, no_grad, fp32 B={GPT_B} T={GPT_T} C={GPT_C} heads={GPT_HEADS}",
                 gpt_block_inputs, gpt_block_fn, bandwidth_bound=False, atol=1e-3, rtol=1e-3),
        Workload("mlp_train", f"3x(Linear+GELU) + CE loss, fwd+bwd, fp32 batch={MLP_BATCH} width={MLP_WIDTH}",
                 mlp_train_inputs, mlp_train_fn, bandwidth_bound=False, training=True, atol=1e-4, rtol=1e-3),
    ]
}


# --------------------------------------------------------------------------- #
# Measurement helpers
# --------------------------------------------------------------------------- #


def ideal_bytes(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> int:
    """Bytes moved if each distinct input is read once and each output written once."""
    total, seen = 0, set()
    for t in inputs:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total + sum(t.numel() * t.element_size() for t in outputs)


def make_step(workload: Workload, fn: Callable[..., torch.Tensor], inputs: Tensors) -> Callable[[], Tensors]:
    """The callable that is timed: one inference call, or one fwd+bwd training step."""
    if not workload.training:
        def step() -> Tensors:
            with torch.no_grad():
                out = fn(*inputs)
            return out if isinstance(out, tuple) else (out,)
        return step

    params = [t for t in inputs if t.requires_grad]

    def train_step() -> Tensors:
        for p in params:
            p.grad = None
        loss = fn(*inputs)
        loss.backward()
        return (loss.detach(), *(p.grad for p in params))  # type: ignore[misc]
    return train_step


@dataclass
class Samples:
    """Per-backend timing state while samples are interleaved across backends."""

    step: Callable[[], object]
    inner: int = 1  # calls per sample
    times: list[float] = field(default_factory=list)  # seconds per call, one entry per sample
    faults: int = 0


def _spread(times: Sequence[float]) -> float:
    """Inter-quartile range (full range for fewer than 4 samples)."""
    if len(times) < 4:
        return max(times) - min(times)
    q1, _, q3 = statistics.quantiles(times, n=4)
    return q3 - q1


def _page_faults() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall s, CPU-seconds used by the whole machine, CPU-seconds used by this process)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), busy, usage.ru_utime + usage.ru_stime


def time_interleaved(steps: dict[str, Callable[[], object]], repeat: int,
                     errors: dict[str, str]) -> tuple[dict[str, Samples], float | None]:
    """Time every step, taking the ``repeat`` samples round-robin across backends.

    Interleaving keeps slow drifts in background load from biasing one backend.
    A sample is ``inner`` back-to-back calls lasting at least ``MIN_SAMPLE_S``.
    Failing steps are dropped and their error stored in ``errors``.  Also returns
    the CPU cores used by other processes during the sampling (None if unknown).
    """
    states: dict[str, Samples] = {}
    for name, step in steps.items():
        try:
            for _ in range(WARMUP_CALLS):
                step()
            t0 = time.perf_counter()
            step()
            inner = max(1, math.ceil(MIN_SAMPLE_S / max(time.perf_counter() - t0, 1e-9)))
            states[name] = Samples(step, inner)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            errors[name] = "timing error: " + log_failure(f"{name} warming up for timing", exc)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        snap0 = _cpu_snapshot()
        for _ in range(repeat):
            for name, st in list(states.items()):
                try:
                    f0, t0 = _page_faults(), time.perf_counter()
                    for _ in range(st.inner):
                        st.step()
                    st.times.append((time.perf_counter() - t0) / st.inner)
                    st.faults += _page_faults() - f0
                except Exception as exc:  # noqa: BLE001 - reported in the table
                    errors[name] = "timing error: " + log_failure(f"{name} timing", exc)
                    del states[name]
        snap1 = _cpu_snapshot()
    finally:
        if gc_was_enabled:
            gc.enable()
    wall = snap1[0] - snap0[0]
    background = ((snap1[1] - snap0[1]) - (snap1[2] - snap0[2])) / wall if wall > 0 else None
    return states, (max(background, 0.0) if background is not None else None)


def compare(actual: Tensors, expected: Tensors, atol: float, rtol: float) -> str:
    """'ok (max err ...)' or 'MISMATCH: ...' for a compiled result vs. the eager reference."""
    if len(actual) != len(expected):
        return f"MISMATCH: {len(actual)} outputs vs {len(expected)} in eager"
    max_err = 0.0
    for a, e in zip(actual, expected):
        try:
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol)
        except Exception as exc:  # noqa: BLE001 - AssertionError, or TypeError for a non-tensor output
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            return "MISMATCH: " + "; ".join(lines[:3])
        if a.numel():
            max_err = max(max_err, (a.double() - e.double()).abs().max().item())
    return f"ok (max err {max_err:.1e})"


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


@dataclass
class Result:
    workload: str
    backend: str
    median_s: float | None = None
    iqr: float | None = None
    faults_per_call: float | None = None
    first_call_s: float | None = None
    gbps: float | None = None
    check: str = ""


@dataclass
class WorkloadInfo:
    workload: Workload
    ideal_bytes: int = 0
    results: dict[str, Result] = field(default_factory=dict)
    background_cores: float | None = None  # CPU used by other processes while timing


def compile_for(backend: str, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return fn if backend == EAGER else torch.compile(fn, backend=backend)


def warm_up_backend(backend: str) -> str | None:
    """Compile and run (fwd+bwd) one small unrelated function; returns an error string or None."""
    if backend == EAGER:
        return None

    def warm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (torch.cos(a) * b + a.exp()).sum(dim=1).mean()

    t0 = time.perf_counter()
    try:
        torch._dynamo.reset()
        a = torch.randn(64, 48, requires_grad=True)
        compile_for(backend, warm)(a, torch.randn(64, 48)).backward()
    except Exception as exc:  # noqa: BLE001 - reported in the report header
        return log_failure(f"warm-up compile for {backend}", exc)
    log.info("warm-up compile for %-10s %.2fs", backend, time.perf_counter() - t0)
    return None


def first_call(workload: Workload, backend: str, inputs: Tensors,
               reference: Tensors) -> tuple[Result, Callable[[], Tensors] | None]:
    """Compile (lazily, inside the first call) and run once; time it and check it against eager."""
    res = Result(workload.name, backend)
    try:
        t0 = time.perf_counter()
        step = make_step(workload, compile_for(backend, workload.fn), inputs)
        out = step()
        res.first_call_s = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - reported in the table
        res.check = "error: " + log_failure(f"[{workload.name}] {backend} first call", exc)
        return res, None
    res.check = "reference" if backend == EAGER else compare(out, reference, workload.atol, workload.rtol)
    log.info("[%s] %-10s first call %.2fs, %s", workload.name, backend, res.first_call_s, res.check)
    return res, step


def run_workload(workload: Workload, backends: Sequence[str], repeat: int) -> WorkloadInfo:
    torch.manual_seed(0)
    inputs = workload.make_inputs()
    reference = tuple(t.detach().clone() for t in make_step(workload, workload.fn, inputs)())
    info = WorkloadInfo(workload, ideal_bytes(inputs, reference))
    # One reset per workload, not per backend: all backends' compiled code must stay alive
    # for the interleaved timing (dynamo keeps one cache entry per backend on the code object).
    torch._dynamo.reset()
    steps: dict[str, Callable[[], object]] = {}
    for backend in backends:
        info.results[backend], step = first_call(workload, backend, inputs, reference)
        if step is not None:
            steps[backend] = step
    log.info("[%s] timing %s ...", workload.name, ",".join(steps))
    errors: dict[str, str] = {}
    states, info.background_cores = time_interleaved(steps, repeat, errors)
    for backend, st in states.items():
        res = info.results[backend]
        res.median_s = statistics.median(st.times)
        res.iqr = _spread(st.times) / res.median_s
        res.faults_per_call = st.faults / (len(st.times) * st.inner)
        res.gbps = info.ideal_bytes / res.median_s / 1e9
        log.info("[%s] %-10s median %.3f ms (IQR %.1f%%, %.0f page faults/call)", workload.name, backend,
                 res.median_s * 1e3, res.iqr * 100, res.faults_per_call)
    for backend, err in errors.items():
        info.results[backend].check += "; " + err
    if info.background_cores is not None:
        log.info("[%s] other processes used %.2f cores while timing", workload.name, info.background_cores)
    torch._dynamo.reset()
    return info


# --------------------------------------------------------------------------- #
# Reporting
# --------------------------------------------------------------------------- #


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ratio(res: Result, base: Result | None) -> float | None:
    if base is None or res.median_s is None or base.median_s is None:
        return None
    return res.median_s / base.median_s


def pin_glibc_malloc() -> bool:
    """Fix glibc's mmap threshold at 32 MiB and stop heap trimming (see ``--pin-malloc``)."""
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


def machine_info() -> list[str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return [
        f"- CPU: {cpu}",
        f"- cores: {os.cpu_count()} logical, {usable} usable by this process, torch threads: {torch.get_num_threads()}",
        f"- torch {torch.__version__}, python {platform.python_version()}, {platform.platform()}",
    ]


def render_markdown(infos: Sequence[WorkloadInfo], backends: Sequence[str], repeat: int,
                    command: str, wall_s: float, malloc: str, warmup_errors: dict[str, str | None]) -> str:
    lines = ["# Coil CPU benchmark", "", *machine_info(), f"- glibc malloc: {malloc}",
             f"- command: `{command}`",
             f"- timing: median of {repeat} samples per backend, taken round-robin across backends (each sample "
             f">= {MIN_SAMPLE_S * 1e3:.0f} ms of back-to-back calls, after {WARMUP_CALLS} warm-up calls); "
             f"total wall time {wall_s:.0f}s",
             "- GB/s = ideal bytes (distinct inputs read once + outputs written once) / median time; "
             "'-' for the matmul-bound gpt_block / mlp_train",
             "- vs eager / vs inductor = median time / that backend's median time (lower is better)",
             "- first call s = first call incl. tracing + compile (fresh cache dirs, after one unrelated "
             "warm-up compile per backend)",
             "- faults/call = page faults of the whole process per timed call (fresh memory being touched)",
             "- background cores = CPU used by other processes while timing (from /proc/stat); "
             "if well above 0 the times are contended",
             *(f"- **warm-up compile failed for {b}** (its first-call times include one-time setup): "
               f"{_cell(err)}" for b, err in warmup_errors.items() if err),
             *_contention_warning(infos),
             "", "## Workloads", "", "| workload | description | ideal MiB | background cores |",
             "|---|---|---:|---:|"]
    for info in infos:
        lines.append(f"| {info.workload.name} | {_cell(info.workload.description)} | "
                     f"{info.ideal_bytes / 2**20:.1f} | {_fmt(info.background_cores, '{:.2f}')} |")
    lines += ["", "## Results", "",
              "| workload | backend | median ms | IQR % | GB/s | first call s | vs eager | vs inductor | faults/call "
              "| check |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for info in infos:
        eager, inductor = info.results.get(EAGER), info.results.get(INDUCTOR)
        for backend in backends:
            r = info.results[backend]
            gbps = r.gbps if info.workload.bandwidth_bound else None
            lines.append(
                f"| {info.workload.name} | {backend} | {_fmt(None if r.median_s is None else r.median_s * 1e3, '{:.3f}')}"
                f" | {_fmt(None if r.iqr is None else r.iqr * 100, '{:.1f}')} | {_fmt(gbps, '{:.1f}')}"
                f" | {_fmt(r.first_call_s, '{:.2f}')} | {_fmt(_ratio(r, eager), '{:.2f}')}"
                f" | {_fmt(_ratio(r, inductor), '{:.2f}')} | {_fmt(r.faults_per_call, '{:.0f}')}"
                f" | {_cell(r.check)} |")
    lines += ["", "## Geometric means over workloads where both backends ran and matched eager", "",
              "| backend | time vs eager | time vs inductor | first call vs inductor |", "|---|---:|---:|---:|"]
    for backend in backends:
        first_call_col = "-" if backend == EAGER else _geomean(infos, backend, INDUCTOR, "first_call_s")
        lines.append(f"| {backend} | {_geomean(infos, backend, EAGER, 'median_s')} | "
                     f"{_geomean(infos, backend, INDUCTOR, 'median_s')} | {first_call_col} |")
    return "\n".join(lines) + "\n"


def _geomean(infos: Sequence[WorkloadInfo], backend: str, base: str, attr: str) -> str:
    """Geometric mean of ``attr`` ratios backend/base over workloads where both ran and matched eager."""
    ratios = []
    for info in infos:
        r, b = info.results.get(backend), info.results.get(base)
        if r is not None and b is not None and _passed(r) and _passed(b):
            num, den = getattr(r, attr), getattr(b, attr)
            if num and den:
                ratios.append(num / den)
    if not ratios:
        return "-"
    return f"{math.exp(statistics.fmean(math.log(x) for x in ratios)):.2f} (n={len(ratios)})"


def _contention_warning(infos: Sequence[WorkloadInfo]) -> list[str]:
    worst = max((i.background_cores for i in infos if i.background_cores is not None), default=0.0)
    if worst < CONTENDED_CORES:
        return []
    return ["", f"**WARNING: other processes used up to {worst:.2f} cores while timing; the numbers are "
                "contended.** With every core in use, each OpenMP parallel region can wait for a "
                "descheduled thread, so many-kernel workloads slow down by 10x or more. Rerun on a "
                "quiet machine, or pass `--threads N` with N no more than the idle cores."]


def _passed(r: Result) -> bool:
    return r.median_s is not None and (r.check == "reference" or r.check.startswith("ok"))


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", type=_csv, default=[EAGER, INDUCTOR, "coil"],
                   help="comma-separated: 'eager' or any torch.compile backend name (default: eager,inductor,coil)")
    p.add_argument("--workloads", type=_csv, default=list(WORKLOADS),
                   help="comma-separated subset of: " + ",".join(WORKLOADS) + " (default: all)")
    p.add_argument("--repeat", type=int, default=10, help="timing samples per measurement (default: 10)")
    p.add_argument("--markdown-out", metavar="FILE", help="also write the markdown report to FILE")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads(N) before anything compiles (default: torch's default)")
    p.add_argument("--pin-malloc", action="store_true",
                   help="pin glibc's mmap threshold (32 MiB) and disable heap trimming, so freed "
                        "intermediates are reused without page faults (default: glibc's own behaviour)")
    args = p.parse_args(argv)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    args.backends = list(dict.fromkeys(args.backends))  # drop duplicates, keep order
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # inductor's C++ kernels bake this in at compile time
    malloc = "default (dynamic mmap threshold, heap trimming on)"
    if args.pin_malloc:
        malloc = ("pinned: mmap threshold 32 MiB, trimming off" if pin_glibc_malloc()
                  else "--pin-malloc requested but mallopt() failed; default behaviour")
    start = time.perf_counter()
    saved_env = {var: os.environ.get(var) for var in CACHE_ENV_VARS}
    with tempfile.TemporaryDirectory(prefix="coil-bench-cache-") as cache_root:
        for var in CACHE_ENV_VARS:
            os.environ[var] = os.path.join(cache_root, var.lower())
            os.makedirs(os.environ[var])
        log.info("fresh cache dirs under %s; backends %s; workloads %s",
                 cache_root, ",".join(args.backends), ",".join(args.workloads))
        torch._dynamo.reset()
        warmup_errors = {b: warm_up_backend(b) for b in args.backends}
        infos = [run_workload(WORKLOADS[name], args.backends, args.repeat) for name in args.workloads]
    for var, value in saved_env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    report = render_markdown(infos, args.backends, args.repeat, command, time.perf_counter() - start, malloc,
                             warmup_errors)
    sys.stdout.write(report)
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write(report)
    log.info("done in %.0fs", time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
