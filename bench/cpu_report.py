"""The CPU benchmark's results (``bench/cpu.py``) and its reports: the markdown (the machine,
the workloads, one row per workload and backend, geometric means over the workloads, and each
bandwidth-bound row's share of the bandwidth measured in the run) and the JSON of every number.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from bandwidth import Bandwidth  # bench/ is on sys.path
from common import fmt, markdown_table, md_cell, passed
from cpu_timing import MIN_SAMPLE_S, WARMUP_CALLS
from cpu_workloads import Workload

EAGER = "eager"
INDUCTOR = "inductor"
CONTENDED_CORES = 0.2  # background CPU use (cores) above which the report warns


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


def _ratio(res: Result, base: Result | None) -> float | None:
    if base is None or res.median_s is None or base.median_s is None:
        return None
    return res.median_s / base.median_s


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
               f"{md_cell(err)}" for b, err in warmup_errors.items() if err),
             *_contention_warning(infos),
             "", "## Workloads", "", "| workload | description | ideal MiB | background cores |",
             "|---|---|---:|---:|"]
    for info in infos:
        lines.append(f"| {info.workload.name} | {md_cell(info.workload.description)} | "
                     f"{info.ideal_bytes / 2**20:.1f} | {fmt(info.background_cores, '{:.2f}')} |")
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
                f"| {info.workload.name} | {backend} | {fmt(None if r.median_s is None else r.median_s * 1e3, '{:.3f}')}"
                f" | {fmt(None if r.iqr is None else r.iqr * 100, '{:.1f}')} | {fmt(gbps, '{:.1f}')}"
                f" | {fmt(r.first_call_s, '{:.2f}')} | {fmt(_ratio(r, eager), '{:.2f}')}"
                f" | {fmt(_ratio(r, inductor), '{:.2f}')} | {fmt(r.faults_per_call, '{:.0f}')}"
                f" | {md_cell(r.check)} |")
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
    return r.median_s is not None and passed(r.check)


# --------------------------------------------------------------------------- #
# Share of the measured bandwidth; JSON
# --------------------------------------------------------------------------- #

#: The share of the measured bandwidth that the sums, layer norm and RMS norm should reach.
TARGET_SHARE = 0.8


def share_of_bandwidth(info: WorkloadInfo, res: Result, bw: Bandwidth | None) -> float | None:
    """``res``'s GB/s over the measured bandwidth, for a timed bandwidth-bound workload; else None."""
    if bw is None or not info.workload.bandwidth_bound or res.gbps is None:
        return None
    return res.gbps / bw.reference_gbps


def bandwidth_markdown(infos: Sequence[WorkloadInfo], backends: Sequence[str], bw: Bandwidth | None) -> list[str]:
    """The report's section on the measured bandwidth: the figures and each row's share of them."""
    lines = ["", "## Share of the memory bandwidth measured in this run", ""]
    if bw is None:
        return lines + ["- not measured (`--no-bandwidth`)"]
    lines += [f"- measured bandwidth: {bw.describe()}",
              "- read = `x.sum()`, bytes = numel*4; copy = `dst.copy_(src)`, bytes = 2*numel*4 (write-allocate "
              f"traffic not counted, as in STREAM); each the median of {bw.repeat} calls after a warm-up",
              "- % of bandwidth = the row's GB/s / the measured bandwidth, for bandwidth-bound workloads; "
              f"the sums and norms should reach {TARGET_SHARE:.0%}"]
    bound = [info for info in infos if info.workload.bandwidth_bound]
    cached = [info.workload.name for info in bound if info.ideal_bytes <= bw.cache_bytes]
    if cached:  # the timed calls reuse the same inputs, so these are served from cache, not memory
        lines.append(f"- **{', '.join(cached)}: ideal bytes fit in the last-level cache "
                     f"({bw.cache_bytes / 2**20:.0f} MiB)**, so repeated calls run from cache and can pass 100%")
    rows = []
    for info in bound:
        shares = (share_of_bandwidth(info, info.results[b], bw) for b in backends)
        rows.append([info.workload.name, f"{info.ideal_bytes / 2**20:.1f}",
                     *(fmt(None if s is None else s * 100, "{:.0f}") for s in shares)])
    return lines + [""] + markdown_table(["workload", "ideal MiB", *(f"{b} % of bandwidth" for b in backends)],
                                         rows, [False, True, *(True for _ in backends)])


def report_json(infos: Sequence[WorkloadInfo], backends: Sequence[str], bw: Bandwidth | None,
                **meta: Any) -> dict[str, Any]:
    """Every number of the report; ``pct_of_bandwidth`` is None where the markdown shows '-'."""
    workloads = []
    for info in infos:
        results = {}
        for backend in backends:
            res = info.results[backend]
            share = share_of_bandwidth(info, res, bw)
            fields = {k: v for k, v in dataclasses.asdict(res).items() if k not in ("workload", "backend")}
            results[backend] = {**fields, "pct_of_bandwidth": None if share is None else share * 100}
        workloads.append({"name": info.workload.name, "description": info.workload.description,
                          "bandwidth_bound": info.workload.bandwidth_bound, "ideal_bytes": info.ideal_bytes,
                          "background_cores": info.background_cores, "results": results})
    return {**meta, "backends": list(backends), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "bandwidth": None if bw is None else bw.as_json(), "workloads": workloads}
