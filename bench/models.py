"""Model benchmark: the zoo of ``tests/models`` (timm, torchvision, transformers, random
weights, no downloads) through eager, ``inductor`` and ``coil``: time per call, compile time
and accuracy against eager.

Usage::

    python bench/models.py [--device cuda|cpu] [--size small|real] [--models a,b]
                           [--modes infer,infer-bf16,train] [--backends eager,inductor,coil]
                           [--accuracy-only] [--json-out FILE] [--markdown-out FILE]
                           [--timeout 900] [--tf32] [--float64-truth] [--jobs 1]

Each (model, mode, compiled backend) runs in its own subprocess with fresh, empty Inductor /
Triton / Coil cache directories (cold compiles; a crash or hang costs that worker only): eager
first, as the reference, then the one compiled backend, each on a deep copy of the same
randomly initialised model (the same seed in every worker). So every backend starts from the
same process history, which the caching allocator's block layout, and with it ``peak MiB``,
depends on; ``--one-process`` runs all the backends of a pair in one worker, in turn, as
before. The eager figures are the first worker's. Per backend:

* ``compile s``: wall time of the first call (``torch.compile`` + Dynamo + the backend's
  compile + one run, synchronised); for eager, its plain first call.
* ``ms``: median time of one call over ``--iters`` calls after 2 warm-up calls — CUDA events
  around each call on cuda, ``perf_counter`` (after a synchronize) on cpu.  Modes:
  ``infer`` float32 forward in ``eval()`` under ``no_grad``; ``infer-bf16`` the same under
  ``torch.autocast(device, torch.bfloat16)``; ``train`` one step (zero_grad, forward with
  labels, the model's loss, backward, SGD step) in ``train()`` mode; ``train-bf16`` the same
  with the forward and loss under bf16 autocast; ``infer-f64`` and ``train-f64`` (not run by
  default) are ``infer`` and ``train`` with the model and its inputs in float64, judged at
  float64's tolerance (``check.FP64``): where float32 training is ill-conditioned (eager's
  own float32 gradients far from float64's), they still check a compiler to many digits.
* ``peak MiB``: on cuda, the most memory allocated during the timed calls above what was
  allocated before the first call (activations, workspaces, gradients, and what a backend
  keeps between calls, such as a CUDA graph's static inputs and outputs; not the model's
  weights). A CUDA graph's private pool is reserved, not allocated, between replays: the JSON
  record's ``reserved_mib`` (growth of reserved memory since before the first call) shows it,
  for every backend alike.
  ``requested_peak_mib`` is the same peak in the bytes the program requested, before the
  allocator rounds them (see ``_requested_bytes``).
* Coil's JSON record also holds ``coil_stages``: seconds per compile stage summed over the
  graphs of the first call, with the graph and kernel counts and the binaries the first
  call built (``kernel_builds``; on the GPU each is a ``triton.compile``). ``--keep-tuning
  DIR`` keeps each worker's Triton tuning results (timings of every candidate) and kernel
  sources.
* ``cos``: accuracy of the first call against eager's, by cosine similarity (``cos`` is the
  smallest over the outputs; in ``train`` over the loss and every parameter gradient of the
  first step), plus the verdict of ``tests/models/check.py``'s tolerances (float32:
  max abs diff <= 1e-5 + 1e-3 * max|eager| and cosine >= 0.999; bf16 autocast: 1e-2 +
  5e-2 * max|eager| and cosine >= 0.99); ``wrong`` counts the tensors outside them. In the
  bf16 modes the worker first runs the same call eagerly in float32 and judges each wrong
  tensor against it (``check.against_float32``): ``worse`` counts those whose relative error
  is more than twice eager bf16's (or 1e-3), ``noise`` those where eager bf16 is itself more
  than 25% off float32 (nothing can be said); the rest are no further from float32 than
  eager's own bf16 rounding. ``--float64-truth`` judges the float32 modes the same way, by
  the call in float64.

Sizes: ``real`` is images 64x3x224x224 and text 16x512 at published widths (see
``tests/models/zoo.py``); ``small`` is the CI shape (a smoke test of this script).  Float32
matmuls run at full precision unless ``--tf32``.  Needs torch >= 2.11, timm, transformers and
torchvision importable.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import common

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from models import check, zoo  # noqa: E402  (tests/models, put on sys.path above)

log = logging.getLogger("bench.models")

MARKER = "@@coil-models@@ "
MODES = ("infer", "infer-bf16", "train", "train-bf16")
#: Not run by default: the model, its inputs and every backend in float64, judged at float64's
#: tolerance (``check.FP64``). A model whose float32 training is ill-conditioned (eager's own
#: float32 gradients far from float64's) is still checked to a few digits there.
F64_MODES = ("infer-f64", "train-f64")
EAGER = "eager"


# --------------------------------------------------------------------------- #
# Worker: one model, one mode, every backend
# --------------------------------------------------------------------------- #


def emit(record: dict[str, Any]) -> None:
    print(MARKER + json.dumps(record), flush=True)


class Clock:
    """Per-call time: CUDA events on cuda, ``perf_counter`` after a synchronize on cpu."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_call(self, fn: Callable[[], Any]) -> float:
        """Seconds one call of ``fn`` takes on the device."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def _grad_context(mode: str) -> contextlib.AbstractContextManager[Any]:
    return torch.enable_grad() if mode.startswith("train") else torch.no_grad()


def _autocast(mode: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if mode.endswith("-bf16"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _in_float64(built: zoo.Built) -> zoo.Built:
    """``built`` with its model, floating inputs and training arguments in float64."""
    wide = check.widen
    return dataclasses.replace(built, model=copy.deepcopy(built.model).double(),
                               args=tuple(wide(a) for a in built.args),
                               kwargs={k: wide(v) for k, v in built.kwargs.items()},
                               train_kwargs={k: wide(v) for k, v in built.train_kwargs.items()})


def make_step(built: zoo.Built, mode: str, backend: str, device: torch.device
              ) -> tuple[Callable[[], list[tuple[str, torch.Tensor]]], torch.nn.Module]:
    """A call of ``mode`` on a fresh copy of the model through ``backend``; it returns the
    tensors to compare with eager (outputs, or loss and gradients)."""
    model = copy.deepcopy(built.model)
    model.train(mode.startswith("train"))
    fn = model if backend == EAGER else torch.compile(model, backend=backend)
    if not mode.startswith("train"):
        def infer() -> list[tuple[str, torch.Tensor]]:
            with torch.no_grad(), _autocast(mode, device):
                return list(check.flatten_output(fn(*built.args, **built.kwargs)))
        return infer, model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kwargs = {**built.kwargs, **built.train_kwargs}

    def train() -> list[tuple[str, torch.Tensor]]:
        opt.zero_grad(set_to_none=True)
        with _autocast(mode, device):
            loss = built.loss_fn(fn(*built.args, **kwargs))
        loss.backward()
        grads = [(f"grad.{n}", p.grad) for n, p in model.named_parameters() if p.grad is not None]
        opt.step()
        return [("loss", loss.detach()), *grads]
    return train, model


def accuracy(actual: list[tuple[str, torch.Tensor]], expected: list[tuple[str, torch.Tensor]],
             tol: check.Tolerance, truth: list[tuple[str, torch.Tensor]] | None = None) -> dict[str, Any]:
    """Smallest cosine, wrong-tensor count and the first wrong names, against eager; with
    ``truth`` (the step in float32, for bf16 modes; in float64 with ``--float64-truth``) also
    ``worse``: the wrong tensors that are not as accurate against it as eager's, and ``noise``
    (``check.against_float32``)."""
    got = dict(actual)
    diffs = [check.compare(name, got.get(name), ref, tol) for name, ref in expected]
    cosines = [d.cosine for d in diffs if not math.isnan(d.cosine)]
    wrong = [d for d in diffs if not d.ok]
    out = {"min_cos": min(cosines, default=None), "wrong": len(wrong), "compared": len(diffs),
           "first_wrong": [d.describe() for d in wrong[:5]]}
    if truth is not None:
        eager, true = dict(expected), dict(truth)
        verdicts = {d.name: check.against_float32(got[d.name], eager[d.name], true[d.name])
                    if isinstance(got.get(d.name), torch.Tensor) and d.name in true else "worse" for d in wrong}
        worse = [d for d in wrong if verdicts[d.name] == "worse"]
        out.update({"worse": len(worse), "noise": sum(v == "noise" for v in verdicts.values()),
                    "first_worse": [d.describe() for d in worse[:5]]})
    return out


def run_backend(built: zoo.Built, mode: str, backend: str, device: torch.device, clock: Clock,
                reference: list[tuple[str, torch.Tensor]] | None, iters: int, accuracy_only: bool,
                truth: list[tuple[str, torch.Tensor]] | None = None
                ) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """First call (compile), accuracy against ``reference`` (and ``truth``), then timing."""
    step, model = make_step(built, mode, backend, device)
    with _grad_context(mode), _coil_stages(backend) as stages:
        clock.sync()
        if device.type == "cuda":  # weights and inputs; what a backend keeps after compiling counts
            base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            base_requested = _requested_bytes("current")
        t0 = time.perf_counter()
        first = step()
        clock.sync()
        record: dict[str, Any] = {"compile_s": time.perf_counter() - t0}
        if backend == "coil":
            record["coil_stages"] = stages()
        # Detached copies: the training step's next zero_grad drops these gradients.
        first = [(n, t.detach().clone()) for n, t in first]
        if reference is not None:
            tol = (check.BF16_AUTOCAST if mode.endswith("-bf16") else
                   check.FP64 if mode.endswith("-f64") else check.FP32)
            record.update(accuracy(first, reference, tol, truth))
        if not accuracy_only:
            with _timing_lock():
                for _ in range(2):
                    step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                samples = [clock.time_call(step) for _ in range(iters)]
                if device.type == "cuda":
                    record["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                    record["reserved_mib"] = (torch.cuda.memory_reserved() - base_reserved) / 2**20
                    record["requested_peak_mib"] = (_requested_bytes("peak") - base_requested) / 2**20
            record.update({"median_ms": 1e3 * statistics.median(samples),
                           "min_ms": 1e3 * min(samples), "iters": iters})
    del model
    return record, first


def _requested_bytes(which: str) -> int:
    """The caching allocator's count of bytes the program asked for (``current`` or
    ``peak``), before its rounding: a block is rounded up to 512 bytes, and a free block
    larger than a request is handed out whole unless more than 1 MiB would remain, so what
    ``max_memory_allocated`` counts depends on which segments the process's earlier
    allocations left (the record's ``peak_mib``)."""
    return int(torch.cuda.memory_stats().get(f"requested_bytes.all.{which}", 0))


@contextlib.contextmanager
def _coil_stages(backend: str) -> Any:
    """For ``coil``: a function returning the seconds per compile stage summed over the
    graphs compiled inside, plus the graph and kernel counts (``coil.explain``'s figures).
    Call it after the first call: a graph's first-run stages fill in once it has run."""
    if backend != "coil":
        yield dict
        return
    from coil.compile import add_observer, remove_observer
    from coil.sdk import cachestats
    reports: list[Any] = []
    before = cachestats.snapshot()

    def totals() -> dict[str, float]:
        out: dict[str, float] = {}
        for report in reports:
            for stage, seconds in report.stage_seconds.items():
                out[stage] = out.get(stage, 0.0) + seconds
        out["graphs"], out["kernels"] = len(reports), sum(len(r.kernels) for r in reports)
        # binaries built (a miss of Triton's cache) or found, in this process
        counts = cachestats.snapshot() - before
        out["kernel_builds"], out["kernel_build_hits"] = counts.get("kernel", "miss"), counts.get("kernel", "hit")
        return out

    add_observer(reports.append)
    try:
        yield totals
    finally:
        remove_observer(reports.append)


@contextlib.contextmanager
def _timing_lock() -> Any:
    """With ``--jobs`` above 1, workers compile at once but time one at a time (a file lock):
    timed calls never share the device with another worker's timed calls."""
    path = os.environ.get("BENCH_MODELS_TIMING_LOCK")
    if not path:
        yield
        return
    import fcntl
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def worker(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    # cuDNN convolutions default to TF32: eager and a compiled model would then differ by
    # TF32 rounding wherever their convolutions get inputs of other strides
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    clock = Clock(device)
    with device:
        built = zoo.build(args.model, args.size)
    params = sum(p.numel() for p in built.model.parameters())
    emit({"kind": "info", "params": params, "torch": torch.__version__})
    reference = None
    truth = None
    if args.mode.endswith("-bf16"):  # the same first call in float32, eager: what bf16 rounds
        torch._dynamo.reset()
        _, truth = run_backend(built, args.mode.removesuffix("-bf16"), EAGER, device, clock, None, 0, True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    elif args.mode.endswith("-f64"):  # the model itself in float64; eager's float64 run is the reference
        built = _in_float64(built)
    elif args.float64_truth:  # the same first call in float64, eager: what float32 rounds
        torch._dynamo.reset()
        _, truth = run_backend(_in_float64(built), args.mode, EAGER, device, clock, None, 0, True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    backends = [EAGER] + [b for b in args.backends.split(",") if b != EAGER]
    for backend in backends:
        emit({"kind": "start", "backend": backend})
        torch._dynamo.reset()
        try:
            record, outputs = run_backend(built, args.mode, backend, device, clock, reference,
                                          args.iters, args.accuracy_only, truth)
        except Exception as exc:  # noqa: BLE001 - a backend's failure is its result
            record, outputs = {"error": common.log_failure(f"{args.model} {args.mode} {backend}", exc)}, None
            if backend == EAGER:
                emit({"kind": "result", "backend": backend, **record})
                return 1
        if backend == EAGER:
            reference = outputs
        emit({"kind": "result", "backend": backend, **record})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


# --------------------------------------------------------------------------- #
# Parent: one subprocess per (model, mode), then the table
# --------------------------------------------------------------------------- #


def spawn(args: argparse.Namespace, model: str, mode: str, backends: str) -> dict[str, Any]:
    """Run one worker with cold cache dirs; its results by backend (an ``error`` entry for a
    backend it did not finish)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--modes", mode,
           "--device", args.device, "--size", args.size, "--backends", backends,
           "--iters", str(args.iters)] + (["--accuracy-only"] if args.accuracy_only else []) + (
           ["--tf32"] if args.tf32 else []) + (["--float64-truth"] if args.float64_truth else [])
    root = tempfile.mkdtemp(prefix="coil-models-")
    env = {**os.environ, **common.cache_env(root)}
    if args.jobs > 1:
        env["BENCH_MODELS_TIMING_LOCK"] = args.lock_path
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    failure = None
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        failure = f"timed out after {args.timeout} s"
    finally:
        if args.keep_tuning:  # the autotuner's results and the kernels they are of
            coil_cache = os.path.join(root, "coil_cache_dir")
            for part in ("triton-autotune", "triton-source"):
                if os.path.isdir(os.path.join(coil_cache, part)):
                    shutil.copytree(os.path.join(coil_cache, part),
                                    os.path.join(args.keep_tuning, f"{model}-{mode}", part), dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)
    results: dict[str, Any] = {"backends": {}}
    current = None
    for line in out.splitlines():
        if not line.startswith(MARKER):
            print(line, file=sys.stderr)
            continue
        rec = json.loads(line[len(MARKER):])
        kind = rec.pop("kind")
        if kind == "info":
            results.update(rec)
        elif kind == "start":
            current = rec["backend"]
        else:
            results["backends"][rec.pop("backend")] = rec
            current = None
    if failure is None and proc.returncode not in (0, 1):
        failure = f"worker exited with {proc.returncode}"
    if current is not None:
        results["backends"][current] = {"error": failure or "worker died"}
    return results


def table(records: Sequence[dict[str, Any]], backends: Sequence[str]) -> list[str]:
    compiled = [b for b in backends if b != EAGER]
    header = ["model", "mode", *(f"{b} ms" for b in backends), *(f"{b} compile s" for b in compiled),
              *(f"{b} peak MiB" for b in backends), *(f"{b} cos" for b in compiled), "notes"]
    rows = []
    for rec in records:
        res = rec["backends"]
        notes = []
        for b in backends:
            r = res.get(b, {})
            if "error" in r:
                notes.append(f"{b}: {r['error']}")
            elif r.get("wrong"):
                note = f"{b}: {r['wrong']}/{r['compared']} wrong, first {r['first_wrong'][0]}"
                if "worse" in r:
                    truth = "float32" if rec["mode"].endswith("-bf16") else "float64"
                    note += (f"; against {truth}: {r['wrong'] - r['worse'] - r['noise']} as accurate as eager, "
                             f"{r['noise']} where eager itself is >25% off, {r['worse']} worse"
                             + (f" (first {r['first_worse'][0]})" if r["worse"] else ""))
                notes.append(note)
        rows.append([rec["model"], rec["mode"],
                     *(common.fmt(res.get(b, {}).get("median_ms"), "{:.2f}") for b in backends),
                     *(common.fmt(res.get(b, {}).get("compile_s"), "{:.1f}") for b in compiled),
                     *(common.fmt(res.get(b, {}).get("peak_mib"), "{:.0f}") for b in backends),
                     *(common.fmt(res.get(b, {}).get("min_cos"), "{:.4f}") for b in compiled),
                     "; ".join(notes)])
    right = [False, False] + [True] * (2 * len(backends) + 2 * len(compiled)) + [False]
    return common.markdown_table(header, rows, right)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   choices=("cuda", "cpu"))
    p.add_argument("--size", default="real", choices=zoo.SIZES)
    p.add_argument("--models", default=",".join(zoo.names()),
                   help="comma-separated: " + ", ".join(zoo.names()))
    p.add_argument("--modes", "--mode", default=",".join(MODES),
                   help="comma-separated: " + ", ".join(MODES + F64_MODES))
    p.add_argument("--backends", default="eager,inductor,coil")
    p.add_argument("--accuracy-only", action="store_true", help="first calls only: compile time and accuracy")
    p.add_argument("--iters", type=int, default=10, help="timed calls per backend (after 2 warm-up calls)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per worker")
    p.add_argument("--tf32", action="store_true", help="float32 matmuls in TF32 (eager and compiled)")
    p.add_argument("--float64-truth", action="store_true",
                   help="float32 modes: also run the first call eagerly in float64 and judge each tensor "
                        "outside the tolerance by it, as bf16 modes are judged by float32")
    p.add_argument("--keep-tuning", metavar="DIR",
                   help="copy each worker's Triton tuning results and kernel sources to DIR/<model>-<mode>")
    p.add_argument("--json-out", help="write the results as JSON here")
    p.add_argument("--markdown-out", help="write the table here too")
    p.add_argument("--jobs", type=int, default=1,
                   help="workers at once: they compile in parallel and take turns for the timed "
                        "calls (compile times then include contention for the CPUs)")
    p.add_argument("--one-process", action="store_true",
                   help="all backends of a (model, mode) in one worker, in turn (default: one "
                        "worker per compiled backend, each after its own eager reference)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    unknown = [m for m in args.models.split(",") if m not in zoo.REGISTRY]
    bad_modes = [m for m in args.modes.split(",") if m not in MODES + F64_MODES]
    if unknown or bad_modes:
        p.error(f"unknown models {unknown} (known: {', '.join(zoo.names())}) or modes {bad_modes} "
                f"(known: {', '.join(MODES + F64_MODES)})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    if args.worker:
        args.mode = args.modes  # the parent passes one mode
        return worker(args)
    backends = [EAGER] + [b for b in args.backends.split(",") if b != EAGER]
    pairs = [(model, mode) for model in args.models.split(",") for mode in args.modes.split(",")]
    groups = [",".join(backends)] if args.one_process or len(backends) == 1 else [
        f"{EAGER},{b}" for b in backends[1:]]
    units = [(model, mode, group) for model, mode in pairs for group in groups]
    # a lock given in the environment is shared with other processes that time (profilers)
    args.lock_path = os.environ.get("BENCH_MODELS_TIMING_LOCK") or os.path.join(
        tempfile.mkdtemp(prefix="coil-bench-lock-"), "timing.lock")
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    records: list[dict[str, Any]] = []

    def run(unit: tuple[str, str, str]) -> dict[str, Any]:
        t0 = time.perf_counter()
        rec = {"model": unit[0], "mode": unit[1], **spawn(args, *unit)}
        rec["wall_s"] = time.perf_counter() - t0
        log.info("%s %s (%s): %.0f s", unit[0], unit[1], unit[2], rec["wall_s"])
        return rec

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for rec in pool.map(run, units):
            into = merged.setdefault((rec["model"], rec["mode"]), {**rec, "backends": {}, "wall_s": 0.0})
            for backend, result in rec["backends"].items():  # eager: the first worker's
                into["backends"].setdefault(backend, result)
            into["wall_s"] += rec["wall_s"]
            records = list(merged.values())
            if args.json_out:  # rewritten after every worker: a killed run keeps what it measured
                with open(args.json_out, "w") as f:
                    json.dump({"device": args.device, "size": args.size, "torch": torch.__version__,
                               "jobs": args.jobs, "records": records}, f, indent=1)
    lines = table(records, backends)
    print("\n".join(lines))
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
