"""What a reduction kernel's r loops read and write outside the kernel, each access once, as
index expressions over the innermost kept dim (split at its divisor where
:func:`.divmod_split.innermost_split` splits it): what the schedule choice counts
(:mod:`.reduction_loops`), and what decides whether the outer schedule's lanes may take
several reduced elements in turn (:mod:`.outer_schedule`)."""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from coil.sdk import Kernel, Loop, loads
from coil.sdk.symbolic import fold_divmod

from .divmod_split import Split


@dataclass(frozen=True)
class Access:
    """One buffer at one index; ``indirect``: the index holds values read from memory."""

    buffer: str
    index: sympy.Expr
    indirect: bool


def lane_var(k: Kernel, split: Split | None) -> sympy.Symbol:
    """The variable the outer schedule's lanes run over: the innermost kept dim, or its low
    part where it is split."""
    return split.lo if split is not None else k.x_vars[-1]


def r_loop_accesses(k: Kernel, loop: Loop, split: Split | None) -> list[Access]:
    """The distinct accesses of ``loop`` (a loop over the reduced dims) to buffers outside
    the kernel that some kept dim moves (or that go through indices): its nodes' loads, and
    the stores of its pointwise nodes. A value that several nodes or several places of one
    node load is one access: counted once for each place, a batch-norm gradient whose kept
    per-channel factors appear several times in the expression (nfnet's scaled weight
    standardisation) outvoted its contiguous rows, and took the outer schedule with every row
    read at a stride."""
    kept = set(k.x_vars)
    if split is not None:
        kept |= {split.lo, split.hi}
    found: dict[tuple[str, sympy.Expr], Access] = {}
    for kn in loop.nodes:
        entries = [(ld.buffer, ld.index, bool(ld.indirect)) for ld in loads(kn.body)
                   if ld.buffer not in k.internal and (ld.indirect or ld.index.free_symbols & kept)]
        output = kn.node.outputs()[0]
        if not kn.is_reduction and output not in k.internal:
            entries.append((output, kn.store_index, False))
        for buffer, index, indirect in entries:
            if split is not None:
                index = fold_divmod(index).xreplace(split.substitutions())
            found.setdefault((buffer, index), Access(buffer, index, indirect))
    return list(found.values())


def contiguous_along_lanes(k: Kernel, loop: Loop, split: Split | None) -> bool:
    """Whether every access of ``loop`` is contiguous along the outer schedule's lanes or
    does not move with them (no gather): only then may each lane take several reduced
    elements in turn. GCC 12 vectorises an ``omp simd`` loop holding such an inner loop
    over gathers whatever the cost, and took 180 s to build one batch-norm gradient kernel
    (rows of 512 read at a stride; a few tenths of a second with one element at a time)."""
    x = lane_var(k, split)
    return all(not a.indirect and sympy.diff(a.index, x) in (0, 1)
               for a in r_loop_accesses(k, loop, split))
