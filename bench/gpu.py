"""GPU benchmark: eager vs. ``inductor`` vs. ``coil`` side by side, per workload.

Usage::

    python bench/gpu.py [--backends eager,inductor,coil] [--workloads pointwise,softmax_fp32,...]
                        [--quick] [--no-compile-times] [--probe-isolation]
                        [--markdown-out FILE] [--json-out FILE] [--device cuda|cpu] [--smoke]

``--device cpu --smoke`` runs every workload at tiny sizes on the CPU (a smoke test of the
script itself; its numbers mean nothing).  Any registered dynamo backend name works in
``--backends`` (``coil`` needs the package installed so its entry point registers it).  The
workloads are in ``bench/gpu_workloads.py``.  The default run took 170 s on an H200
(2026-11-29); ``--quick`` shortens only the timing, ``--no-compile-times`` saves ~2 min.

How it runs.  This process never touches the device: it spawns workers (``gpu_worker.py``
code, same script) and collects their JSON lines.  A worker that crashes, hangs past
``--worker-timeout`` or poisons its CUDA context costs only the workload it was on; a fresh
worker takes the rest.  Order: compile probes (unless ``--no-compile-times``), then one timing
worker for all workloads.

Columns:

* ``median``: median device time per call over all samples (ms).  CUDA events are recorded
  between consecutive back-to-back calls, so each sample is one call; calls are taken in
  rounds round-robin across backends (5 rounds of ~0.1 s per backend, ``--quick``: 3 of
  ~0.03 s) after 3 warm-up calls.  No L2 flush: every bandwidth-bound workload's data
  (>= 128 MiB) is far larger than the H200's 50-60 MB L2, and the launch-bound ones are host
  bound.  ``launch_chain*`` rows are host wall time per call in µs instead: back-to-back calls
  then one synchronize, per sample.  On cpu, ``perf_counter`` replaces events.
* ``IQR %``: inter-quartile range of the samples relative to the median (a noise gauge).
* ``GB/s``: ideal bytes / median, ideal bytes = each distinct input read once + each output
  written once, written out per workload (1 GB = 1e9 B); blank for matmul-bound and
  launch-bound workloads.  ``TFLOP/s``: matmul FLOPs / median for the GPT block (full T x T
  attention matmuls as computed) and the MLP step (fwd + bwd = 3x fwd).
* ``peak MiB``: torch.cuda peak allocated bytes during one steady-state call minus the bytes
  allocated just before it (inputs, eager reference, other backends' state); so it is the
  call's outputs + temporaries.  A training step's gradients are freed before and count.
* ``cold s`` / ``warm s``: wall time of torch.compile + first call + synchronize in a separate
  process (``--compile-probe``): cold with empty TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and
  COIL_CACHE_DIR, warm in a second process with the dirs the first left; each process first
  compiles one unrelated tiny function (import and initialisation excluded) and runs the
  workload once in eager (cuBLAS etc. initialised).  By default one probe process per backend
  and phase compiles all workloads in sequence, sharing its cache dirs (``--probe-isolation``:
  one process and fresh dirs per workload, strict but ~15x the start-up cost).  The timing
  worker reuses the probes' caches, so its own first calls (``first_call_s`` in the JSON) are
  warm.
* ``vs eager`` / ``vs inductor``: median time / that backend's median (lower is better).
* ``check``: first-call outputs against eager (torch.testing.assert_close with dtype-aware
  tolerances; relative L2 error for the GPT block and MLP step), or the error.

On cuda, float32 matmuls use TF32 (``torch.set_float32_matmul_precision("high")``) for eager
and compiled code alike; only the MLP step has fp32 matmuls.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import logging
import os
import queue
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import torch

import common
import gpu_report
import gpu_worker
from gpu_workloads import FULL, SMOKE, build

log = logging.getLogger("bench.gpu")

EAGER, INDUCTOR = gpu_worker.EAGER, "inductor"
WORKLOAD_NAMES = list(build(SMOKE))
SCRIPT = os.path.abspath(__file__)
EXIT_GRACE_S = 3.0  # keep reading this long after a worker exits


# --------------------------------------------------------------------------- #
# Workers
# --------------------------------------------------------------------------- #


@dataclass
class Outcome:
    """What one worker process reported."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    current: str | None = None  # workload started but not finished
    failure: str | None = None


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def spawn(cmd: Sequence[str], env: dict[str, str], timeout_s: float) -> Outcome:
    """Run one worker, relaying its non-protocol stdout to stderr; kill it after ``timeout_s``
    without a protocol line."""
    log.info("worker: %s", shlex.join(cmd[1:]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    out = Outcome()
    try:
        _read(proc, lines, out, timeout_s)
    finally:
        _kill_session(proc)
    rc = proc.wait()
    if out.failure is None and rc != 0:
        out.failure = f"worker exited with code {rc}" + (
            " (CUDA context unusable)" if rc == gpu_worker.EXIT_POISONED else "")
    return out


def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None], out: Outcome, timeout_s: float) -> None:
    """Consume the worker's stdout until EOF, a stall of ``timeout_s``, or a short grace
    period after the worker exits (orphaned grandchildren may hold the pipe open)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            if proc.poll() is not None:
                deadline = min(deadline, time.monotonic() + EXIT_GRACE_S)
            if time.monotonic() < deadline:
                continue
            if proc.poll() is None:
                out.failure = f"no progress for {timeout_s:.0f}s; worker killed"
            return
        if line is None:
            return
        if line.startswith(gpu_worker.MARKER):
            _record(out, json.loads(line[len(gpu_worker.MARKER):]))
            deadline = time.monotonic() + timeout_s
        else:
            sys.stderr.write(line)


def _kill_session(proc: subprocess.Popen[str]) -> None:
    """Kill what is left of the worker's own session: the worker and its compile workers."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left


