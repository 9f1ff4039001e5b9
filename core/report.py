"""Reports: ``coil.explain(fn, *args)``: compile ``fn`` with Coil, run it once, and report what Coil
did — kernels (device, name, source, fused ATen ops), ops that fell back to ATen, planned
peak memory, compile seconds by stage, and the caches' hits and misses per layer (graph,
kernel, autotune; remote ones too) — as text for people and fields for tests."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from .compile import GraphReport, KernelReport, add_observer, remove_observer
from .report_text import format_graph
from .sdk import cachestats


@dataclass
class ExplainReport:
    graphs: list[GraphReport] = field(default_factory=list)
    result: Any = None
    #: Cache lookups and writes during the compile and the first call (autotuning happens
    #: at the first launch): ``cache.get("graph", "hit")``, ``cache.get("kernel", "miss")``...
    cache: cachestats.Counts = field(default_factory=cachestats.Counts)

    @property
    def kernels(self) -> list[KernelReport]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def fallbacks(self) -> list[str]:
        return [op for g in self.graphs for op in g.fallback_ops]

    @property
    def library_calls(self) -> list[str]:
        return [op for g in self.graphs for op in g.library_ops]

    @property
    def collectives(self) -> list[str]:
        """Each collective and wait (``torch.distributed``) with where it ran: ``"op: started
        at step 1, waited at step 4; 2 step(s) in flight: ..."`` (:mod:`coil.collectives`)."""
        return [f"{f.op}: {f.reason}" for g in self.graphs for f in g.fallbacks if f.kind == "collective"]

    @property
    def peak_bytes(self) -> int:
        return max((g.peak_bytes for g in self.graphs), default=0)

    @property
    def programs(self) -> list[str]:
        """Host programs the wrappers call (:mod:`coil.host_programs`), each "<graph>.<name>:
        <kernels>": runs of kernels that cross from Python into the device's module once."""
        return [f"{g.name}.{p}" for g in self.graphs for p in getattr(g, "programs", ())]

    @property
    def inplace(self) -> int:
        """Kernel outputs stored over an input of their own kernel, in every graph."""
        return sum(g.inplace for g in self.graphs)

    @property
    def reused(self) -> int:
        """Kernel outputs that took a buffer dead since an earlier step, in every graph."""
        return sum(g.reused for g in self.graphs)

    @property
    def stage_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for g in self.graphs:
            for k, v in g.stage_seconds.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def __str__(self) -> str:
        text = "\n".join(format_graph(g) for g in self.graphs) or "(no graph reached Coil)"
        return f"{text}\n== caches: {self.cache.summary()}"


@contextlib.contextmanager
def recording() -> Iterator[ExplainReport]:
    """Collect the report of every graph Coil compiles inside the block (forward and
    backward graphs alike); the conformance kit records through this
    (``coil.sdk.host.Host.recording``)."""
    report = ExplainReport()
    add_observer(report.graphs.append)
    try:
        yield report
    finally:
        remove_observer(report.graphs.append)


def explain(fn: Callable[..., Any], *args: Any, dynamic: bool | None = False, **kwargs: Any) -> ExplainReport:
    """Compile ``fn`` with Coil (fresh Dynamo state), call it on ``args``, and report."""
    before = cachestats.snapshot()
    with recording() as report:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="coil", dynamic=dynamic)
        report.result = compiled(*args, **kwargs)
    report.cache = cachestats.snapshot() - before
    return report
