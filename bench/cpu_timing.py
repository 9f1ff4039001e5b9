"""Timing for the CPU benchmark (``bench/cpu.py``): samples taken round-robin across backends,
the page faults of the process while sampling, and the CPU that other processes used meanwhile.
"""

from __future__ import annotations

import gc
import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common import log_failure  # bench/ is on sys.path

WARMUP_CALLS = 3
MIN_SAMPLE_S = 0.05


@dataclass
class Samples:
    """Per-backend timing state while samples are interleaved across backends."""

    step: Callable[[], object]
    inner: int = 1  # calls per sample
    times: list[float] = field(default_factory=list)  # seconds per call, one entry per sample
    faults: int = 0


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
