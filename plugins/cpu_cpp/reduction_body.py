"""What every schedule of a reduction kernel does at one point of its loops: the states of
its reductions (:mod:`.accumulators`), the body at one (kept, reduced) point with the updates
of a lane's states, and the stores of the results. The schedules themselves
(:mod:`.reduction_loops`, :mod:`.outer_schedule`) decide where the points and lanes run."""
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from coil.sdk import Kernel, Load, Loop, ReductionNode
from coil.sdk.codegen import ValueScope

from .accumulators import Accumulator, accumulator
from .cpp import idx
from .optable import CTYPES
from .stash import LoopStashes

if TYPE_CHECKING:
    from .codegen import KernelWriter


def accumulators_of(loop: Loop) -> dict[str, Accumulator]:
    accs: dict[str, Accumulator] = {}
    for kn in loop.nodes:
        node = kn.node
        if isinstance(node, ReductionNode):
            accs[node.name] = accumulator(node.reduction_type, node.name, CTYPES[node.acc_dtype],
                                          CTYPES[kn.body.dtype])
    return accs


def flat_r(k: Kernel) -> str:
    flat: sympy.Expr = sympy.Integer(0)
    for v, n in zip(k.r_vars, k.r_ranges):
        flat = flat * n + v
    return idx(flat)


def r_body(kw: KernelWriter, loop: Loop, scope: ValueScope[str], accs: dict[str, Accumulator],
            prefix: str, lane: str, stashes: LoopStashes, counted: bool = False) -> None:
    """One (x, r) point of an r loop: pointwise nodes, and updates of the lane's states
    (``counted``: Welford states take their count from the chunk, see :func:`counts`)."""
    for s in stashes.reads:
        scope[s.value] = kw.value(Load(s.value.dtype, buffer=s.buffer, index=s.index), scope)
    for kn in loop.nodes:
        acc = accs.get(kn.node.name)
        if acc is None:
            kw.emit_nodes([kn], scope)
        else:
            value = kw.value(kn.body, scope)
            if counted and acc.kind == "welford":
                kw.w.line(acc.update_counted(prefix, lane, value, f"count_{acc.name}", f"weight_{acc.name}"))
            else:
                kw.w.line(acc.update(prefix, lane, value, flat_r(kw.k)))
    for s in stashes.writes:
        kw.w.line(f"{s.buffer}[{kw.idx(s.index)}] = {kw.value(s.value, scope)};")


def results(kw: KernelWriter, loop: Loop, accs: dict[str, Accumulator], prefix: str, lane: str) -> None:
    for kn in loop.nodes:
        acc = accs.get(kn.node.name)
        if acc is not None:
            for i, out in enumerate(kn.node.outputs()):
                kw.store(out, kn.store_index, acc.result(prefix, lane, i), kn.node.layout.dtype,
                         store_name=kn.stores[i])


def counts(accs: dict[str, Accumulator]) -> list[Accumulator]:
    """The Welford states whose count the full chunks keep once per thread: every lane starts
    at 0 and takes one element per full chunk, so all lanes have the same count there."""
    return [acc for acc in accs.values() if acc.kind == "welford"]
