"""Reporting for the GPU benchmark (``bench/gpu.py``): turns the workers' raw records into the
stdout table, the markdown report, the JSON dump, and one line per workload saying whether
Coil meets its goals against Inductor.

The goals: time <= Inductor's; >= 3.9 TB/s on the bandwidth-target workloads (pointwise,
softmax, layer norm, RMS norm, cross-entropy); cold and warm compile <= 0.5x Inductor's; peak
memory <= Inductor's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import common
from gpu_workloads import Workload

EAGER, INDUCTOR, COIL = "eager", "inductor", "coil"
TARGET_GBPS = 3900.0
COMPILE_GOAL = 0.5  # coil compile time / inductor compile time
CHECK_WIDTH = 60  # the stdout table cuts the check column here; longer ones are listed below it

HEADER = ["workload", "backend", "median", "IQR %", "GB/s", "TFLOP/s", "peak MiB", "cold s", "warm s",
          "vs eager", "vs inductor", "check"]
RIGHT = [False, False, True, True, True, True, True, True, True, True, True, False]


@dataclass(frozen=True)
class Row:
    """The derived numbers of one (workload, backend) pair; None where not measured."""

    workload: Workload
    backend: str
    median_s: float | None
    iqr: float | None
    gbps: float | None
    tflops: float | None
    peak_bytes: int | None
    cold_s: float | None
    warm_s: float | None
    check: str  # "reference", "ok (...)", "MISMATCH: ...", or "error: ..."

    def cells(self, vs_eager: float | None, vs_inductor: float | None) -> list[str]:
        if self.workload.host_timed:
            median = common.fmt(None if self.median_s is None else self.median_s * 1e6, "{:.1f} us")
        else:
            median = common.fmt(None if self.median_s is None else self.median_s * 1e3, "{:.3f} ms")
        return [self.workload.name, self.backend, median, common.fmt(_pct(self.iqr), "{:.1f}"),
                common.fmt(self.gbps, "{:.0f}"), common.fmt(self.tflops, "{:.1f}"),
                common.fmt(None if self.peak_bytes is None else self.peak_bytes / 2**20, "{:.1f}"), common.fmt(self.cold_s, "{:.2f}"),
                common.fmt(self.warm_s, "{:.2f}"), common.fmt(vs_eager, "{:.2f}"),
                common.fmt(vs_inductor, "{:.2f}"), self.check]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


class Report:
    """All results of one run; ``text()``, ``markdown()`` and ``as_json()`` render them."""

    def __init__(self, meta: dict[str, Any], workloads: Sequence[Workload], backends: Sequence[str],
                 timing: dict[str, dict[str, Any]], probes: dict[str, dict[str, dict[str, Any]]]) -> None:
        self.meta, self.workloads, self.backends = meta, list(workloads), list(backends)
        self.timing, self.probes = timing, probes
        self.rows = {(w.name, b): self._row(w, b) for w in self.workloads for b in self.backends}

    def _row(self, w: Workload, backend: str) -> Row:
        rec = self.timing.get(w.name, {})
        res = rec.get("results", {}).get(backend, {})
        probe = self.probes.get(w.name, {}).get(backend, {})
        median = res.get("median_s")
        bandwidth = median and not w.flops and not w.host_timed
        return Row(w, backend, median, res.get("iqr"),
                   w.ideal_bytes / median / 1e9 if bandwidth else None,
                   w.flops / median / 1e12 if median and w.flops else None,
                   res.get("peak_extra_bytes"),
                   probe.get("cold", {}).get("compile_s"), probe.get("warm", {}).get("compile_s"),
                   self._check(rec, res, probe))

    @staticmethod
    def _check(rec: dict[str, Any], res: dict[str, Any], probe: dict[str, Any]) -> str:
        parts = []
        if rec.get("error"):
            parts.append("error: " + rec["error"])
        if res.get("check"):
            parts.append(res["check"])
        if res.get("error"):
            parts.append("error: " + res["error"])
        for phase in ("cold", "warm"):
            err = probe.get(phase, {}).get("error")
            if err:
                parts.append(f"{phase} probe error: {err}")
        return "; ".join(parts)

    def _ratios(self, row: Row) -> tuple[float | None, float | None]:
        eager = self.rows.get((row.workload.name, EAGER))
        inductor = self.rows.get((row.workload.name, INDUCTOR))
        return (_ratio(row.median_s, eager.median_s if eager else None),
                _ratio(row.median_s, inductor.median_s if inductor else None))

    def table(self) -> list[list[str]]:
        return [row.cells(*self._ratios(row)) for row in self.rows.values()]

    # ----------------------------------------------------------------------- #
    # Goals
    # ----------------------------------------------------------------------- #

    def goal_line(self, w: Workload) -> str:
        """Whether coil meets each goal against inductor on ``w``."""
        coil, ind = self.rows.get((w.name, COIL)), self.rows.get((w.name, INDUCTOR))
        if coil is None or ind is None:
            return f"{w.name}: needs both coil and inductor"
        items = [_goal("time <= inductor", coil.median_s, ind.median_s, 1.0)]
        if w.bandwidth_target:
            ok = None if coil.gbps is None else coil.gbps >= TARGET_GBPS
            items.append(f">= 3.9 TB/s {_yes(ok)} ({common.fmt(coil.gbps, '{:.0f}')} GB/s)")
        items += [_goal("cold compile <= 0.5x", coil.cold_s, ind.cold_s, COMPILE_GOAL),
                  _goal("warm compile <= 0.5x", coil.warm_s, ind.warm_s, COMPILE_GOAL),
                  _memory_goal(coil.peak_bytes, ind.peak_bytes)]
        bad = "" if common.passed(coil.check) else "  [coil result not verified: " + coil.check[:80] + "]"
        return f"{w.name}: " + " | ".join(items) + bad

    def goal_lines(self) -> list[str]:
        if COIL not in self.backends or INDUCTOR not in self.backends:
            return []
        return [self.goal_line(w) for w in self.workloads]

    # ----------------------------------------------------------------------- #
    # Renderings
    # ----------------------------------------------------------------------- #

    def header_lines(self) -> list[str]:
        env, m = self.meta["env"], self.meta
        gpu = env.get("gpu")
        device = f"{gpu} ({env.get('sms')} SMs, {env.get('gpu_mem_gib', 0):.0f} GiB)" if gpu else env.get("device")
        return [f"device: {device}",
                f"torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda', '-')}, "
                f"python {env.get('python', '-')}",
                f"date: {m['date']}",
                f"command: {m['command']}",
                f"timing: {_timing(m['timing'])}; compile probes: {m['compile_probes']}; "
                f"wall time {m['wall_s']:.0f}s"]

    def text(self) -> str:
        table = self.table()
        lines = [*self.header_lines(), "", *common.text_table(HEADER, table, RIGHT, max_last=CHECK_WIDTH)]
        long = [f"  {row[0]} / {row[1]}: {row[-1]}" for row in table if len(row[-1]) > CHECK_WIDTH]
        if long:
            lines += ["", "checks in full:", *long]
        goals = self.goal_lines()
        if goals:
            lines += ["", "coil vs inductor goals:", *(f"  {g}" for g in goals)]
        return "\n".join(lines) + "\n"

    def markdown(self) -> str:
        lines = ["# Coil GPU benchmark", "", *(f"- {h}" for h in self.header_lines()),
                 "- median: device time per call (CUDA events between back-to-back calls; µs of host time "
                 "per call for launch_chain*); no L2 flush (data >= 128 MiB >> 50 MB L2)",
                 "- GB/s: ideal bytes (inputs read once + outputs written once) / median; TFLOP/s: matmul FLOPs "
                 "/ median",
                 "- peak MiB: peak allocated during one steady-state call minus allocated just before it "
                 "(outputs + temporaries)",
                 "- cold s / warm s: torch.compile + first call + sync in a fresh process with empty / reused "
                 "cache dirs, after one unrelated warm-up compile",
                 "- vs eager / vs inductor: median / that backend's median (lower is better)",
                 "", "## Workloads", "",
                 *common.markdown_table(["workload", "description", "ideal MiB", "GFLOP"],
                                        [[w.name, w.description, f"{w.ideal_bytes / 2**20:.1f}",
                                          common.fmt(w.flops / 1e9 if w.flops else None, "{:.1f}")]
                                         for w in self.workloads], [False, False, True, True]),
                 "", "## Results", "", *common.markdown_table(HEADER, self.table(), RIGHT)]
        goals = self.goal_lines()
        if goals:
            lines += ["", "## Coil vs inductor goals", "", *(f"- {g}" for g in goals)]
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict[str, Any]:
        workloads = []
        for w in self.workloads:
            rec = self.timing.get(w.name, {})
            results = {}
            for b in self.backends:
                row = self.rows[(w.name, b)]
                vs_eager, vs_inductor = self._ratios(row)
                results[b] = {**rec.get("results", {}).get(b, {}), "gbps": row.gbps, "tflops": row.tflops,
                              "vs_eager": vs_eager, "vs_inductor": vs_inductor,
                              "compile_probe": self.probes.get(w.name, {}).get(b, {})}
            workloads.append({"name": w.name, "description": w.description, "ideal_bytes": w.ideal_bytes,
                              "counted_ideal_bytes": rec.get("counted_ideal_bytes"), "flops": w.flops,
                              "host_timed": w.host_timed, "bandwidth_target": w.bandwidth_target,
                              "error": rec.get("error"), "results": results})
        return {"meta": self.meta, "goals": self.goal_lines(), "workloads": workloads}


def _timing(t: dict[str, Any]) -> str:
    return (f"{t['rounds']} rounds x ~{t['round_budget_s'] * 1e3:.0f} ms of calls per backend "
            f"(launch_chain*: {t['host_rounds']} samples x ~{t['host_sample_s'] * 1e3:.0f} ms), "
            f"after {t['warmup_calls']} warm-up calls")


def _yes(ok: bool | None) -> str:
    return "n/a" if ok is None else ("YES" if ok else "NO")


def _goal(label: str, coil: float | None, inductor: float | None, limit: float) -> str:
    """'label YES (0.93x)': coil / inductor <= limit."""
    ratio = _ratio(coil, inductor)
    return f"{label} {_yes(None if ratio is None else ratio <= limit)} ({common.fmt(ratio, '{:.2f}x')})"


def _memory_goal(coil: int | None, inductor: int | None) -> str:
    ok = None if coil is None or inductor is None else coil <= inductor
    detail = "-" if ok is None else f"{_size(coil)} vs {_size(inductor)}"
    return f"peak mem <= inductor {_yes(ok)} ({detail})"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B"
