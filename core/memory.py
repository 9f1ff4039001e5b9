"""The memory planner: liveness over the scheduled steps, and where the memory of every
buffer a kernel writes comes from. Device-neutral; the wrapper allocates what the plan says.

A kernel's output takes, in this order of preference:

1. **in place** the memory of one of the kernel's own inputs that dies in it (see
   :mod:`coil.inplace` for when a kernel may write over what it reads);
2. **reused** the memory of a dead buffer of an earlier step with the same device, dtype and
   storage size (held for it since that buffer died);
3. fresh memory.

A dead buffer that no later step takes over is freed right away (``del``), so the planned
peak is the most bytes live at once, counting buffers held for a later taker."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Sequence

import sympy

from . import ir
from .inplace import InplacePolicy, inplace_pairs
from .kernel import Kernel


@dataclass
class Allocation:
    name: str
    layout: ir.Layout
    #: A buffer whose memory this one takes over: dead since an earlier step, or (``inplace``)
    #: an input of this very kernel that dies in it.
    reuse: str | None = None
    inplace: bool = False


@dataclass
class MemoryPlan:
    allocs: list[list[Allocation]]  # per step, before it runs
    #: Names the wrapper deletes after each step: buffers freed, and donors whose memory a
    #: new name holds now (so each block of memory has one name, and ``del`` frees it).
    frees: list[list[str]]
    peak_bytes: int
    #: Outputs that took a dead buffer of an earlier step.
    reused: int = 0
    #: Outputs written over an input of their own kernel.
    inplace: int = 0
    #: Step index -> the ``Kernel.inplace`` pairs (output -> input) of that kernel, where it
    #: has some (:func:`with_inplace` puts them on the kernels).
    kernel_inplace: dict[int, dict[str, str]] = field(default_factory=dict)


def with_inplace(steps: Sequence[object], plan: MemoryPlan) -> list[object]:
    """``steps`` with each kernel that writes in place replaced by a copy carrying its pairs
    (``Kernel`` is frozen)."""
    return [dataclasses.replace(s, inplace=plan.kernel_inplace[i]) if i in plan.kernel_inplace else s
            for i, s in enumerate(steps)]


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


@dataclass
class _Liveness:
    last_use: dict[str, int]
    #: Graph outputs and the bases of views among them.
    protected: set[str]
    #: Outputs of ATen view ops and the buffers they may view: never handed to another.
    aliased: set[str]


def _liveness(steps: Sequence[object], keep: set[str]) -> _Liveness:
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
    aliased = set(aliases_of) | {b for bases in aliases_of.values() for b in bases}
    return _Liveness(last_use, protected, aliased)


def plan_memory(steps: Sequence[object], buffers: dict[str, ir.Buffer], keep: set[str],
                inputs: set[str], hint: Callable[[sympy.Expr], int],
                inplace: InplacePolicy | None = None, release: set[str] = frozenset(),
                donated: set[str] = frozenset()) -> MemoryPlan:
    """``keep``: buffers that must survive the call (graph outputs); ``inputs``: the graph's
    input buffers (never allocated, never taken over, except ``donated`` ones); ``inplace``:
    which kernels may write over their dying inputs (None: none), the pairs of the kernels
    that do in ``MemoryPlan.kernel_inplace`` (:func:`with_inplace` puts them on the kernels);
    ``release``: inputs whose name the wrapper drops after their last use (the arguments of a
    boxed call, which the wrapper holds alone once it clears the list: a backward graph's
    saved activations), so their memory goes as soon as nothing needs it; ``donated``: inputs
    of ``release`` whose memory a later buffer may take over once they die, as it takes over a
    dead kernel output (:mod:`coil.donation` says which)."""
    live = _liveness(steps, keep)
    donated = set(donated) & set(release)
    # pass 1 learns which dead buffers a later step takes over; pass 2 frees the others at once
    taken: set[str] = set()
    _Planner(steps, buffers, inputs, hint, inplace, live, None, donated).run(taken)
    plan = _Planner(steps, buffers, inputs, hint, inplace, live, taken, donated).run(set())
    _release_inputs(plan, steps, buffers, set(release), live.protected)
    return plan


def _release_inputs(plan: MemoryPlan, steps: Sequence[object], buffers: dict[str, ir.Buffer],
                    release: set[str], protected: set[str]) -> None:
    """Drop each name of ``release`` after the last step that uses it, or a buffer written
    into it (an input mutation); never one that a graph output is, or is written into."""
    def storage(name: str) -> str:
        buf = buffers.get(name)
        return buf.storage if buf is not None and buf.storage else name

    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for name in step_reads(step) | set(step_writes(step)):
            last[storage(name)] = i
    kept = {storage(name) for name in protected}
    # a donated input a buffer took over is deleted where that buffer took it
    handed = {name for names in plan.frees for name in names}
    for name in sorted(release - kept - handed):
        if name in last:
            plan.frees[last[name]].append(name)


class _Planner:
    def __init__(self, steps: Sequence[object], buffers: dict[str, ir.Buffer], inputs: set[str],
                 hint: Callable[[sympy.Expr], int], policy: InplacePolicy | None,
                 live: _Liveness, will_be_taken: set[str] | None, donated: set[str]) -> None:
        self.steps, self.buffers, self.inputs, self.hint = steps, buffers, inputs, hint
        #: Inputs whose memory may be taken over once they die (:mod:`coil.donation`).
        self.donated = donated
        self.policy, self.live = policy, live
        #: Dead buffers a later step takes over (None: hold every dead buffer, pass 1).
        self.will_be_taken = will_be_taken
        self.allocs: list[list[Allocation]] = [[] for _ in steps]
        self.frees: list[list[str]] = [[] for _ in steps]
        #: size class -> dead buffers held for a later taker
        self.pool: dict[tuple, list[str]] = {}
        #: Buffers whose memory the plan manages (kernel outputs, and ATen results that a
        #: kernel wrote over): dead ones go to the pool or are freed.
        self.owned: set[str] = set()
        #: Donors whose memory a new name took: not freed when they die.
        self.handed_over: set[str] = set()
        self.bytes = self.peak = self.reused = self.in_place = 0
        self.kernel_inplace: dict[int, dict[str, str]] = {}

    def key(self, layout: ir.Layout) -> tuple:
        return (layout.device, layout.dtype, sympy.srepr(layout.storage_span()))

    def nbytes(self, layout: ir.Layout) -> int:
        return self.hint(layout.storage_span()) * layout.dtype.itemsize

    def run(self, taken: set[str]) -> MemoryPlan:
        for i, step in enumerate(self.steps):
            self._allocate(i, step, taken)
            self.peak = max(self.peak, self.bytes)
            self._release(i, step)
        return MemoryPlan(self.allocs, self.frees, self.peak, self.reused, self.in_place,
                          self.kernel_inplace)

    def _donors(self, i: int, step: Kernel) -> list[str]:
        """Inputs of ``step`` that die in it and whose memory may be handed over."""
        out = []
        for name in step.inputs:
            buf = self.buffers.get(name)
            if buf is None or buf.storage or self.live.last_use.get(name) != i:
                continue
            if name in self.inputs and name not in self.donated:
                continue
            if name in self.live.protected or name in self.live.aliased or name in self.handed_over:
                continue
            out.append(name)
        return out

    def _allocate(self, i: int, step: object, taken: set[str]) -> None:
        fresh = []
        for name in step_writes(step):
            buf = self.buffers.get(name)
            if buf is None or buf.storage or name in self.inputs:
                continue
            if not isinstance(step, Kernel):
                self.bytes += self.nbytes(buf.layout)  # ATen allocates it
                continue
            fresh.append(name)
        if not fresh:
            return
        assert isinstance(step, Kernel)
        pairs: dict[str, str] = {}
        if self.policy is not None and self.policy.allows(step):
            donors = self._donors(i, step)
            pairs = inplace_pairs(step, fresh, donors, lambda n: self.key(self.buffers[n].layout))
            if pairs:
                self.kernel_inplace[i] = dict(pairs)
        for name in fresh:
            layout = self.buffers[name].layout
            donor = pairs.get(name)
            if donor is not None:
                self.allocs[i].append(Allocation(name, layout, donor, inplace=True))
                self.handed_over.add(donor)
                self.frees[i].append(donor)
                self.in_place += 1
            elif self.pool.get(self.key(layout)):
                donor = self.pool[self.key(layout)].pop()
                taken.add(donor)
                self.allocs[i].append(Allocation(name, layout, donor))
                self.frees[i].append(donor)
                self.reused += 1
            else:
                self.allocs[i].append(Allocation(name, layout))
                self.bytes += self.nbytes(layout)
            self.owned.add(name)

    def _release(self, i: int, step: object) -> None:
        for name in dict.fromkeys(step_writes(step) + sorted(step_reads(step))):
            if self.live.last_use.get(name) != i or name in self.live.protected or name not in self.buffers:
                continue
            if self.buffers[name].storage or name in self.handed_over:
                continue
            if name in self.inputs:
                if name in self.donated and name not in self.live.aliased and (
                        self.will_be_taken is None or name in self.will_be_taken):
                    self.pool.setdefault(self.key(self.buffers[name].layout), []).append(name)
                continue  # else the wrapper drops its name (_release_inputs)
            if name in self.owned and (self.will_be_taken is None or name in self.will_be_taken):
                # kept alive for a later buffer of the same size class to take over
                self.pool.setdefault(self.key(self.buffers[name].layout), []).append(name)
                self.owned.discard(name)
            elif name not in self.frees[i]:
                self.frees[i].append(name)
                self.bytes -= self.nbytes(self.buffers[name].layout)
