"""The text of one graph's report (kernels with their source, fallbacks, planned peak,
compile seconds), written by ``coil.explain`` and by the debug dump of each compiled graph.
Its own module so that :mod:`coil.compile` (the dump) and :mod:`coil.report` (``explain``)
both import it at the top without importing each other."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph_report import GraphReport


def format_graph(g: GraphReport) -> str:
    lines = [f"== {g.name} ({g.kind}): {len(g.kernels)} kernel(s), "
             f"{len(g.fallback_ops)} fallback(s), {len(g.library_ops)} library call(s), "
             f"planned peak {g.peak_bytes / 2**20:.2f} MiB "
             f"({g.inplace} buffer(s) in place, {g.reused} reused)"
             f"{'; loaded from the graph cache' if getattr(g, 'cached', False) else ''}"]
    lines.append("   compile seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in g.stage_seconds.items()))
    if getattr(g, "frozen", ""):
        lines.append(f"   {g.frozen}")
    if getattr(g.capture, "replay", None) is not None:
        lines.append(f"   {g.capture}")
    for program in getattr(g, "programs", ()):
        lines.append(f"   host program {program}")
    for f in g.fallbacks:
        label = f.kind if f.kind in ("library", "template", "collective") else "FALLBACK"
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


__all__ = ["format_graph"]
