"""The memory planner: liveness over the scheduled steps, reuse of dead buffers by later ones
of the same device, dtype and size, and the planned peak. Device-neutral; the wrapper
allocates what the plan says."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import sympy

from . import ir
from .kernel import Kernel


@dataclass
class Allocation:
    name: str
    layout: ir.Layout
    #: A dead buffer whose memory this one takes over.
    reuse: str | None = None


@dataclass
class MemoryPlan:
    allocs: list[list[Allocation]]  # per step, before it runs
    frees: list[list[str]]          # per step, after it runs
    peak_bytes: int
    reused: int = 0
    pool_key: dict[str, tuple] = field(default_factory=dict)


def step_reads(step: object) -> set[str]:
    if isinstance(step, Kernel):
        return set(step.inputs) | (set(step.outputs))
    assert isinstance(step, ir.ExternNode)
    return step.reads() | set(step.aliases)


def step_writes(step: object) -> list[str]:
    if isinstance(step, Kernel):
        return list(step.outputs)
    assert isinstance(step, ir.ExternNode)
    return list(step.output_names)


def plan_memory(steps: Sequence[object], buffers: dict[str, ir.Buffer], keep: set[str],
                inputs: set[str], hint: Callable[[sympy.Expr], int]) -> MemoryPlan:
    """``keep``: buffers that must survive the call (graph outputs); ``inputs``: the graph's
    input buffers (never allocated, never freed)."""
    keep = keep | inputs
    last_use: dict[str, int] = {}
    aliases_of: dict[str, set[str]] = {}
    for i, step in enumerate(steps):
        for name in step_reads(step) | set(step_writes(step)):
            last_use[name] = i
        if isinstance(step, ir.ExternNode):
            for out in step.output_names:
                for base in step.aliases:
                    aliases_of.setdefault(out, set()).add(base)
    # a base lives as long as any view of it
    for i in reversed(range(len(steps))):
        for out in step_writes(steps[i]):
            for base in aliases_of.get(out, ()):
                last_use[base] = max(last_use.get(base, 0), last_use.get(out, i))
    protected = set(keep)
    for out in list(keep):
        protected |= aliases_of.get(out, set())

    def key(layout: ir.Layout) -> tuple:
        return (layout.device, layout.dtype, sympy.srepr(layout.storage_span()))

    def nbytes(layout: ir.Layout) -> int:
        return hint(layout.storage_span()) * layout.dtype.itemsize

    allocs: list[list[Allocation]] = [[] for _ in steps]
    frees: list[list[str]] = [[] for _ in steps]
    pool: dict[tuple, list[str]] = {}
    owned: set[str] = set()
    live = peak = reused = 0
    for i, step in enumerate(steps):
        for name in step_writes(step):
            buf = buffers.get(name)
            if buf is None or buf.storage or name in inputs:
                continue
            if isinstance(step, Kernel):
                k = key(buf.layout)
                donors = pool.get(k)
                if donors:
                    allocs[i].append(Allocation(name, buf.layout, donors.pop()))
                    reused += 1
                else:
                    allocs[i].append(Allocation(name, buf.layout))
                    live += nbytes(buf.layout)
                owned.add(name)
            else:
                live += nbytes(buf.layout)
        peak = max(peak, live)
        for name in dict.fromkeys(step_writes(step) + sorted(step_reads(step))):
            if last_use.get(name) != i or name in protected or name not in buffers:
                continue
            if buffers[name].storage or name in frees[i]:
                continue
            if name in owned:
                # kept alive for a later buffer of the same size class to take over
                pool.setdefault(key(buffers[name].layout), []).append(name)
                owned.discard(name)
            else:
                frees[i].append(name)
                live -= nbytes(buffers[name].layout)
    return MemoryPlan(allocs, frees, peak, reused)
