"""Worker side of the GPU benchmark: the code that runs on the device, inside the subprocesses
``bench/gpu.py`` spawns.  Two jobs:

* ``timing_worker``: for each workload, the eager reference, each backend's first call and
  its check against eager, peak memory of one steady-state call, then timing samples taken
  round-robin across backends.
* ``probe_worker``: one unrelated warm-up compile, then for each workload the wall time of
  ``torch.compile`` + first call + synchronize (the cache dirs come from the environment).

Workers report through stdout lines ``MARKER + json``: ``{"kind": "start", "workload": ...}``
before a workload, ``{"kind": "result", ...}`` after it, ``{"kind": "env", ...}`` once.  If a
backend leaves the CUDA context unusable (a sticky error such as an illegal address) the
worker exits with ``EXIT_POISONED`` after reporting, and the parent starts a fresh worker for
the remaining workloads.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import common
from gpu_workloads import Workload

log = logging.getLogger("bench.gpu")

MARKER = "@@coil-bench@@ "
EXIT_POISONED = 3
EAGER = "eager"

Step = Callable[[], common.Tensors]


@dataclass(frozen=True)
class TimingConfig:
    """How much to time: device-timed workloads take ``rounds`` x (calls filling
    ``round_budget_s``) per backend, one sample per call; host-timed ones take ``host_rounds``
    samples, each the mean of back-to-back calls lasting ``host_sample_s``."""

    rounds: int
    round_budget_s: float
    host_rounds: int
    host_sample_s: float
    warmup_calls: int = 3
    max_calls_per_round: int = 500


FULL_TIMING = TimingConfig(rounds=5, round_budget_s=0.1, host_rounds=15, host_sample_s=0.02)
QUICK_TIMING = TimingConfig(rounds=3, round_budget_s=0.03, host_rounds=7, host_sample_s=0.01)


def emit(record: dict[str, Any]) -> None:
    """One protocol line to the parent (the worker's only stdout output)."""
    print(MARKER + json.dumps(record), flush=True)


# --------------------------------------------------------------------------- #
# The device
# --------------------------------------------------------------------------- #


class Device:
    """What differs between cuda and cpu: synchronisation, per-call time stamps (CUDA events
    or ``perf_counter``), memory statistics and health."""

    def __init__(self, name: str) -> None:
        self.torch = torch.device(name)
        self.is_cuda = self.torch.type == "cuda"
        if self.is_cuda:
            torch.set_float32_matmul_precision("high")  # TF32 matmuls, eager and compiled alike

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize()

    def stamp(self) -> Any:
        if not self.is_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        """Time between two stamps; after ``sync()``."""
        return start.elapsed_time(end) / 1e3 if self.is_cuda else end - start

    def peak_extra_bytes(self, step: Step, inputs: common.Tensors) -> int | None:
        """Peak allocated bytes during one call above what was allocated just before it."""
        if not self.is_cuda:
            return None
        for t in inputs:
            t.grad = None  # a training step's new gradients count as its outputs
        gc.collect()
        self.sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = step()
        self.sync()
        peak = torch.cuda.max_memory_allocated()
        del out
        return peak - base

    def healthy(self) -> bool:
        """False once the CUDA context is unusable (sticky errors poison the whole process)."""
        if not self.is_cuda:
            return True
        try:
            torch.cuda.synchronize()
            return torch.ones(1, device=self.torch).add(1).item() == 2.0
        except Exception:  # noqa: BLE001 - any failure means the context is gone
            return False

    def info(self) -> dict[str, Any]:
        info = {"device": str(self.torch), "torch": torch.__version__, "triton": _triton_version(),
                "python": platform.python_version(), "platform": platform.platform()}
        if self.is_cuda:
            props = torch.cuda.get_device_properties(self.torch)
            info.update(gpu=props.name, sms=props.multi_processor_count, gpu_mem_gib=props.total_memory / 2**30,
                        cuda=torch.version.cuda)
        return info


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return triton.__version__


# --------------------------------------------------------------------------- #
# Steps
# --------------------------------------------------------------------------- #


def compile_for(backend: str, workload: Workload) -> Callable[..., torch.Tensor]:
    if backend == EAGER:
        return workload.fn
    return torch.compile(workload.fn, backend=backend, **workload.compile_kwargs)


def make_step(workload: Workload, fn: Callable[..., torch.Tensor], inputs: common.Tensors) -> Step:
    """The callable that is timed: one call, or one forward + backward training step."""
    if not workload.training:
        def step() -> common.Tensors:
            out = fn(*inputs)
            return out if isinstance(out, tuple) else (out,)
        return step

    params = [t for t in inputs if t.requires_grad]

    def train_step() -> common.Tensors:
        for p in params:
            p.grad = None
        loss = fn(*inputs)
        loss.backward()
        return (loss.detach(), *(p.grad for p in params))  # type: ignore[misc]
    return train_step


@contextlib.contextmanager
def grad_mode(workload: Workload) -> Iterator[None]:
    """no_grad around everything for inference workloads (compile and timing alike)."""
    with contextlib.nullcontext() if workload.training else torch.no_grad():
        yield


@contextlib.contextmanager
def cache_dirs(root: str | None) -> Iterator[None]:
    """Point the cache-dir environment variables into ``root`` (no change for None)."""
    saved = {var: os.environ.get(var) for var in common.CACHE_ENV_VARS}
    if root is not None:
        os.environ.update(common.cache_env(root))
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


# --------------------------------------------------------------------------- #
# Timing worker
# --------------------------------------------------------------------------- #


def timing_worker(workloads: Sequence[Workload], backends: Sequence[str], device: Device,
                  cfg: TimingConfig, cache_root: Callable[[str, str], str | None]) -> int:
    """Measure every workload on every backend; ``cache_root(backend, workload)`` gives the cache dirs."""
    emit({"kind": "env", **device.info()})
    for w in workloads:
        emit({"kind": "start", "workload": w.name})
        try:
            record = measure_workload(w, backends, device, cfg, cache_root)
        except Exception as exc:  # noqa: BLE001 - e.g. eager itself out of memory; reported in the table
            record = {"workload": w.name, "error": common.log_failure(f"[{w.name}] measuring", exc)}
        emit({"kind": "result", **record})
        if not device.healthy():
            log.error("[%s] the CUDA context is unusable; exiting so a fresh worker takes the rest", w.name)
            return EXIT_POISONED
    return 0


def measure_workload(w: Workload, backends: Sequence[str], device: Device, cfg: TimingConfig,
                     cache_root: Callable[[str, str], str | None]) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {b: {} for b in backends}
    record: dict[str, Any] = {"workload": w.name, "results": results}
    with grad_mode(w):
        torch.manual_seed(0)
        inputs = w.make_inputs(device.torch)
        reference = tuple(t.detach().clone() for t in make_step(w, w.fn, inputs)())
        record["counted_ideal_bytes"] = common.ideal_bytes_of(inputs, reference)
        if record["counted_ideal_bytes"] != w.ideal_bytes:
            log.warning("[%s] ideal bytes formula %d != %d counted from the tensors", w.name, w.ideal_bytes,
                        record["counted_ideal_bytes"])
        torch._dynamo.reset()  # once per workload: every backend's compiled code stays alive for timing
        steps: dict[str, Step] = {}
        for b in backends:
            with cache_dirs(cache_root(b, w.name)):
                step = first_call(w, b, inputs, reference, device, results[b])
            if step is not None:
                steps[b] = step
            if not device.healthy():
                return record
        time_steps(w, steps, inputs, device, cfg, results)
        del steps, inputs, reference
    torch._dynamo.reset()
    gc.collect()
    if device.is_cuda:
        torch.cuda.empty_cache()
    return record


def first_call(w: Workload, backend: str, inputs: common.Tensors, reference: common.Tensors,
               device: Device, res: dict[str, Any]) -> Step | None:
    """Compile (lazily, inside the first call), run once, check against eager."""
    try:
        t0 = time.perf_counter()
        step = make_step(w, compile_for(backend, w), inputs)
        out = step()
        device.sync()
        res["first_call_s"] = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - reported in the table
        res["error"] = common.log_failure(f"[{w.name}] {backend} first call", exc)
        return None
    res["check"] = "reference" if backend == EAGER else common.compare(out, reference, w.atol, w.rtol, w.norm_tol)
    log.info("[%s] %-10s first call %.2fs, %s", w.name, backend, res["first_call_s"], res["check"])
    return step


def time_steps(w: Workload, steps: dict[str, Step], inputs: common.Tensors, device: Device,
               cfg: TimingConfig, results: dict[str, dict[str, Any]]) -> None:
    """Warm up, measure peak memory, then sample every step round-robin; fills ``results``."""
    ready: dict[str, tuple[Step, int]] = {}
    budget = cfg.host_sample_s if w.host_timed else cfg.round_budget_s
    for b, step in steps.items():
        try:
            for _ in range(cfg.warmup_calls):
                step()
            results[b]["peak_extra_bytes"] = device.peak_extra_bytes(step, inputs)
            ready[b] = (step, calls_for(step, device, budget, None if w.host_timed else cfg.max_calls_per_round))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            results[b]["error"] = "warm-up: " + common.log_failure(f"[{w.name}] {b} warm-up", exc)
    sampler = sample_host if w.host_timed else sample_device
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        samples = sampler(ready, device, cfg, results)
    finally:
        if gc_was_enabled:
            gc.enable()
    for b, times in samples.items():
        if times:
            results[b].update(common.sample_stats(times))
            log.info("[%s] %-10s median %.4f ms (IQR %.1f%%, n=%d)", w.name, b, results[b]["median_s"] * 1e3,
                     results[b]["iqr"] * 100, len(times))


def calls_for(step: Step, device: Device, budget_s: float, cap: int | None) -> int:
    """How many back-to-back calls fill ``budget_s`` (at least 1, at most ``cap``)."""
    device.sync()
    t0 = time.perf_counter()
    for _ in range(2):
        step()
    device.sync()
    per_call = max((time.perf_counter() - t0) / 2, 1e-7)
    n = max(1, round(budget_s / per_call))
    return n if cap is None else min(n, cap)


def sample_device(ready: dict[str, tuple[Step, int]], device: Device, cfg: TimingConfig,
                  results: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
    """Device time of each call (consecutive stamps), ``cfg.rounds`` rounds across backends."""
    samples: dict[str, list[float]] = {b: [] for b in ready}
    for _ in range(cfg.rounds):
        for b, (step, n) in list(ready.items()):
            try:
                stamps = [device.stamp()]
                for _ in range(n):
                    step()
                    stamps.append(device.stamp())
                device.sync()
                samples[b] += [device.seconds(s, e) for s, e in zip(stamps, stamps[1:])]
            except Exception as exc:  # noqa: BLE001 - reported in the table
                results[b]["error"] = "timing: " + common.log_failure(f"{b} timing", exc)
                del ready[b], samples[b]
    return samples


def sample_host(ready: dict[str, tuple[Step, int]], device: Device, cfg: TimingConfig,
                results: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
    """Host wall time per call: n back-to-back calls then one synchronize, per sample."""
    samples: dict[str, list[float]] = {b: [] for b in ready}
    for _ in range(cfg.host_rounds):
        for b, (step, n) in list(ready.items()):
            try:
                device.sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    step()
                device.sync()
                samples[b].append((time.perf_counter() - t0) / n)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                results[b]["error"] = "timing: " + common.log_failure(f"{b} timing", exc)
                del ready[b], samples[b]
    return samples


# --------------------------------------------------------------------------- #
# Compile-time probe worker
# --------------------------------------------------------------------------- #


def probe_worker(workloads: Sequence[Workload], backend: str, device: Device) -> int:
    """Time torch.compile + first call + synchronize of each workload, after one warm-up compile."""
    emit({"kind": "env", **device.info()})
    warm_up_error = warm_up(backend, device)
    for w in workloads:
        emit({"kind": "start", "workload": w.name})
        record: dict[str, Any] = {"workload": w.name, "backend": backend}
        if warm_up_error:
            record["warm_up_error"] = warm_up_error
        with grad_mode(w):
            record.update(probe_one(w, backend, device))
        emit({"kind": "result", **record})
        if not device.healthy():
            return EXIT_POISONED
    return 0


def warm_up(backend: str, device: Device) -> str | None:
    """Compile and run (fwd + bwd) one small unrelated function, so one-time import and
    initialisation costs are not charged to the first workload."""
    def unrelated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (torch.cos(a) * b + a.exp()).sum(dim=1).mean()

    t0 = time.perf_counter()
    try:
        torch._dynamo.reset()
        a = torch.randn(64, 48, device=device.torch, requires_grad=True)
        torch.compile(unrelated, backend=backend)(a, torch.randn(64, 48, device=device.torch)).backward()
        device.sync()
    except Exception as exc:  # noqa: BLE001 - reported with every probe of this worker
        return common.log_failure(f"warm-up compile for {backend}", exc)
    log.info("warm-up compile for %s: %.2fs", backend, time.perf_counter() - t0)
    return None


def probe_one(w: Workload, backend: str, device: Device) -> dict[str, Any]:
    """One eager call first (library initialisation such as cuBLAS handles is not compile time)."""
    torch.manual_seed(0)
    try:
        inputs = w.make_inputs(device.torch)
        make_step(w, w.fn, inputs)()
        device.sync()
        torch._dynamo.reset()
        t0 = time.perf_counter()
        make_step(w, compile_for(backend, w), inputs)()
        device.sync()
        seconds = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"error": common.log_failure(f"[{w.name}] {backend} compile probe", exc)}
    finally:
        torch._dynamo.reset()
    log.info("[%s] %s compile + first call %.2fs", w.name, backend, seconds)
    return {"compile_s": seconds}
