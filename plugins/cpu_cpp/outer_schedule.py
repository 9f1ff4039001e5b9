"""The outer schedule of reduction kernels: when the accesses are contiguous along the
innermost *kept* dim (``x.sum(0)`` of a row-major matrix, a batch norm's statistics in
channels-last), threads split blocks of that dim and the lanes take consecutive kept points,
so each lane's state is one output; the reduced dims run outside, and every access stays
contiguous (:mod:`.reduction_loops` chooses the schedule)."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Sequence

import sympy

from coil.sdk import Loop
from coil.sdk.codegen import ValueScope

from .accumulators import Accumulator
from .cpp import for_header, idx, parallel_for
from .divmod_split import Split, innermost_split
from .lane_access import contiguous_along_lanes
from .reduction_body import accumulators_of, r_body, results
from .stash import LoopStashes

if TYPE_CHECKING:
    from .codegen import KernelWriter

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
#: Reduced elements accumulated into a partial state, which is then combined into the lane's
#: state: a long sum's rounding error then grows with CHUNK + n / CHUNK additions rather than
#: n (x.sum(0) of 65536x64 float32: largest error against a float64 sum 4.8e-3 taking
#: elements one by one, eager's cascade 1.1e-4). Past CHUNK chunks, the partials settle in a
#: second state every CHUNK chunks: 2 CHUNK + n / CHUNK^2 (a column sum of 2^18 rows was 5-8x
#: further from float64 than eager's: a hunt, session 37). A chunk is CHUNK elements of the
#: innermost reduced dim, or where that dim is shorter, whole passes over it, as many as fit
#: in CHUNK elements: counting only the innermost dim left a batch norm's sums in
#: channels-last (over N, H and W, with W innermost and short) 50x further from float64 than
#: eager's (session 39).
CHUNK = 128
#: The states of the outer schedule's cascade below the lanes' own (``acc_``): a chunk's
#: partial states, and those settled every CHUNK chunks, and those every CHUNK settlings.
_LEVELS = ("part_", "mid_", "high_")


def outer(kw: KernelWriter, work: sympy.Expr) -> None:
    """The kernel in the outer schedule; ``work``: its points, for the parallel threshold."""
    k, w = kw.k, kw.w
    names, ranges = [v.name for v in k.x_vars], list(k.x_ranges)
    split = innermost_split(k)
    if split is not None:  # blocks of the contiguous part, as a pointwise kernel's inner loop
        names[-1:] = [split.hi.name, split.lo.name]
        ranges[-1:] = [ranges[-1] // split.divisor, sympy.Integer(split.divisor)]
        kw.index_subs = split.substitutions()
        kw.lane_prelude = f"int64_t {split.var} = {split.divisor}*{split.hi} + {split.lo};"
    last, n = names[-1], ranges[-1]
    states = 1 + _depth(k.r_ranges)  # the lanes' states, partial and settled ones
    arrays = len(k.internal) + sum(states * len(acc.fields) for loop in k.loops if loop.level == "r"
                                   for acc in accumulators_of(loop).values())
    widest = max(1, STACK_BYTES // (8 * max(1, arrays)))
    w.line(f"constexpr int64_t {BLOCK} = std::max<int64_t>(coil::OUTER_BLOCK, "
           f"std::min<int64_t>(coil::OUTER_BLOCK_MAX, {1 << (widest.bit_length() - 1)}));")
    w.line(f"const int64_t {last}_step = coil::outer_block({idx(n)}, {BLOCK});")
    kw.pragma(parallel_for(work, len(names)))
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
                    _outer_r_loop(kw, loop, last, n, split)
            kw.lane = ""


def _row_group(n: sympy.Expr, kept: sympy.Expr, contiguous: bool) -> int:
    """Reduced elements of the outer schedule's innermost reduced dim that each lane takes in
    turn before the next lane (1: one at a time). Its state then stays in a register over the
    group, where with one at a time every element loads and stores the lane's accumulator.
    Only a static extent that the group divides is grouped, so no remainder loop is needed;
    and not when ``kept`` is a block or less: rows that short are read one after another
    anyway, and grouping them measured slower (x.sum(0) of 65536x64 with two threads, input
    out of cache: 0.63 -> 1.33 ms); nor unless every access is ``contiguous`` along the lanes
    (:func:`.lane_access.contiguous_along_lanes`: GCC's build time)."""
    if not contiguous or not n.is_number or (kept.is_number and int(kept) <= NARROW):
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


def _outer_r_loop(kw: KernelWriter, loop: Loop, last: str, kept: sympy.Expr, split: Split | None) -> None:
    k, w = kw.k, kw.w
    accs = accumulators_of(loop)
    for acc in accs.values():
        w.lines(acc.declare("acc_", BLOCK))
    if accs:
        with _over_block(kw, last):
            for acc in accs.values():
                w.lines(acc.init("acc_", "[lane]"))
    names, ranges = [v.name for v in k.r_vars], list(k.r_ranges)
    if not ranges:
        with _over_block(kw, last):
            r_body(kw, loop, ValueScope(), accs, "acc_", "[lane]", LoopStashes())
    else:
        _outer_r_nest(kw, loop, last, accs, names, ranges, kept, split)
    if accs:
        with _over_block(kw, last):
            results(kw, loop, accs, "acc_", "[lane]")


def _outer_r_nest(kw: KernelWriter, loop: Loop, last: str, accs: dict[str, Accumulator],
                  names: list[str], ranges: list[sympy.Expr], kept: sympy.Expr, split: Split | None) -> None:
    """The reduced dims' loops of the outer schedule: elements accumulated in chunks (partial
    states combined into the lanes' states, see ``CHUNK``), and inside a chunk in groups that
    each lane takes in turn (see ``_row_group``)."""
    w = kw.w
    levels = [*_LEVELS[:_depth(ranges) if accs else 0], "acc_"]  # the cascade, partial states first
    chunked = len(levels) > 1
    inner, n = names.pop(), ranges.pop()
    group = _row_group(n, kept, contiguous_along_lanes(kw.k, loop, split))
    within = chunked and not (n.is_number and int(n) <= CHUNK)  # chunks within the innermost dim
    # a chunk is this many passes over a shorter innermost dim, counted by ``part_<name>_count``;
    # a symbolic dim is chunked within and counted, and its count known when the call runs
    # (a pass per chunk, a chunk of 2 elements where the dim was 2: 27x further from float64
    # than eager under dynamic=True; a hunt, session 39)
    passes = str(max(1, CHUNK // int(n)) if int(n) > 0 else 1) if n.is_number else \
        f"std::max<int64_t>(1, {CHUNK} / std::max<int64_t>(1, {idx(n)}))"
    counted = chunked and not (within and n.is_number)
    first = next(iter(accs), "")
    # each level's counter: the partial states' counts passes, the others the flushes of the
    # level below into theirs
    counters = [f"{level}{first}_count" for level in levels[:-1]]
    for level in levels[:-1]:
        for acc in accs.values():
            w.lines(acc.declare(level, BLOCK))
        with _over_block(kw, last):
            for acc in accs.values():
                w.lines(acc.init(level, "[lane]"))
    for counter in counters if counted else counters[1:]:
        w.line(f"int64_t {counter} = 0;")
    prefix = levels[0]
    with kw.loops(names, ranges), contextlib.ExitStack() as stack:
        start, end = "0", idx(n)
        if within:
            stack.enter_context(w.block(for_header(f"{inner}_chunk", n, step=CHUNK), "}"))
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
            r_body(kw, loop, ValueScope(), accs, prefix, "[lane]", LoopStashes())
        if counted:
            with w.block(f"if (++{counters[0]} >= {passes}) {{", "}"):
                w.line(f"{counters[0]} = 0;")
                _flush(kw, last, accs, levels, counters)
        elif chunked:
            _flush(kw, last, accs, levels, counters)
    for i in range(0 if counted else 1, len(levels) - 1):  # what the last chunks left
        _settle(kw, last, accs, levels[i + 1], levels[i])


def _depth(rranges: Sequence[sympy.Expr]) -> int:
    """How many levels of ``_LEVELS`` the outer schedule keeps for reduced dims of
    ``rranges``: one more for each power of CHUNK the reduced elements exceed (the lanes'
    states then take at most CHUNK combines: with two levels, ``[2^20, 4, 17].sum((0, 1))``
    under dynamic=True added 256 settled sums of 16384 elements each, 5x further from float64
    than eager; a hunt, session 39)."""
    total = sympy.Mul(*rranges)
    if not rranges:
        return 0
    return sum(1 for bound in (CHUNK, CHUNK ** 2, CHUNK ** 3) if not (total.is_number and int(total) <= bound))


def _flush(kw: KernelWriter, last: str, accs: dict[str, Accumulator], levels: list[str],
           counters: list[str], i: int = 0) -> None:
    """``levels[i]``'s states into the next level's; every CHUNK such flushes (counted by the
    next level's counter), that level's into the one above, and so on up to the lanes'."""
    _settle(kw, last, accs, levels[i + 1], levels[i])
    if i + 2 < len(levels):
        with kw.w.block(f"if (++{counters[i + 1]} == {CHUNK}) {{", "}"):
            kw.w.line(f"{counters[i + 1]} = 0;")
            _flush(kw, last, accs, levels, counters, i + 1)


def _settle(kw: KernelWriter, last: str, accs: dict[str, Accumulator], into: str, prefix: str) -> None:
    """Each lane's ``prefix`` state combined into its ``into`` state and started again."""
    with _over_block(kw, last):
        for acc in accs.values():
            kw.w.line(acc.combine(into, "[lane]", prefix, "[lane]"))
            kw.w.lines(acc.init(prefix, "[lane]"))
