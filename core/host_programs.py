"""Host programs (:mod:`coil.sdk.programs`): which runs of a graph's kernel launches a backend
is offered to compile into one host function, and which of the run's buffers become that
function's scratch memory instead of tensors the wrapper allocates.

A launch-bound graph (small tensors, several kernels) spends a good part of a call in the
wrapper's Python: each kernel is a call into the module with each buffer's address, and
each intermediate buffer is a tensor allocated and freed. A program is a maximal run of at
least two consecutive kernels on one backend that declares ``Capabilities.host_programs``,
with no ATen call between them and no size arguments. Inside the run, a buffer becomes
scratch when its memory (the buffer and every later one the memory plan lets take it over)
is allocated and dies inside the run and is no graph output; each program keeps at most
:data:`SCRATCH_BYTES` of scratch (the rest stays tensors), so a program never holds much
memory the plan would have freed earlier. Device-neutral."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sympy

from .kernel import Kernel
from .memory import MemoryPlan
from .sdk.programs import HostProgram, Launch, ProgramOperand

#: Scratch bytes one program may keep (regions aligned to 64 bytes). Below glibc's default
#: threshold for serving an allocation from its heap rather than a fresh mapping (128 KiB),
#: so taking it costs no page faults; the buffers that matter here are small anyway.
SCRATCH_BYTES = 128 * 1024
#: Alignment of each scratch region (a cache line; AVX-512 vectors).
ALIGN = 64
#: Bytes of tensors a program may hold past the step where the memory plan frees them (a
#: tensor the wrapper frees inside a run goes when the whole run has returned). A run that
#: would hold more runs launch by launch: such runs move enough memory that the launches'
#: own cost does not matter, and the plan's peak stays what it says (a backward graph frees
#: its saved activations as it goes).
DEFERRED_BYTES = 1 << 20


@dataclass(frozen=True)
class PlannedProgram:
    """A program and where it sits: steps ``start`` to ``stop`` (exclusive) of the graph, and
    the buffers of those steps that are its scratch (the wrapper neither allocates nor frees
    them)."""

    program: HostProgram
    start: int
    stop: int
    scratch_names: frozenset[str]


def plan(steps: Sequence[object], memory: MemoryPlan, keep: set[str], buffers: dict[str, Any],
         backend_of: Callable[[Kernel], Any]) -> list[PlannedProgram]:
    """The programs of a graph's ``steps`` (after the memory plan ``memory``); ``keep``: the
    buffers that outlive the call; ``backend_of``: the backend that launches a kernel."""
    out: list[PlannedProgram] = []
    for start, stop in _runs(steps, backend_of):
        planned = _program(f"host_run{len(out)}", steps, memory, start, stop, keep, buffers)
        if _deferred_bytes(planned, memory, buffers) <= DEFERRED_BYTES:
            out.append(planned)
    return out


def _deferred_bytes(planned: PlannedProgram, memory: MemoryPlan, buffers: dict[str, Any]) -> float:
    """Bytes of the tensors the plan frees inside the program's run, before its last step."""
    total = 0.0
    for i in range(planned.start, planned.stop - 1):
        for name in memory.frees[i]:
            if name not in planned.scratch_names:
                nbytes = _bytes(buffers[name].layout) if name in buffers else None
                total += float("inf") if nbytes is None else nbytes
    return total


def builds_programs(backend: Any) -> bool:
    """Whether ``backend`` declares ``Capabilities.host_programs`` and its ``compile`` takes
    ``programs``: a subclass of such a backend that overrides ``compile`` with the older
    signature (a vendor's tuning wrapper, say) is offered none."""
    if not getattr(backend.capabilities, "host_programs", False):
        return False
    try:
        parameters = inspect.signature(backend.compile).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "programs" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _runs(steps: Sequence[object], backend_of: Callable[[Kernel], Any]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    start, owner = None, None
    builds: dict[int, bool] = {}
    for i, step in enumerate([*steps, None]):
        backend = backend_of(step) if _eligible(step) else None
        if backend is not None and id(backend) not in builds:
            builds[id(backend)] = builds_programs(backend)
        if backend is not None and not builds[id(backend)]:
            backend = None
        if start is not None and (backend is None or backend is not owner):
            if i - start >= 2:
                runs.append((start, i))
            start = None
        if backend is not None and start is None:
            start, owner = i, backend
    return runs


def _eligible(step: object) -> bool:
    return isinstance(step, Kernel) and not step.size_args


def _program(name: str, steps: Sequence[object], memory: MemoryPlan, start: int, stop: int,
             keep: set[str], buffers: dict[str, Any]) -> PlannedProgram:
    allocated = {a.name: a for i in range(start, stop) for a in memory.allocs[i]}
    freed = {n for i in range(start, stop) for n in memory.frees[i]}

    def root(n: str) -> str:
        while n in allocated and allocated[n].reuse:
            n = allocated[n].reuse  # type: ignore[assignment]
        return n

    members: dict[str, list[str]] = {}
    for n in allocated:
        members.setdefault(root(n), []).append(n)
    regions: dict[str, int] = {}  # root -> region index
    sizes: list[int] = []
    used = 0
    for r, names in members.items():
        if r not in allocated or any(n not in freed or n in keep for n in names):
            continue
        spans = [_bytes(allocated[n].layout) for n in names]
        if any(b is None for b in spans) or max(spans) <= 0:  # type: ignore[type-var]
            continue
        nbytes: int = max(spans)  # type: ignore[type-var,assignment]
        padded = -(-nbytes // ALIGN) * ALIGN
        if used + padded > SCRATCH_BYTES:
            continue
        regions[r] = len(sizes)
        sizes.append(padded)
        used += padded
    scratch = {n: regions[root(n)] for n in allocated if root(n) in regions}
    params: dict[str, int] = {}  # name -> parameter index, in order of first use
    launches = []
    for step in steps[start:stop]:
        assert isinstance(step, Kernel)
        operands = [ProgramOperand(scratch[arg], scratch=True) if arg in scratch
                    else ProgramOperand(params.setdefault(arg, len(params)))
                    for arg in [*step.inputs, *step.outputs]]
        launches.append(Launch(step, tuple(operands)))
    return PlannedProgram(HostProgram(name, tuple(launches), tuple(params), tuple(sizes)),
                          start, stop, frozenset(scratch))


def _bytes(layout: Any) -> int | None:
    """Bytes a static layout spans from its storage's start; None for a symbolic one."""
    span = sympy.sympify(layout.storage_span())
    if not span.is_Integer:
        return None
    return int(span) * layout.dtype.itemsize
