"""Loop schedules for reduction kernels.

Every reduction keeps one accumulator state per SIMD lane, in arrays (see
:mod:`.accumulators`), so its update loop vectorises whatever the reduction type. The
schedule decides what the threads split and what the lanes run over:

* ``inner`` (the default): threads split the kept points; for each, the lanes take
  consecutive elements of the innermost reduced dim and are combined at the end.
* ``outer``: when the accesses are contiguous along the innermost *kept* dim instead
  (``x.sum(0)`` of a row-major matrix), threads split blocks of that dim and the lanes take
  consecutive kept points, so each lane's state is one output; the reduced dims run outside,
  and every access stays contiguous (:mod:`.outer_schedule`).
* ``split``: when there are only a few kept points, threads split the reduced dims; then
  each thread in turn (in a fixed order) combines its lanes into a shared state.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

import sympy

from coil.sdk import Kernel, Load, Loop
from coil.sdk.codegen import ValueScope

from .accumulators import Accumulator
from .cpp import for_header, idx, on_one_thread, parallel_for, parallel_if
from .divmod_split import Split, innermost_split, reduced_split
from .hoist import hoist_invariants
from .lane_access import lane_var, r_loop_accesses
from .outer_schedule import outer
from . import prefetch, streaming
from .reduction_body import accumulators_of, counts, r_body, results
from .stash import LoopStashes, plan, scratch_rows
from .tables import table_scope

if TYPE_CHECKING:
    from .codegen import KernelWriter

#: Lanes of the inner and split schedules: four AVX-512 vectors of float, so four independent
#: update chains hide the latency of each (Welford's chain is long). 32 was measured faster
#: than 16; 64 against 32, side by side in one process on the AMD EPYC (1536x4096 float32,
#: medians, 2026-12-03): layer norm 2.19 -> 2.02 ms with one thread and 1.36 -> 1.23 with
#: two, x.sum(-1) 0.439 -> 0.436 and 0.203 -> 0.193, softmax and cross-entropy level, 128
#: no better; small-size inference of ViT-tiny, BERT, MobileNetV3 and GPT-2 within 1.6%.
#: Shorter reduced dims of known size get fewer (see ``_lane_count``).
LANES = 64
#: Chunks of the inner and split schedules after which each lane's partial state is combined
#: into a settled one and starts again, where a lane would take more: a long sum's rounding
#: error then grows with SETTLE + n / (LANES * SETTLE) additions rather than n / LANES
#: (``x.var()`` of 2**24 float32: 2.1e-5 off a float64 variance, Inductor 8.4e-8). Past
#: SETTLE settlings, the settled states settle in turn into a third one every SETTLE
#: settlings: a few lanes over many elements (``[8, 300000, 3].sum((1, 2))``, two lanes).
SETTLE = 64
#: Kernels with at most this many kept points (known statically) use the split schedule,
#: unless their reduced dims are known to be too short to share among threads: the split
#: schedule opens a parallel region per kept point (an inactive one still costs a runtime
#: call and an ordered loop), which took 45 us for a log-softmax over 32 rows of 256 against
#: a few us for the inner schedule.
SMALL_X = 32


def reduction_kernel(kw: KernelWriter) -> None:
    schedule = choose_schedule(kw.k)
    if schedule == "outer":
        outer(kw, work(kw.k))
        return
    k = kw.k
    split = schedule == "split"
    names = [v.name for v in k.x_vars]
    tables: ValueScope[str] = ValueScope()
    if names and not split:
        tables = _gather_tables(kw)
        kw.pragma(parallel_for(work(k), len(names)))
    stashes = plan(k, scratch=not split)
    rsplit = _lane_split(k)  # once per kernel: it folds every index expression
    ahead = None if split or rsplit is not None or not kw.prefetch else prefetch.plan(k)
    with kw.loops(names, k.x_ranges):
        kw.w.lines(scratch_rows(k, stashes))
        scope = ValueScope(tables)
        for i, loop in enumerate(k.loops):
            if loop.level == "x":
                kw.emit_nodes(loop.nodes, scope)
            else:
                hoist_invariants(kw, loop, scope)
                loads = ahead[1] if ahead is not None and ahead[0] == i else []
                _lane_r_loop(kw, loop, scope, split, stashes.get(i, LoopStashes()), rsplit, loads)


def _gather_tables(kw: KernelWriter) -> ValueScope[str]:
    """Tables (:mod:`.tables`) of what the r loops gather through indices and do not vary
    along some kept dim, filled once per call: Swin-tiny's relative-position bias, gathered
    per score of every window in both the max and the exp pass of its softmax."""
    k = kw.k
    loops = dict(zip([*k.x_vars, *k.r_vars], [*k.x_ranges, *k.r_ranges]))
    bodies = [kn.body for loop in k.loops if loop.level == "r" for kn in loop.nodes]
    return table_scope(kw, bodies, loops, gathers_only=True)


def work(k: Kernel) -> sympy.Expr:
    """The points a reduction kernel visits, for the parallel threshold: its kept points times
    its reduced points, once per pass over the reduced dims. A softmax over short rows reads
    each row three times (its maximum, the sum of exponentials, the quotients): counted once,
    Swin-tiny's shifted-window softmax (1024 rows of 16, relative-position bias gathered in two
    of its passes) stayed on one thread at 96 us a call."""
    passes = max(1, sum(1 for loop in k.loops if loop.level == "r"))
    return sympy.Mul(*k.x_ranges, *k.r_ranges, passes)


def choose_schedule(k: Kernel) -> str:
    numel_x, numel_r = sympy.Mul(*k.x_ranges), sympy.Mul(*k.r_ranges)
    if numel_x.is_number and int(numel_x) <= SMALL_X and not on_one_thread(numel_r):
        return "split"
    if _contiguous_along_x(k):
        return "outer"
    return "inner"


def _contiguous_along_x(k: Kernel) -> bool:
    """Whether at least as many memory accesses of the r loops have unit stride along the
    innermost kept dim (and not along the innermost reduced dim) as along the innermost
    reduced dim, and some do; the innermost kept dim as the outer schedule loops over it
    (split at a divisor, see :mod:`.divmod_split`). Accesses that no kept dim moves (a layer
    norm's weight and bias, indexed by the reduced dim alone) do not count: every kept point
    reads the same few elements, which both schedules find in cache. Counting them kept a
    layer norm over the channels of an NCHW tensor (Swin's and ConvNeXt's, after a permute)
    in the inner schedule, whose lanes then gathered each row at a stride of H*W: 79 us
    against 19 for the outer schedule (Swin-tiny's first norm, small size, one thread)."""
    if not k.x_vars:
        return False
    split = innermost_split(k)
    x, r = lane_var(k, split), k.r_vars[-1]
    n = sympy.Integer(split.divisor) if split is not None else k.x_ranges[-1]
    if n.is_number and int(n) < 16:
        return False
    along_x = along_r = 0
    for loop in k.loops:
        if loop.level != "r":
            continue
        for access in r_loop_accesses(k, loop, split):
            unit_x, unit_r = sympy.diff(access.index, x) == 1, sympy.diff(access.index, r) == 1
            along_x += unit_x and not unit_r
            along_r += unit_r
    return along_x >= along_r and along_x > 0


# -- inner and split schedules: lanes over the innermost reduced dim


def _lane_r_loop(kw: KernelWriter, loop: Loop, scope: ValueScope[str], split: bool,
                 stashes: LoopStashes, rsplit: Split | None, ahead: list[Load]) -> None:
    """An r loop in lanes; ``ahead``: loads to prefetch for the next kept point (:mod:`.prefetch`)."""
    accs = accumulators_of(loop)
    if not accs:
        _plain_r_loop(kw, loop, scope, None if split else rsplit, stashes, split)
        return
    w = kw.w
    lanes = rsplit.divisor if rsplit is not None else _lane_count(kw.k.r_ranges[-1])
    for acc in accs.values():
        w.lines(acc.declare("acc_"))
    per_lane = sympy.Mul(*kw.k.r_ranges) / lanes
    # the counter of chunks since the lanes last settled; a kernel's r loops each have their own
    settle = f"unsettled_{next(iter(accs))}" if not per_lane.is_number or per_lane > SETTLE else None
    # and of settlings since the settled states last went into the third level (high_ states)
    deep = f"settled_{next(iter(accs))}" if settle and (not per_lane.is_number or per_lane > SETTLE ** 2) else None
    levels = ("lane_", "mid_", "high_") if deep else ("lane_", "mid_") if settle else ("lane_",)
    shared = _shares_outer_r(kw, lanes)
    with _parallel_region(kw, split):
        for counter in (settle, deep):
            if counter:
                w.line(f"int64_t {counter} = 0;")
        for acc in counts(accs):  # full chunks counted by the thread (see _lanes_over_r)
            w.line(f"{acc.ctype} count_{acc.name} = 0;")
        for prefix in levels + (("left_",) if shared else ()):
            for acc in accs.values():
                w.lines(acc.declare(prefix, lanes))
            w.line("#pragma omp simd")
            with w.block(for_header("lane", str(lanes)), "}"):
                for acc in accs.values():
                    w.lines(acc.init(prefix, "[lane]"))
        _lanes_over_r(kw, loop, scope, accs, split, stashes, lanes, rsplit, ahead, (settle, deep), shared)
        if shared:
            _settle_lanes(kw, accs, lanes, "lane_", "left_")
        if settle:  # the last partial states after the settled ones, back into the lanes
            w.line("#pragma omp simd")
            with w.block(for_header("lane", str(lanes)), "}"):
                for acc in accs.values():
                    for low, high in zip(levels, levels[1:]):
                        w.line(acc.combine(high, "[lane]", low, "[lane]"))
                    w.lines([f"{a} = {b};" for a, b in zip(acc.refs("lane_", "[lane]"), acc.refs(levels[-1], "[lane]"))])
        _combine_lanes(kw, accs, lanes)
        with _one_thread_at_a_time(kw, split):
            for acc in accs.values():
                w.line(acc.combine("acc_", "", "lane_", "[0]"))
    results(kw, loop, accs, "acc_", "")


def _lane_split(k: Kernel) -> Split | None:
    """The split of the innermost reduced dim (:func:`.divmod_split.reduced_split`) when its
    divisor is short enough to be the lane count (at most 128 lanes of state per row)."""
    rsplit = reduced_split(k)
    return rsplit if rsplit is not None and rsplit.divisor <= 2 * LANES else None


def _lane_count(n: sympy.Expr) -> int:
    """Lanes for a reduced dim of ``n`` elements: ``LANES``, or for a shorter dim of known
    size the largest power of two not above it, so that at least one chunk is full."""
    if not n.is_number or int(n) >= LANES:
        return LANES
    return 1 << max(int(n).bit_length() - 1, 0)


def _combine_lanes(kw: KernelWriter, accs: dict[str, Accumulator], lanes: int) -> None:
    """Combine the lane states pairwise into lane 0, halving the width each step: a few
    vector operations (the steps unrolled, so each has a constant width) where lane after
    lane would be a long scalar chain, which dominated short rows; pairwise sums are also
    more accurate."""
    if lanes == 1:
        return
    kw.w.line("#pragma GCC unroll 8")
    with kw.w.block(f"for (int64_t half = {lanes // 2}; half > 0; half /= 2) {{", "}"):
        kw.w.line("#pragma omp simd")
        with kw.w.block(for_header("lane", "half"), "}"):
            for acc in accs.values():
                kw.w.line(acc.combine("lane_", "[lane]", "lane_", "[lane + half]"))


@contextlib.contextmanager
def _parallel_region(kw: KernelWriter, split: bool) -> Iterator[None]:
    """In the split schedule, an OpenMP parallel region around the code; else nothing."""
    if not split:
        yield
        return
    kw.w.line(f"#pragma omp parallel {parallel_if(sympy.Mul(*kw.k.r_ranges))}")
    with kw.w.block("{", "}"):
        yield


@contextlib.contextmanager
def _one_thread_at_a_time(kw: KernelWriter, split: bool) -> Iterator[None]:
    """In the split schedule, the threads run the code in the order of their numbers, so the
    combined result is the same on every run; else just the code."""
    if not split:
        yield
        return
    kw.w.line("#pragma omp for ordered schedule(static, 1)")
    with kw.w.block(for_header("thread", "omp_get_num_threads()"), "}"):
        kw.w.line("#pragma omp ordered")
        yield


def _lanes_over_r(kw: KernelWriter, loop: Loop, scope: ValueScope[str], accs: dict[str, Accumulator],
                  split: bool, stashes: LoopStashes, lanes: int, rsplit: Split | None = None,
                  ahead: list[Load] | None = None, settle: tuple[str | None, str | None] = (None, None),
                  shared: bool = False) -> None:
    """Full chunks of ``lanes`` elements of the innermost reduced dim, each one vector update
    of the lane arrays, then the leftover elements into the first lanes (either part is left
    out where the size is known and it would not run). With ``rsplit`` (lanes at its divisor,
    which divides the size), a chunk is one value of the split's outer variable and a lane
    one of its inner, and the indices say so (:func:`.divmod_split.reduced_split`). Each full
    chunk first prefetches ``ahead`` for the next kept point (:mod:`.prefetch`). ``settle``:
    the counter after whose ``SETTLE`` chunks the lanes settle (``mid_`` states), and the one
    after whose ``SETTLE`` settlings those settle in turn (``high_`` states), each or None.
    ``shared``: both parts in one pass over the outer reduced dims (:func:`_shares_outer_r`)."""
    w = kw.w
    last, n = kw.k.r_vars[-1].name, kw.k.r_ranges[-1]
    size = int(n) if n.is_number else None
    full = f"{idx(n)} / {lanes} * {lanes}" if size is None else str(size // lanes * lanes)
    with _outer_r(kw, split, shared):
        if size is None or size >= lanes:
            with _innermost_r(kw, split, shared, for_header(f"{last}_chunk", full, step=lanes)):
                _full_chunk(kw, loop, scope, accs, stashes, lanes, rsplit, ahead, settle, shared)
        if size is None or size % lanes:
            with _innermost_r(kw, split, shared, for_header(last, n, start=full), simd=True):
                w.line(f"int64_t lane = {last} - {full};")
                r_body(kw, loop, scope.child(), accs, "left_" if shared else "lane_", "[lane]", stashes)
            if shared and size is None:  # a symbolic dim shorter than the lanes has no full chunk
                _count_settling(kw, accs, lanes, settle, shared)


def _shares_outer_r(kw: KernelWriter, lanes: int) -> bool:
    """Whether the lanes' full chunks and leftover elements share one pass over the outer
    reduced dims (both run and there are outer dims): a separate pass added every leftover
    element of the whole reduction to one lane in a serial sum, never settled
    (``[40, 300000, 3].sum((1, 2))`` 40x further from float64 than eager; a hunt, session
    38). The leftovers then go into states of their own (``left_``), which settle with the
    lanes: Welford's full chunks assume every lane has the same count."""
    n = kw.k.r_ranges[-1]
    size = int(n) if n.is_number else None
    return len(kw.k.r_vars) > 1 and (size is None or (size >= lanes and size % lanes != 0))


def _full_chunk(kw: KernelWriter, loop: Loop, scope: ValueScope[str], accs: dict[str, Accumulator],
                stashes: LoopStashes, lanes: int, rsplit: Split | None, ahead: list[Load] | None,
                settle: tuple[str | None, str | None], shared: bool) -> None:
    """One full chunk of ``lanes`` elements (see :func:`_lanes_over_r`), and the lanes'
    settling every ``SETTLE`` chunks (the settled states' every ``SETTLE`` settlings; with
    ``shared``, the leftovers' states settle with the lanes)."""
    w = kw.w
    last = kw.k.r_vars[-1].name
    if rsplit is not None:
        w.line(f"int64_t {rsplit.hi} = {last}_chunk / {lanes};")
    if ahead:
        prefetch.emit(kw, ahead, f"{last}_chunk", lanes)
    for acc in counts(accs):  # every lane's Welford count is the thread's full chunks
        w.line(f"count_{acc.name} += {acc.ctype}(1);")
        w.line(f"const {acc.ctype} weight_{acc.name} = {acc.ctype}(1) / count_{acc.name};")
    w.line("#pragma omp simd")
    with w.block(for_header("lane", str(lanes)), "}"):
        w.line(f"int64_t {last} = {last}_chunk + lane;")
        if rsplit is not None:
            w.line(f"int64_t {rsplit.lo} = lane;")
        with _substituted(kw, rsplit):
            r_body(kw, loop, scope.child(), accs, "lane_", "[lane]", stashes, counted=True)
    _count_settling(kw, accs, lanes, settle, shared)


def _count_settling(kw: KernelWriter, accs: dict[str, Accumulator], lanes: int,
                    settle: tuple[str | None, str | None], shared: bool) -> None:
    """Counts a chunk; every ``SETTLE`` chunks the lanes' partial states (with ``shared``,
    the leftovers' too) into the settled ones, and every ``SETTLE`` settlings those into the
    third level."""
    w = kw.w
    chunks, settlings = settle
    if chunks:
        with w.block(f"if (++{chunks} == {SETTLE}) {{", "}"):
            w.line(f"{chunks} = 0;")
            w.lines([f"count_{acc.name} = 0;" for acc in counts(accs)])
            _settle_lanes(kw, accs, lanes, "mid_", "lane_")
            if shared:
                _settle_lanes(kw, accs, lanes, "mid_", "left_")
            if settlings:
                with w.block(f"if (++{settlings} == {SETTLE}) {{", "}"):
                    w.line(f"{settlings} = 0;")
                    _settle_lanes(kw, accs, lanes, "high_", "mid_")


def _settle_lanes(kw: KernelWriter, accs: dict[str, Accumulator], lanes: int, into: str, prefix: str) -> None:
    """Each lane's ``prefix`` state combined into its ``into`` state and started again."""
    kw.w.line("#pragma omp simd")
    with kw.w.block(for_header("lane", str(lanes)), "}"):
        for acc in accs.values():
            kw.w.line(acc.combine(into, "[lane]", prefix, "[lane]"))
            kw.w.lines(acc.init(prefix, "[lane]"))


@contextlib.contextmanager
def _substituted(kw: KernelWriter, rsplit: Split | None) -> Iterator[None]:
    """Index expressions printed in terms of ``rsplit``'s variables inside (none: as they are)."""
    outer = kw.index_subs
    if rsplit is not None:
        kw.index_subs = {**outer, **rsplit.substitutions()}
    try:
        yield
    finally:
        kw.index_subs = outer


@contextlib.contextmanager
def _outer_r(kw: KernelWriter, split: bool, shared: bool) -> Iterator[None]:
    """Loops over the outer reduced dims around both innermost loops of the lanes (the full
    chunks and the leftover) where ``shared`` (:func:`_shares_outer_r`); else nothing, and
    :func:`_innermost_r` opens them around each."""
    k = kw.k
    outer = [v.name for v in k.r_vars[:-1]]
    if not shared:
        yield
        return
    if split:
        collapse = f" collapse({len(outer)})" if len(outer) > 1 else ""
        kw.w.line(f"#pragma omp for{collapse} nowait")
    with kw.loops(outer, k.r_ranges[:-1]):
        yield


@contextlib.contextmanager
def _innermost_r(kw: KernelWriter, split: bool, shared: bool, innermost: str, simd: bool = False
                 ) -> Iterator[None]:
    """The ``innermost`` loop header, inside loops over the outer reduced dims unless
    ``shared`` (:func:`_outer_r` opened them). In the split schedule the threads share the
    outer loops, or where there are none the innermost one (collapsing the vectorised loop's
    parent too makes GCC gather across its iterations)."""
    k = kw.k
    outer = [] if shared else [v.name for v in k.r_vars[:-1]]
    pragma = "#pragma omp simd" if simd else ""
    if split and outer:
        collapse = f" collapse({len(outer)})" if len(outer) > 1 else ""
        kw.w.line(f"#pragma omp for{collapse} nowait")
    elif split and not shared:
        pragma = "#pragma omp for simd nowait" if simd else "#pragma omp for nowait"
    with kw.loops(outer, k.r_ranges[:-1]):
        if pragma:
            kw.w.line(pragma)
        with kw.w.block(innermost, "}"):
            yield


def _plain_r_loop(kw: KernelWriter, loop: Loop, scope: ValueScope[str], rsplit: Split | None,
                  stashes: LoopStashes, split: bool) -> None:
    """An r loop without reductions (the last pass of a softmax): pointwise over r; split at
    ``rsplit`` (:func:`_lane_split`) where there is one, as the lanes are."""
    k = kw.k
    if rsplit is not None:
        d, last = rsplit.divisor, k.r_vars[-1]
        with kw.loops([v.name for v in k.r_vars[:-1]], k.r_ranges[:-1]):
            with kw.w.block(for_header(rsplit.hi.name, sympy.Integer(int(k.r_ranges[-1]) // d)), "}"):
                kw.w.line("#pragma omp simd")
                with kw.w.block(for_header(rsplit.lo.name, sympy.Integer(d)), "}"):
                    kw.w.line(f"int64_t {last} = {d}*{rsplit.hi} + {rsplit.lo};")
                    with _substituted(kw, rsplit):
                        r_body(kw, loop, scope.child(), {}, "", "", stashes)
        return
    collapse = f" collapse({len(k.r_ranges)})" if len(k.r_ranges) > 1 else ""
    streams = (streaming.plan(kw, loop.nodes, k.r_vars[0], k.r_ranges[0])
               if not split and len(k.r_ranges) == 1 and not stashes.writes and not stashes.reads else None)
    if streams is not None:
        with streaming.chunked(kw, streams):
            r_body(kw, loop, scope.child(), {}, "", "", stashes)
        return
    if split:
        kw.w.line(f"#pragma omp parallel for simd{collapse} {parallel_if(sympy.Mul(*k.r_ranges))}")
    else:
        kw.w.line(f"#pragma omp simd{collapse}")
    with kw.loops([v.name for v in k.r_vars], k.r_ranges):
        r_body(kw, loop, scope.child(), {}, "", "", stashes)
