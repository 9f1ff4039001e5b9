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
the loop that reads the stash back.

Where the output's dtype is not the value's (a bf16 softmax computes ``exp`` in float), the
value goes to a row of float scratch instead: a local array over the reduced dims, declared
per kept point, when those dims are of known size and the row fits in ``SCRATCH_LIMIT``
elements (the row of a softmax over 4096 columns is 16 KiB, in L1). A bf16 softmax of
3072x4096 computed ``exp`` twice without it."""
from __future__ import annotations

from dataclasses import dataclass, field
import sympy

from coil.sdk import Kernel, KernelNode, Load, Op, ReductionNode, Value, loads

from .hoist import unmasked
from .optable import COSTLY_OPS, CTYPES

#: Most elements of a scratch row (float: 64 KiB of stack per thread).
SCRATCH_LIMIT = 16384


@dataclass(frozen=True)
class Stash:
    value: Value
    buffer: str  # the output written by the later loop, or a scratch row
    index: sympy.Expr
    scratch: bool = False  # ``buffer`` is a local array, declared per kept point


@dataclass
class LoopStashes:
    """What one r loop stashes (after computing its bodies) and reads back (before)."""

    writes: list[Stash] = field(default_factory=list)
    reads: list[Stash] = field(default_factory=list)


def scratch_rows(k: Kernel, stashes: dict[int, LoopStashes]) -> list[str]:
    """Declarations of the scratch rows that ``stashes`` use (C++, one per kept point)."""
    rows = {s.buffer: s for ls in stashes.values() for s in ls.writes if s.scratch}
    return [f"{CTYPES[s.value.dtype]} {name}[{_row_size(k)}];" for name, s in sorted(rows.items())]


def plan(k: Kernel, scratch: bool = False) -> dict[int, LoopStashes]:
    """The stashes of each r loop of ``k``, by position in ``k.loops``; with ``scratch``, a
    value whose dtype is not its output's may go to a scratch row (see the module's notes)."""
    result: dict[int, LoopStashes] = {}
    written = {s for loop in k.loops for kn in loop.nodes for s in kn.stores}
    read = {ld.buffer for loop in k.loops for kn in loop.nodes for ld in loads(kn.body)}
    for later, loop in enumerate(k.loops):
        if loop.level != "r" or any(isinstance(kn.node, ReductionNode) for kn in loop.nodes):
            continue
        for j, kn in enumerate(loop.nodes):
            in_output = _can_hold_stash(k, kn, read)
            row = _scratch_index(k) if scratch else None
            if not in_output and row is None:
                continue
            for value in _candidates(k, kn, written, in_output, row is not None):
                earlier = _earlier_loop_computing(k, later, value)
                if earlier is None:
                    continue
                if value.dtype == kn.node.layout.dtype and in_output:
                    if not _donor_unread_after(k, kn, earlier, later, value):
                        continue
                    stash = Stash(value, kn.stores[0], kn.store_index)
                else:
                    assert row is not None
                    stash = Stash(value, f"scratch{later}_{j}", row, scratch=True)
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


def _candidates(k: Kernel, kn: KernelNode, written: set[str], in_output: bool,
                in_scratch: bool) -> list[Value]:
    """The costly parts of ``kn``'s body that could be stashed in its output (those of its
    dtype) or in a scratch row (floating-point ones), largest first."""
    found = []
    for v in unmasked(kn.body):
        reads_written = {ld.buffer for ld in loads(v) if ld.buffer not in k.internal} & written
        fits = ((in_output and v.dtype == kn.node.layout.dtype)
                or (in_scratch and v.dtype.is_floating_point))
        if fits and _costly(v) and not reads_written:
            found.append(v)
    return sorted(found, key=_size, reverse=True)


def _scratch_index(k: Kernel) -> sympy.Expr | None:
    """The flat index over the reduced dims, where a scratch row of them fits the limit."""
    n = sympy.Mul(*k.r_ranges)
    if not n.is_number or int(n) > SCRATCH_LIMIT:
        return None
    flat: sympy.Expr = sympy.Integer(0)
    for v, size in zip(k.r_vars, k.r_ranges):
        flat = flat * size + v
    return flat


def _row_size(k: Kernel) -> int:
    return int(sympy.Mul(*k.r_ranges))


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

