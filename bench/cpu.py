"""CPU benchmark: eager vs. ``inductor`` vs. ``coil`` side by side, in one process.

Usage::

    python bench/cpu.py [--backends eager,inductor,coil] [--workloads softmax,layernorm,...]
                        [--repeat N] [--markdown-out FILE] [--json-out FILE] [--threads N]
                        [--pin-malloc] [--no-bandwidth]

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
  tensor read once + every output tensor written once (``ideal_bytes_of``; for the
  training step the outputs are the loss and all parameter gradients).  This is
  only meaningful for bandwidth-bound workloads, so it is shown as ``-`` for the
  matmul-bound GPT block and MLP step (their ideal bytes are still listed in
  the per-workload table, computed the same way).  1 GB = 1e9 bytes.
* ``% of bandwidth`` (its own section, after the results): a bandwidth-bound row's GB/s
  divided by the machine's memory bandwidth measured at the start of the same run, with the
  same thread count, by ``bandwidth.py``: the better of a read (``x.sum()``, bytes =
  numel*4) and a copy (``dst.copy_(src)``, bytes = 2*numel*4, write-allocate traffic not
  counted, as in STREAM) over float32 tensors of at least 4x the L3; median of several calls
  after a warm-up.  ``--no-bandwidth`` skips the measurement (the section says so).
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

``--json-out FILE`` writes every number of the report, the bandwidth measurement included, as
JSON.

This script runs the benchmark; the workloads are in ``cpu_workloads.py``, the interleaved
timing in ``cpu_timing.py``, the bandwidth measurement in ``bandwidth.py`` and the report (the
markdown, its bandwidth section and the JSON) in ``cpu_report.py``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import torch
from bandwidth import measure as measure_bandwidth  # bench/ is on sys.path
from common import CACHE_ENV_VARS, Tensors, cache_env, compare, ideal_bytes_of, log_failure, sample_stats
from cpu_report import (EAGER, INDUCTOR, Result, WorkloadInfo, bandwidth_markdown, render_markdown,
                        report_json, share_of_bandwidth)  # noqa: F401 (share_of_bandwidth: for the tests)
from cpu_timing import time_interleaved
from cpu_workloads import WORKLOADS, Workload, make_step

log = logging.getLogger("bench.cpu")


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


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
    info = WorkloadInfo(workload, ideal_bytes_of(inputs, reference))
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
        stats = sample_stats(st.times)
        res.median_s, res.iqr = stats["median_s"], stats["iqr"]
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
# Entry point
# --------------------------------------------------------------------------- #


def pin_glibc_malloc() -> bool:
    """Fix glibc's mmap threshold at 32 MiB and stop heap trimming (see ``--pin-malloc``)."""
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


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
    p.add_argument("--json-out", metavar="FILE", help="write every number of the report as JSON to FILE")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads(N) before anything compiles (default: torch's default)")
    p.add_argument("--pin-malloc", action="store_true",
                   help="pin glibc's mmap threshold (32 MiB) and disable heap trimming, so freed "
                        "intermediates are reused without page faults (default: glibc's own behaviour)")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip measuring the memory bandwidth (and the '%% of bandwidth' section) for a quick run")
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
    bw = None if args.no_bandwidth else measure_bandwidth()  # once, before anything else runs
    saved_env = {var: os.environ.get(var) for var in CACHE_ENV_VARS}
    with tempfile.TemporaryDirectory(prefix="coil-bench-cache-") as cache_root:
        os.environ.update(cache_env(cache_root))
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
    wall_s = time.perf_counter() - start
    report = render_markdown(infos, args.backends, args.repeat, command, wall_s, malloc, warmup_errors)
    report += "\n".join(bandwidth_markdown(infos, args.backends, bw)) + "\n"
    sys.stdout.write(report)
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write(report)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report_json(infos, args.backends, bw, command=command, repeat=args.repeat, malloc=malloc,
                                  wall_s=wall_s, warmup_errors=warmup_errors), f, indent=1)
    log.info("done in %.0fs", time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
