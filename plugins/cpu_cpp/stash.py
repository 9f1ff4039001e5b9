"""Stashing: a costly value that one r loop of a kernel computes (``exp(x - max)`` summed by
a softmax) and a later r loop computes again for an output (``exp(x - max) / sum``) is
written to that output's element by the earlier loop and read back by the later one, which
overwrites it with the final value. This trades a libm call per element for a store and a
load that hit the cache (the row was just touched), as ATen's softmax does.

It is safe when the output is a fresh buffer written only by the later loop's node and read
nowhere in the kernel, the value reads no memory the kernel writes (locals are fixed per
kept point), the value's dtype is the output's (the round trip is exact), and the store
index covers every reduced dim (each element is written by one (x, r) point only).

An output stored in place over an input (``Kernel.inplace``) holds the stash where that input
was: the earlier loop overwrites the input's element after its own reads of it, so the stash
is kept only when no later loop reads the input again, except through the stashed value in
the loop that reads the stash back."""
from __future__ import annotations

from dataclasses import dataclass, field
import sympy

from coil.sdk import Kernel, KernelNode, Load, Op, ReductionNode, Value, loads

from .hoist import unmasked
from .optable import COSTLY_OPS


@dataclass(frozen=True)
class Stash:
    value: Value
    buffer: str  # the output written by the later loop
    index: sympy.Expr


@dataclass
class LoopStashes:
    """What one r loop stashes (after computing its bodies) and reads back (before)."""

    writes: list[Stash] = field(default_factory=list)
    reads: list[Stash] = field(default_factory=list)


def plan(k: Kernel) -> dict[int, LoopStashes]:
    """The stashes of each r loop of ``k``, by position in ``k.loops``."""
    result: dict[int, LoopStashes] = {}
    written = {s for loop in k.loops for kn in loop.nodes for s in kn.stores}
    read = {ld.buffer for loop in k.loops for kn in loop.nodes for ld in loads(kn.body)}
    for later, loop in enumerate(k.loops):
        if loop.level != "r" or any(isinstance(kn.node, ReductionNode) for kn in loop.nodes):
            continue
        for kn in loop.nodes:
            if not _can_hold_stash(k, kn, read):
                continue
            for value in _candidates(k, kn, written):
                earlier = _earlier_loop_computing(k, later, value)
                if earlier is not None and _donor_unread_after(k, kn, earlier, later, value):
                    stash = Stash(value, kn.stores[0], kn.store_index)
                    result.setdefault(earlier, LoopStashes()).writes.append(stash)
                    result.setdefault(later, LoopStashes()).reads.append(stash)
                    break
    return result


def _can_hold_stash(k: Kernel, kn: KernelNode, read: set[str]) -> bool:
    """Whether ``kn``'s output is a fresh buffer (not an input it mutates, which another
    input might alias) that only ``kn`` writes and nothing in the kernel reads."""
    buffer = kn.stores[0]
    fresh = buffer == kn.node.outputs()[0] and buffer not in k.internal
    stores = sum(s == buffer for loop in k.loops for other in loop.nodes for s in other.stores)
    covers_r = set(k.r_vars) <= sympy.sympify(kn.store_index).free_symbols
    return fresh and buffer not in read and stores == 1 and covers_r


def _candidates(k: Kernel, kn: KernelNode, written: set[str]) -> list[Value]:
    """The costly parts of ``kn``'s body that could be stashed in its output, largest first."""
    found = []
    for v in unmasked(kn.body):
        reads_written = {ld.buffer for ld in loads(v) if ld.buffer not in k.internal} & written
        if v.dtype == kn.node.layout.dtype and _costly(v) and not reads_written:
            found.append(v)
    return sorted(found, key=_size, reverse=True)


def _earlier_loop_computing(k: Kernel, later: int, value: Value) -> int | None:
    for i in range(later - 1, -1, -1):
        loop = k.loops[i]
        if loop.level == "r" and any(value in set(unmasked(kn.body)) for kn in loop.nodes):
            return i
    return None


def _donor_unread_after(k: Kernel, kn: KernelNode, earlier: int, later: int, value: Value) -> bool:
    """Whether, with ``kn``'s output in place over an input, no loop after ``earlier`` reads
    that input but through ``value`` in loop ``later`` (which reads the stash instead)."""
    donor = k.inplace.get(kn.stores[0])
    if donor is None:
        return True
    for i in range(earlier + 1, len(k.loops)):
        for other in k.loops[i].nodes:
            if _reads_outside(other.body, donor, value if i == later else None):
                return False
    return True


def _reads_outside(v: Value, buffer: str, skip: Value | None) -> bool:
    """Whether ``v`` loads ``buffer`` other than inside subtrees equal to ``skip``."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        u = stack.pop()
        if u is None or id(u) in seen or (skip is not None and u == skip):
            continue
        seen.add(id(u))
        if isinstance(u, Load) and u.buffer == buffer:
            return True
        stack.extend(u.children())
    return False


def _costly(v: Value) -> bool:
    return any(isinstance(u, Op) and u.name in COSTLY_OPS for u in unmasked(v))


def _size(v: Value) -> int:
    return sum(1 for _ in unmasked(v))

