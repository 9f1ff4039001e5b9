"""The autotuner's memory and its clock.

Winners are kept on disk, one small JSON file per (kernel source, GPU, versions, size
bucket) key in Coil's disk cache (checked on read, size-capped), so a second process
compiles only the winner and tunes nothing. Timing is injected (``bench``), so the
selection logic is tested without a GPU; on the GPU it is CUDA-event timing of a few
launches."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import traceback
from typing import Any, Callable, Iterator, Sequence

import torch

import coil.sdk as sdk
from coil.sdk.diskcache import DiskCache

from .configs import Config

log = logging.getLogger(__name__)

#: Enters every key: raise it when the format of a stored winner changes.
CACHE_FORMAT = "diskcache-1"


def cache_key(source: str, device_name: str, versions: str, bucket: tuple[int, ...] | None,
              options: str = "") -> str:
    text = "\n".join([source, device_name, versions, repr(bucket), options, CACHE_FORMAT])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class TuneCache:
    """Winning configurations in Coil's disk cache (:mod:`coil.sdk.diskcache`): written
    atomically, checked when read (a damaged file is set aside with a warning and the kernel
    tuned again), and evicted with the rest of the cache."""

    def __init__(self, folder: str | None = None) -> None:
        self.store = DiskCache(folder, layer="autotune") if folder else \
            DiskCache.in_namespace("triton-autotune", layer="autotune")
        self.folder = str(self.store.folder)
        #: Keys looked up before (a launcher asks before its first build and again at its
        #: first launch): each counts once as a hit or a miss.
        self._asked: set[str] = set()

    def get(self, key: str) -> Config | None:
        data = self.store.read(key, ".json", count=key not in self._asked)
        self._asked.add(key)
        if data is None:
            return None
        try:
            return Config(**json.loads(data)["config"])
        except (ValueError, KeyError, TypeError) as exc:  # intact, but from another Config
            log.warning("coil: tuning result %s does not fit this Coil (%s); tuning again",
                        self.store.path(key, ".json"), exc)
            return None

    def put(self, key: str, config: Config, timings: dict[str, float], kernel: str) -> None:
        data = {"kernel": kernel, "config": config.__dict__, "timings_ms": timings}
        self.store.write(key, ".json", json.dumps(data, indent=1).encode())


def _failed(cfg: Config, exc: Exception) -> str:
    """Logs a candidate that failed, with where it failed (the innermost frame), and returns
    the line for the error raised when every candidate fails."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    line = f"{cfg}: {type(exc).__name__}: {exc}{where}"
    log.info("coil: config %s", line)
    return line


def select(configs: Sequence[Config], run: Callable[[Config], Callable[[], None]],
           bench: Callable[[Callable[[], None]], float]) -> tuple[Config, dict[str, float]]:
    """The fastest configuration: ``run(cfg)`` gives a no-argument launch, ``bench`` times it
    in milliseconds. A configuration that fails to launch is skipped (and reported)."""
    timings: dict[str, float] = {}
    failures: list[str] = []
    best: tuple[float, Config] | None = None
    for cfg in configs:
        try:
            ms = bench(run(cfg))
        except Exception as exc:  # e.g. out of shared memory or registers for this config
            failures.append(_failed(cfg, exc))
            continue
        timings[str(cfg)] = ms
        if best is None or ms < best[0]:
            best = (ms, cfg)
    if best is None:
        raise sdk.KernelCompileError("<autotune>", "every candidate configuration failed:\n" + "\n".join(failures))
    return best[1], timings


def select_interleaved(configs: Sequence[Config], run: Callable[[Config], Callable[[], None]],
                       bench: Callable[[Callable[[], None]], float], rounds: int = 5,
                       warm_ms: float = 0.0) -> tuple[Config, dict[str, float]]:
    """The configuration with the lowest median of ``rounds`` samples, the candidates taking
    turns (A, B, C, A, B, C...) so that a device's clocks changing during the measurement
    weigh on all of them alike. Before the first sample the first candidate keeps the device
    busy for ``warm_ms`` of the host's clock: a GPU idle at the start of a process
    runs at low clocks for milliseconds, which on the H200 made every candidate of a
    template kernel measure 3-5x its steady-state time. ``bench`` times a call in ms and
    waits for the device. A
    candidate that fails is skipped (and reported)."""
    calls: dict[Config, Callable[[], None]] = {}
    failures: list[str] = []
    for cfg in configs:
        try:
            call = run(cfg)
            call()
            calls[cfg] = call
        except Exception as exc:  # e.g. out of shared memory or registers for this config
            failures.append(_failed(cfg, exc))
    if not calls:
        raise sdk.KernelCompileError("<autotune>", "every candidate configuration failed:\n" + "\n".join(failures))
    first, tries, t0 = next(iter(calls.values())), 0, time.perf_counter()
    while (time.perf_counter() - t0) * 1000 < warm_ms and tries < 1000:
        bench(first)  # synchronises: the host's clock is the device's here
        tries += 1
    samples: dict[Config, list[float]] = {cfg: [] for cfg in calls}
    for _ in range(rounds):
        for cfg, call in calls.items():
            samples[cfg].append(bench(call))
    medians = {cfg: sorted(s)[len(s) // 2] for cfg, s in samples.items()}
    return min(medians, key=medians.__getitem__), {str(cfg): ms for cfg, ms in medians.items()}


#: GPU cycles (about 1 ms on an H200) a timing with ``hold`` holds the stream with
#: ``torch.cuda._sleep`` before its first sample, so every sample is queued before the device
#: reaches it: the samples then time the device alone. Without it, a call whose host work
#: outlasts its kernels (ATen's GEMM and an epilogue launch, from Python) charged the GPU's
#: idle time between its launches to that candidate, and a template won measurements it lost
#: in the model (ViT-tiny's fc1 + GELU: 37 us against 28 us for cuBLAS and a GELU kernel).
#: A single raw launch has no such gap worth the millisecond: kernel tuning does not hold.
HOLD_CYCLES = 2_000_000


def cuda_bench(fn: Callable[[], None], reps: int = 5, hold: bool = False) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream, after one warm-up launch;
    with ``hold``, device time alone (the samples queue behind a short spin,
    :data:`HOLD_CYCLES`)."""
    fn()
    if hold:
        torch.cuda._sleep(HOLD_CYCLES)
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return times[len(times) // 2]


def wall_bench(fn: Callable[[], None], reps: int = 1) -> float:
    """Milliseconds of ``fn`` by the host clock (the interpreter, CPU tensors)."""
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1000 / reps


@contextlib.contextmanager
def trial_args(args: Sequence[Any], mutated: Sequence[int]) -> Iterator[list[Any]]:
    """``args`` for tuning runs, with a copy of every buffer the kernel both reads and writes
    (tuning never changes results); the copies are dropped when the runs are done."""
    trial = list(args)
    for i in mutated:
        trial[i] = args[i].clone()
    try:
        yield trial
    finally:
        trial.clear()