def _record(out: Outcome, rec: dict[str, Any]) -> None:
    kind = rec.pop("kind")
    if kind == "env":
        out.env = rec
    elif kind == "start":
        out.current = rec["workload"]
    elif kind == "result":
        out.results[rec["workload"]] = rec
        out.current = None


def run_workers(cmd_for: Callable[[list[str]], list[str]], names: Sequence[str], env: dict[str, str],
                timeout_s: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Results for every workload in ``names``, starting a fresh worker after a failure.

    The workload a failed worker was on is reported as failed and the rest go to a new worker
    (also after a worker exits because its CUDA context is unusable); a worker that failed
    before starting any workload fails all the remaining ones (a retry would fail the same way).
    """
    results: dict[str, dict[str, Any]] = {}
    env_info: dict[str, Any] = {}
    remaining = list(names)
    while remaining:
        out = spawn(cmd_for(remaining), env, timeout_s)
        results.update(out.results)
        env_info = env_info or out.env
        missing = [w for w in remaining if w not in results]
        if not missing:
            break
        failure = out.failure or "worker ended without reporting it"
        if out.current is not None:
            results[out.current] = {"workload": out.current, "error": failure}
        elif out.failure is None or not out.results:
            # a clean exit that skipped workloads, or a failure before any: a retry would do the same
            results.update({w: {"workload": w, "error": failure} for w in missing})
            break
        remaining = [w for w in missing if w not in results]
    return results, env_info


def worker_prefix(args: argparse.Namespace) -> list[str]:
    return [sys.executable, SCRIPT, "--device", args.device, *(["--smoke"] if args.smoke else []),
            *(["--quick"] if args.quick else [])]


def cache_root(base: str, backend: str, workload: str, isolated: bool) -> str:
    """Cache dirs of one backend: shared by all workloads, or per workload with isolation."""
    return os.path.join(base, backend, workload if isolated else "shared")


def run_probes(args: argparse.Namespace, base: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``probes[workload][backend]`` = {"cold": record, "warm": record}."""
    groups = [[w] for w in args.workloads] if args.probe_isolation else [list(args.workloads)]
    probes: dict[str, dict[str, dict[str, Any]]] = {}
    for backend in (b for b in args.backends if b != EAGER):
        for group in groups:
            env = {**os.environ, **common.cache_env(cache_root(base, backend, group[0], args.probe_isolation))}
            for phase in ("cold", "warm"):  # the same dirs: the warm process finds what the cold one left
                log.info("compile probes: %s, %s caches, %d workload(s)", backend, phase, len(group))
                results, _ = run_workers(functools.partial(_probe_cmd, args, backend), group, env,
                                         args.worker_timeout)
                for w, rec in results.items():
                    probes.setdefault(w, {}).setdefault(backend, {})[phase] = rec
    return probes


def _probe_cmd(args: argparse.Namespace, backend: str, workloads: list[str]) -> list[str]:
    return [*worker_prefix(args), "--compile-probe", ",".join(workloads), backend]


def run_timing(args: argparse.Namespace, base: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    def cmd(rest: list[str]) -> list[str]:
        return [*worker_prefix(args), "--timing-worker", "--workloads", ",".join(rest),
                "--backends", ",".join(args.backends), "--cache-base", base,
                *(["--probe-isolation"] if args.probe_isolation else [])]

    return run_workers(cmd, args.workloads, dict(os.environ), args.worker_timeout)


# --------------------------------------------------------------------------- #
# Entry points
# --------------------------------------------------------------------------- #


def orchestrate(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coil-gpu-bench-") as base:
        probes = {} if args.no_compile_times else run_probes(args, base)
        timing, env_info = run_timing(args, base)
    workloads = build(SMOKE if args.smoke else FULL)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
        "env": env_info or {"torch": torch.__version__, "device": args.device},
        "timing": vars(gpu_worker.QUICK_TIMING if args.quick else gpu_worker.FULL_TIMING),
        "sizes": vars(SMOKE if args.smoke else FULL),
        "compile_probes": "off" if args.no_compile_times else (
            "one process per workload" if args.probe_isolation else "one process per backend and phase"),
        "wall_s": time.perf_counter() - start,
    }
    report = gpu_report.Report(meta, [workloads[w] for w in args.workloads], args.backends, timing, probes)
    sys.stdout.write(report.text())
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write(report.markdown())
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report.as_json(), f, indent=1)
    log.info("done in %.0fs", meta["wall_s"])
    return 0


def worker_main(args: argparse.Namespace) -> int:
    if args.smoke and args.device == "cpu":
        torch.set_num_threads(1)  # a smoke test; OpenMP threads crawl on a busy shared machine
    device = gpu_worker.Device(args.device)
    workloads = build(SMOKE if args.smoke else FULL)
    if args.compile_probe:
        names, backend = args.compile_probe
        return gpu_worker.probe_worker([workloads[w] for w in _csv(names)], backend, device)
    cfg = gpu_worker.QUICK_TIMING if args.quick else gpu_worker.FULL_TIMING

    def root(backend: str, workload: str) -> str | None:
        if args.cache_base is None or backend == EAGER:
            return None
        return cache_root(args.cache_base, backend, workload, args.probe_isolation)

    return gpu_worker.timing_worker([workloads[w] for w in args.workloads], args.backends, device, cfg, root)


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--backends", type=_csv, default=[EAGER, INDUCTOR, "coil"],
                   help="comma-separated: 'eager' or any torch.compile backend (default: eager,inductor,coil)")
    p.add_argument("--workloads", type=_csv, default=WORKLOAD_NAMES,
                   help="comma-separated subset of: " + ",".join(WORKLOAD_NAMES) + " (default: all)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="default: cuda")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (for --device cpu smoke tests)")
    p.add_argument("--quick", action="store_true", help="fewer timing samples")
    p.add_argument("--no-compile-times", action="store_true", help="skip the cold/warm compile probes")
    p.add_argument("--probe-isolation", action="store_true",
                   help="one probe process (and fresh cache dirs) per workload instead of per backend")
    p.add_argument("--worker-timeout", type=float, default=180.0,
                   help="kill a worker after this many seconds without progress (default: 180)")
    p.add_argument("--markdown-out", metavar="FILE", help="write the markdown report to FILE")
    p.add_argument("--json-out", metavar="FILE", help="write every raw number as JSON to FILE")
    p.add_argument("--compile-probe", nargs=2, metavar=("WORKLOADS", "BACKEND"),
                   help="(worker) time compile + first call of each workload; cache dirs from the environment")
    p.add_argument("--timing-worker", action="store_true", help="(worker) time --workloads on --backends")
    p.add_argument("--cache-base", help="(worker) cache dirs the probes used, per backend")
    args = p.parse_args(argv)
    unknown = [w for w in args.workloads + (_csv(args.compile_probe[0]) if args.compile_probe else [])
               if w not in WORKLOAD_NAMES]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; choose from {WORKLOAD_NAMES}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("CUDA is not available; use --device cpu (with --smoke) to smoke-test")
    args.backends = list(dict.fromkeys(args.backends))
    args.quick = args.quick or args.smoke
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.compile_probe or args.timing_worker:
        return worker_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
