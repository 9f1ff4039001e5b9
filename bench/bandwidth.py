"""The memory bandwidth this machine gives torch, measured once per run of ``bench/cpu.py`` so
that each bandwidth-bound workload's GB/s can be shown as a share of it ("% of bandwidth").

What is measured, STREAM-style, with torch's own kernels on float32 tensors at least
``CACHE_MULTIPLE`` times the last-level cache (so nothing is served from cache):

* ``read``: ``x.sum()``; bytes = ``numel * 4`` (every element read once; the scalar result is
  nothing).
* ``copy``: ``dst.copy_(src)``; bytes = ``2 * numel * 4`` (``src`` read once, ``dst`` written
  once).  As in STREAM, write-allocate traffic is not counted: unless the CPU uses
  non-temporal stores, each line of ``dst`` is also read into the cache before it is
  written, so the real traffic can be ``3 * numel * 4`` and ``copy`` can read lower than
  ``read`` on the same memory.

Each kernel runs ``WARMUP_CALLS`` times untimed, then ``repeat`` timed calls one by one
(garbage collection off); GB/s = bytes / median call time, 1 GB = 1e9 bytes.  The reference,
:attr:`Bandwidth.reference_gbps`, is the better of the two.

The thread count is ``torch.get_num_threads()`` when :func:`measure` runs, which
``bench/cpu.py`` has already set from ``--threads``: the reference is what this many threads
reach, the ceiling for the workloads timed with the same threads (one core alone often
cannot saturate DRAM), not the machine's peak.
"""

from __future__ import annotations

import gc
import glob
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger("bench.bandwidth")

CACHE_MULTIPLE = 4  # tensors are at least this many times the last-level cache
DEFAULT_CACHE_BYTES = 32 << 20  # assumed when sysfs does not say
WARMUP_CALLS = 2
DEFAULT_REPEAT = 10
ELEMENT_BYTES = 4  # float32


@dataclass(frozen=True)
class Bandwidth:
    """One run's measurement; GB/s with 1 GB = 1e9 bytes."""

    read_gbps: float  # x.sum(): numel*4 bytes per call
    copy_gbps: float  # dst.copy_(src): 2*numel*4 bytes per call, write-allocate not counted
    tensor_bytes: int  # size of x, src and dst each
    cache_bytes: int  # the last-level cache the size was chosen against
    cache_source: str  # where cache_bytes came from
    threads: int
    repeat: int

    @property
    def reference_gbps(self) -> float:
        """The better of read and copy: the figure workloads are compared with."""
        return max(self.read_gbps, self.copy_gbps)

    @property
    def reference_kernel(self) -> str:
        return "read" if self.read_gbps >= self.copy_gbps else "copy"

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "reference_gbps": self.reference_gbps, "reference_kernel": self.reference_kernel}

    def describe(self) -> str:
        return (f"{self.reference_gbps:.1f} GB/s ({self.reference_kernel}; read {self.read_gbps:.1f}, "
                f"copy {self.copy_gbps:.1f}) with {self.threads} torch thread(s) on float32 tensors of "
                f"{self.tensor_bytes / 2**20:.0f} MiB (last-level cache {self.cache_bytes / 2**20:.0f} MiB, "
                f"{self.cache_source})")


# --------------------------------------------------------------------------- #
# Sizing
# --------------------------------------------------------------------------- #


def parse_cache_size(text: str) -> int:
    """Bytes of a sysfs cache ``size`` such as ``32768K``, ``32M`` or ``1G`` (a bare number is bytes)."""
    text = text.strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def last_level_cache() -> tuple[int, str]:
    """(bytes, source) of the L3 that this process's CPUs share among them.

    Summed over the distinct L3 instances (by ``shared_cpu_list``) of the CPUs this process may
    run on: on a chip with one L3 per core complex, threads on several complexes see them all.
    Falls back to ``DEFAULT_CACHE_BYTES`` where sysfs has no L3.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = [0]
    instances: dict[str, int] = {}
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/cache/index3"
        try:
            with open(f"{base}/size") as f:
                size = parse_cache_size(f.read())
            with open(f"{base}/shared_cpu_list") as f:
                instances[f.read().strip()] = size
        except (OSError, ValueError):
            continue
    if not instances:
        return DEFAULT_CACHE_BYTES, "assumed: no L3 in /sys/devices/system/cpu/*/cache/index3"
    return sum(instances.values()), f"{len(instances)} L3 instance(s) from sysfs"


def _capped_by_memory(nbytes: int) -> int:
    """``nbytes``, or less so that the two tensors take at most half of MemAvailable."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return nbytes
    if 2 * nbytes <= avail // 2:
        return nbytes
    log.warning("bandwidth tensors cut from %d MiB to %d MiB to fit MemAvailable", nbytes >> 20, avail >> 22)
    return avail // 4


# --------------------------------------------------------------------------- #
# Measuring
# --------------------------------------------------------------------------- #


def _median_call_s(call: Callable[[], object], repeat: int) -> float:
    for _ in range(WARMUP_CALLS):
        call()
    times = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(times)


def measure(repeat: int = DEFAULT_REPEAT, tensor_bytes: int | None = None) -> Bandwidth:
    """Measure read and copy bandwidth (see the module docstring) with torch's current thread count.

    ``tensor_bytes`` overrides the size (tests use a small one); by default it is
    ``CACHE_MULTIPLE`` times :func:`last_level_cache`, cut to fit in available memory.
    """
    cache_bytes, cache_source = last_level_cache()
    if tensor_bytes is None:
        tensor_bytes = _capped_by_memory(CACHE_MULTIPLE * cache_bytes)
    numel = tensor_bytes // ELEMENT_BYTES
    src = torch.empty(numel, dtype=torch.float32).fill_(1.0)  # fill_ touches every page up front
    dst = torch.empty_like(src).fill_(0.0)
    with torch.no_grad():
        read_s = _median_call_s(src.sum, repeat)
        copy_s = _median_call_s(lambda: dst.copy_(src), repeat)
    del src, dst
    nbytes = numel * ELEMENT_BYTES
    bw = Bandwidth(read_gbps=nbytes / read_s / 1e9, copy_gbps=2 * nbytes / copy_s / 1e9,
                   tensor_bytes=nbytes, cache_bytes=cache_bytes, cache_source=cache_source,
                   threads=torch.get_num_threads(), repeat=repeat)
    log.info("memory bandwidth: %s", bw.describe())
    return bw
