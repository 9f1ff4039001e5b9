"""Loop schedules for reduction kernels.

Every reduction keeps one accumulator state per SIMD lane, in arrays (see
:mod:`.accumulators`), so its update loop vectorises whatever the reduction type. The
schedule decides what the threads split and what the lanes run over:

* ``inner`` (the default): threads split the kept points; for each, the lanes take
  consecutive elements of the innermost reduced dim and are combined at the end.
* ``outer``: when the accesses are contiguous along the innermost *kept* dim instead
  (``x.sum(0)`` of a row-major matrix), threads split blocks of that dim and the lanes take
  consecutive kept points, so each lane's state is one output; the reduced dims run outside,
  and every access stays contiguous.
* ``split``: when there are only a few kept points, threads split the reduced dims; then
  each thread in turn (in a fixed order) combines its lanes into a shared state.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

import sympy

from coil.sdk import Kernel, Load, Loop, ReductionNode, loads
from coil.sdk.codegen import ValueScope
from coil.sdk.symbolic import fold_divmod

from .accumulators import Accumulator, accumulator
from .cpp import for_header, idx, on_one_thread, parallel_for, parallel_if
from .divmod_split import Split, innermost_split, reduced_split
from .hoist import hoist_invariants
from .optable import CTYPES
from . import prefetch, streaming
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
#: (``x.var()`` of 2**24 float32: 2.1e-5 off a float64 variance, Inductor 8.4e-8).
SETTLE = 64
#: Kept points per thread block in the outer schedule: ``coil::OUTER_BLOCK`` in the header,
#: sixteen vectors of float for the instruction set the kernel is built for. With AVX-512,
#: 256 (1 KiB of float per reduced element) was the fastest for ``x.sum(0)`` of 1536x4096
#: (64, 128 and 512 were slower; with only 8 reduced elements 128 was faster, which is left
#: alone). Built for AVX2 (``-mno-avx512f`` on the AMD EPYC, one thread, medians of 51 calls,
#: 2026-12-03), the same sum took 1.207 ms with 256, 0.695 with 128 and 0.901 with 64, while
#: the AVX-512 build took 0.496 / 0.721 / 0.978.
BLOCK = "block_max"
#: Stack bytes a thread's block may take at most, for its lanes' states and intermediates
#: (counted at 8 bytes an element): a wider block is narrowed to fit.
STACK_BYTES = 64 << 10
#: Elements of the innermost reduced dim each lane of the outer schedule takes in turn (see
#: ``_row_group``).
ROW_GROUP = 4
#: Kept points up to which the outer schedule takes reduced elements one at a time.
NARROW = 256
#: Elements of the outer schedule's innermost reduced dim accumulated into a partial state,
#: which is then combined into the lane's state: a long sum's rounding error then grows with
#: CHUNK + n / CHUNK additions rather than n (x.sum(0) of 65536x64 float32: largest error
#: against a float64 sum 4.8e-3 taking elements one by one, eager's cascade 1.1e-4). Past
#: CHUNK chunks, the partials settle in a second state every CHUNK chunks: 2 CHUNK +
#: n / CHUNK^2 (a column sum of 2^18 rows was 5-8x further from float64 than eager's: a hunt,
#: session 37).
CHUNK = 128
#: Kernels with at most this many kept points (known statically) use the split schedule,
#: unless their reduced dims are known to be too short to share among threads: the split
#: schedule opens a parallel region per kept point (an inactive one still costs a runtime
#: call and an ordered loop), which took 45 us for a log-softmax over 32 rows of 256 against
#: a few us for the inner schedule.
SMALL_X = 32


def reduction_kernel(kw: KernelWriter) -> None:
    schedule = choose_schedule(kw.k)
    if schedule == "outer":
        _outer(kw)
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
    x, r, n = k.x_vars[-1], k.r_vars[-1], k.x_ranges[-1]
    kept = set(k.x_vars)
    if split is not None:
        x, n = split.lo, sympy.Integer(split.divisor)
        kept |= {split.lo, split.hi}
    if n.is_number and int(n) < 16:
        return False
    along_x = along_r = 0
    for loop in k.loops:
        if loop.level != "r":
            continue
        for kn in loop.nodes:
            indices = [ld.index for ld in loads(kn.body) if ld.buffer not in k.internal
                       and (ld.indirect or ld.index.free_symbols & kept)]
            if not kn.is_reduction and kn.node.outputs()[0] not in k.internal:
                indices.append(kn.store_index)
            for e in indices:
                if split is not None:
                    e = fold_divmod(e).xreplace(split.substitutions())
                unit_x, unit_r = sympy.diff(e, x) == 1, sympy.diff(e, r) == 1
                along_x += unit_x and not unit_r
                along_r += unit_r
    return along_x >= along_r and along_x > 0


def _accumulators(loop: Loop) -> dict[str, Accumulator]:
    accs: dict[str, Accumulator] = {}
    for kn in loop.nodes:
        node = kn.node
        if isinstance(node, ReductionNode):
            accs[node.name] = accumulator(node.reduction_type, node.name, CTYPES[node.acc_dtype],
                                          CTYPES[kn.body.dtype])
    return accs


def _flat_r(k: Kernel) -> str:
    flat: sympy.Expr = sympy.Integer(0)
    for v, n in zip(k.r_vars, k.r_ranges):
        flat = flat * n + v
    return idx(flat)


def _r_body(kw: KernelWriter, loop: Loop, scope: ValueScope[str], accs: dict[str, Accumulator],
            prefix: str, lane: str, stashes: LoopStashes, counted: bool = False) -> None:
    """One (x, r) point of an r loop: pointwise nodes, and updates of the lane's states
    (``counted``: Welford states take their count from the chunk, see ``_counts``)."""
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
                kw.w.line(acc.update(prefix, lane, value, _flat_r(kw.k)))
    for s in stashes.writes:
        kw.w.line(f"{s.buffer}[{kw.idx(s.index)}] = {kw.value(s.value, scope)};")


def _results(kw: KernelWriter, loop: Loop, accs: dict[str, Accumulator], prefix: str, lane: str) -> None:
    for kn in loop.nodes:
        acc = accs.get(kn.node.name)
        if acc is not None:
            for i, out in enumerate(kn.node.outputs()):
                kw.store(out, kn.store_index, acc.result(prefix, lane, i), kn.node.layout.dtype,
                         store_name=kn.stores[i])


# -- inner and split schedules: lanes over the innermost reduced dim


def _lane_r_loop(kw: KernelWriter, loop: Loop, scope: ValueScope[str], split: bool,
                 stashes: LoopStashes, rsplit: Split | None, ahead: list[Load]) -> None:
    """An r loop in lanes; ``ahead``: loads to prefetch for the next kept point (:mod:`.prefetch`)."""
    accs = _accumulators(loop)
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
    with _parallel_region(kw, split):
        if settle:
            w.line(f"int64_t {settle} = 0;")
        for acc in _counts(accs):  # full chunks counted by the thread (see _lanes_over_r)
            w.line(f"{acc.ctype} count_{acc.name} = 0;")
        for prefix in ("lane_", "mid_") if settle else ("lane_",):
            for acc in accs.values():
                w.lines(acc.declare(prefix, lanes))
            w.line("#pragma omp simd")
            with w.block(for_header("lane", str(lanes)), "}"):
                for acc in accs.values():
                    w.lines(acc.init(prefix, "[lane]"))
        _lanes_over_r(kw, loop, scope, accs, split, stashes, lanes, rsplit, ahead, settle)
        if settle:  # the last partial states after the settled ones, back into the lanes
            w.line("#pragma omp simd")
            with w.block(for_header("lane", str(lanes)), "}"):
                for acc in accs.values():
                    w.line(acc.combine("mid_", "[lane]", "lane_", "[lane]"))
                    w.lines([f"{a} = {b};" for a, b in zip(acc.refs("lane_", "[lane]"), acc.refs("mid_", "[lane]"))])
        _combine_lanes(kw, accs, lanes)
        with _one_thread_at_a_time(kw, split):
            for acc in accs.values():
                w.line(acc.combine("acc_", "", "lane_", "[0]"))
    _results(kw, loop, accs, "acc_", "")


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
                  ahead: list[Load] | None = None, settle: str | None = None) -> None:
    """Full chunks of ``lanes`` elements of the innermost reduced dim, each one vector update
    of the lane arrays, then the leftover elements into the first lanes (either part is left
    out where the size is known and it would not run). With ``rsplit`` (lanes at its divisor,
    which divides the size), a chunk is one value of the split's outer variable and a lane
    one of its inner, and the indices say so (:func:`.divmod_split.reduced_split`). Each full
    chunk first prefetches ``ahead`` for the next kept point (:mod:`.prefetch`). ``settle``:
    the counter after whose ``SETTLE`` chunks the lanes settle (``mid_`` states), or None."""
    w = kw.w
    last, n = kw.k.r_vars[-1].name, kw.k.r_ranges[-1]
    size = int(n) if n.is_number else None
    full = f"{idx(n)} / {lanes} * {lanes}" if size is None else str(size // lanes * lanes)
    if size is None or size >= lanes:
        with _within_outer_r(kw, split, for_header(f"{last}_chunk", full, step=lanes)):
            if rsplit is not None:
                w.line(f"int64_t {rsplit.hi} = {last}_chunk / {lanes};")
            if ahead:
                prefetch.emit(kw, ahead, f"{last}_chunk", lanes)
            for acc in _counts(accs):  # every lane's Welford count is the thread's full chunks
                w.line(f"count_{acc.name} += {acc.ctype}(1);")
                w.line(f"const {acc.ctype} weight_{acc.name} = {acc.ctype}(1) / count_{acc.name};")
            w.line("#pragma omp simd")
            with w.block(for_header("lane", str(lanes)), "}"):
                w.line(f"int64_t {last} = {last}_chunk + lane;")
                if rsplit is not None:
                    w.line(f"int64_t {rsplit.lo} = lane;")
                with _substituted(kw, rsplit):
                    _r_body(kw, loop, scope.child(), accs, "lane_", "[lane]", stashes, counted=True)
            if settle:  # every SETTLE chunks, the lanes' partial states into the settled ones
                with w.block(f"if (++{settle} == {SETTLE}) {{", "}"):
                    w.line(f"{settle} = 0;")
                    w.lines([f"count_{acc.name} = 0;" for acc in _counts(accs)])
                    w.line("#pragma omp simd")
                    with w.block(for_header("lane", str(lanes)), "}"):
                        for acc in accs.values():
                            w.line(acc.combine("mid_", "[lane]", "lane_", "[lane]"))
                            w.lines(acc.init("lane_", "[lane]"))
    if size is None or size % lanes:
        with _within_outer_r(kw, split, for_header(last, n, start=full), simd=True):
            w.line(f"int64_t lane = {last} - {full};")
            _r_body(kw, loop, scope.child(), accs, "lane_", "[lane]", stashes)


def _counts(accs: dict[str, Accumulator]) -> list[Accumulator]:
    """The Welford states whose count the full chunks keep once per thread: every lane starts
    at 0 and takes one element per full chunk, so all lanes have the same count there."""
    return [acc for acc in accs.values() if acc.kind == "welford"]


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
def _within_outer_r(kw: KernelWriter, split: bool, innermost: str, simd: bool = False) -> Iterator[None]:
    """The ``innermost`` loop header inside loops over the outer reduced dims. In the split
    schedule the threads share the outer loops, or where there are none the innermost one
    (collapsing the vectorised loop's parent too makes GCC gather across its iterations)."""
    k = kw.k
    outer = [v.name for v in k.r_vars[:-1]]
    pragma = "#pragma omp simd" if simd else ""
    if split and outer:
        collapse = f" collapse({len(outer)})" if len(outer) > 1 else ""
        kw.w.line(f"#pragma omp for{collapse} nowait")
    elif split:
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
                        _r_body(kw, loop, scope.child(), {}, "", "", stashes)
        return
    collapse = f" collapse({len(k.r_ranges)})" if len(k.r_ranges) > 1 else ""
    streams = (streaming.plan(kw, loop.nodes, k.r_vars[0], k.r_ranges[0])
               if not split and len(k.r_ranges) == 1 and not stashes.writes and not stashes.reads else None)
    if streams is not None:
        with streaming.chunked(kw, streams):
            _r_body(kw, loop, scope.child(), {}, "", "", stashes)
        return
    if split:
        kw.w.line(f"#pragma omp parallel for simd{collapse} {parallel_if(sympy.Mul(*k.r_ranges))}")
    else:
        kw.w.line(f"#pragma omp simd{collapse}")
    with kw.loops([v.name for v in k.r_vars], k.r_ranges):
        _r_body(kw, loop, scope.child(), {}, "", "", stashes)


# -- outer schedule: lanes over a block of the innermost kept dim


def _outer(kw: KernelWriter) -> None:
    k, w = kw.k, kw.w
    names, ranges = [v.name for v in k.x_vars], list(k.x_ranges)
    split = innermost_split(k)
    if split is not None:  # blocks of the contiguous part, as a pointwise kernel's inner loop
        names[-1:] = [split.hi.name, split.lo.name]
        ranges[-1:] = [ranges[-1] // split.divisor, sympy.Integer(split.divisor)]
        kw.index_subs = split.substitutions()
        kw.lane_prelude = f"int64_t {split.var} = {split.divisor}*{split.hi} + {split.lo};"
    last, n = names[-1], ranges[-1]
    states = 3 if k.r_ranges and _settles(k.r_ranges[-1]) else 2  # with partial (and settled) states
    arrays = len(k.internal) + sum(states * len(acc.fields) for loop in k.loops if loop.level == "r"
                                   for acc in _accumulators(loop).values())
    widest = max(1, STACK_BYTES // (8 * max(1, arrays)))
    w.line(f"constexpr int64_t {BLOCK} = std::max<int64_t>(coil::OUTER_BLOCK, "
           f"std::min<int64_t>(coil::OUTER_BLOCK_MAX, {1 << (widest.bit_length() - 1)}));")
    w.line(f"const int64_t {last}_step = coil::outer_block({idx(n)}, {BLOCK});")
    kw.pragma(parallel_for(work(k), len(names)))
    with kw.loops(names[:-1], ranges[:-1]):
        with w.block(for_header(f"{last}_block", n, step=f"{last}_step"), "}"):
            w.line(f"int64_t width = std::min<int64_t>({last}_step, {idx(n)} - {last}_block);")
            for buf in sorted(k.internal):
                w.line(f"{kw.ctype(buf)} v_{buf}[{BLOCK}];")
            kw.lane = "[lane]"
            for loop in k.loops:
                if loop.level == "x":
                    with _over_block(kw, last):
                        kw.emit_nodes(loop.nodes, ValueScope())
                else:
                    _outer_r_loop(kw, loop, last, n)
            kw.lane = ""


def _row_group(n: sympy.Expr, kept: sympy.Expr) -> int:
    """Reduced elements of the outer schedule's innermost reduced dim that each lane takes in
    turn before the next lane (1: one at a time). Its state then stays in a register over the
    group, where with one at a time every element loads and stores the lane's accumulator.
    Only a static extent that the group divides is grouped, so no remainder loop is needed;
    and not when ``kept`` is a block or less: rows that short are read one after another
    anyway, and grouping them measured slower (x.sum(0) of 65536x64 with two threads, input
    out of cache: 0.63 -> 1.33 ms)."""
    if not n.is_number or (kept.is_number and int(kept) <= NARROW):
        return 1
    if int(n) > CHUNK:  # the groups then run within chunks
        return ROW_GROUP if CHUNK % ROW_GROUP == 0 and int(n) % ROW_GROUP == 0 else 1
    return next((g for g in (ROW_GROUP, 2) if int(n) % g == 0 and int(n) > g), 1)


@contextlib.contextmanager
def _over_block(kw: KernelWriter, last: str) -> Iterator[None]:
    kw.w.line("#pragma omp simd")
    with kw.w.block(for_header("lane", "width"), "}"):
        kw.w.line(f"int64_t {last} = {last}_block + lane;")
        if kw.lane_prelude:
            kw.w.line(kw.lane_prelude)
        yield


def _outer_r_loop(kw: KernelWriter, loop: Loop, last: str, kept: sympy.Expr) -> None:
    k, w = kw.k, kw.w
    accs = _accumulators(loop)
    for acc in accs.values():
        w.lines(acc.declare("acc_", BLOCK))
    if accs:
        with _over_block(kw, last):
            for acc in accs.values():
                w.lines(acc.init("acc_", "[lane]"))
    names, ranges = [v.name for v in k.r_vars], list(k.r_ranges)
    if not ranges:
        with _over_block(kw, last):
            _r_body(kw, loop, ValueScope(), accs, "acc_", "[lane]", LoopStashes())
    else:
        _outer_r_nest(kw, loop, last, accs, names, ranges, kept)
    if accs:
        with _over_block(kw, last):
            _results(kw, loop, accs, "acc_", "[lane]")


def _outer_r_nest(kw: KernelWriter, loop: Loop, last: str, accs: dict[str, Accumulator],
                  names: list[str], ranges: list[sympy.Expr], kept: sympy.Expr) -> None:
    """The reduced dims' loops of the outer schedule: the innermost in chunks (partial states
    combined into the lanes' states, see ``CHUNK``) and, inside a chunk, in groups that each
    lane takes in turn (see ``_row_group``)."""
    w = kw.w
    inner, n = names.pop(), ranges.pop()
    group = _row_group(n, kept)
    chunked = bool(accs) and not (n.is_number and int(n) <= CHUNK)
    # past CHUNK chunks, they settle in a mid_ state first (a cascade of three levels)
    settle = f"chunks_{next(iter(accs))}" if chunked and _settles(n) else None
    prefix = "part_" if chunked else "acc_"
    if chunked:
        for acc in accs.values():
            w.lines(acc.declare(prefix, BLOCK))
    if settle:
        for acc in accs.values():
            w.lines(acc.declare("mid_", BLOCK))
        with _over_block(kw, last):
            for acc in accs.values():
                w.lines(acc.init("mid_", "[lane]"))
        w.line(f"int64_t {settle} = 0;")
    with kw.loops(names, ranges), contextlib.ExitStack() as stack:
        start, end = "0", idx(n)
        if chunked:
            stack.enter_context(w.block(for_header(f"{inner}_chunk", n, step=CHUNK), "}"))
            with _over_block(kw, last):
                for acc in accs.values():
                    w.lines(acc.init(prefix, "[lane]"))
            start, end = f"{inner}_chunk", f"std::min<int64_t>({inner}_chunk + {CHUNK}, {idx(n)})"
        with contextlib.ExitStack() as body:
            if group > 1:  # each lane's state stays in a register over the group's elements
                body.enter_context(w.block(for_header(f"{inner}_group", end, start=start, step=group), "}"))
                body.enter_context(_over_block(kw, last))
                w.line(f"#pragma GCC unroll {group}")
                body.enter_context(w.block(for_header(inner, f"{inner}_group + {group}", start=f"{inner}_group"), "}"))
            else:
                body.enter_context(w.block(for_header(inner, end, start=start), "}"))
                body.enter_context(_over_block(kw, last))
            _r_body(kw, loop, ValueScope(), accs, prefix, "[lane]", LoopStashes())
        if chunked:
            with _over_block(kw, last):
                for acc in accs.values():
                    w.line(acc.combine("mid_" if settle else "acc_", "[lane]", prefix, "[lane]"))
        if settle:  # every CHUNK chunks, the settled partial into the lanes' states
            with w.block(f"if (++{settle} == {CHUNK}) {{", "}"):
                w.line(f"{settle} = 0;")
                _settle_mid(kw, last, accs)
    if settle:
        _settle_mid(kw, last, accs)


def _settles(n: sympy.Expr) -> bool:
    """Whether an innermost reduced dim of ``n`` elements takes more than CHUNK chunks."""
    return not (n.is_number and int(n) <= CHUNK * CHUNK)


def _settle_mid(kw: KernelWriter, last: str, accs: dict[str, Accumulator]) -> None:
    with _over_block(kw, last):
        for acc in accs.values():
            kw.w.line(acc.combine("acc_", "[lane]", "mid_", "[lane]"))
            kw.w.lines(acc.init("mid_", "[lane]"))
