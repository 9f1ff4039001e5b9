"""Reports: ``coil.explain(fn, *args)``: compile ``fn`` with Coil, run it once, and report what Coil
did — kernels (device, name, source, fused ATen ops), ops that fell back to ATen, planned
peak memory, and compile seconds by stage — as text for people and fields for tests."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .compile import GraphReport, KernelReport, add_observer, remove_observer


@dataclass
class ExplainReport:
    graphs: list[GraphReport] = field(default_factory=list)
    result: Any = None

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
    def peak_bytes(self) -> int:
        return max((g.peak_bytes for g in self.graphs), default=0)

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
        return "\n".join(format_graph(g) for g in self.graphs) or "(no graph reached Coil)"


def format_graph(g: GraphReport) -> str:
    lines = [f"== {g.name} ({g.kind}): {len(g.kernels)} kernel(s), "
             f"{len(g.fallback_ops)} fallback(s), {len(g.library_ops)} library call(s), "
             f"planned peak {g.peak_bytes / 2**20:.2f} MiB "
             f"({g.inplace} buffer(s) in place, {g.reused} reused)"
             f"{'; loaded from the graph cache' if getattr(g, 'cached', False) else ''}"]
    lines.append("   compile seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in g.stage_seconds.items()))
    for f in g.fallbacks:
        label = {"library": "library", "template": "template"}.get(f.kind, "FALLBACK")
        lines.append(f"   {label}: {f.op} ({f.reason})")
    for k in g.kernels:
        lines.append(f"-- kernel {k.name} [{k.device}] fuses {', '.join(k.ops) or '-'}")
        if k.template:
            lines.append(f"   template: {k.template}")
            chosen = k.chosen() if k.chosen is not None else ""
            if chosen:
                lines.append(f"   chosen: {chosen}")
        lines.extend("   " + line for line in k.source.rstrip().splitlines())
    return "\n".join(lines)


def explain(fn: Callable[..., Any], *args: Any, dynamic: bool | None = False, **kwargs: Any) -> ExplainReport:
    """Compile ``fn`` with Coil (fresh Dynamo state), call it on ``args``, and report."""
    report = ExplainReport()
    add_observer(report.graphs.append)
    try:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="coil", dynamic=dynamic)
        report.result = compiled(*args, **kwargs)
    finally:
        remove_observer(report.graphs.append)
    return report
