"""Replaying a compiled graph as one CUDA graph (``coil.capture`` decides when).

The call that records runs the graph once normally first (kernels tune and load there:
nothing may synchronise during capture), then records it. With ``measure``
(``graph_capture=auto``) that is the second call: the first runs as compiled and returns, so
a process's first result does not wait for a recording that may be dropped (the recording,
its warm-up on a side stream and the measurement took 0.12 s of the GPT block's 0.64 s warm
first call on the H200, and 0.2 s of BERT-base's). Without ``measure`` it is the first call.
Inputs the core marks static (parameters, buffers) are recorded at their own address; every
other tensor input gets a buffer of the recording's own, which later calls copy into (skipped
when the caller passes that very buffer). Outputs are cloned out of the recording's memory, so a result the caller keeps is
never overwritten by the next replay. Calls from several threads take turns (a lock), and a
replay on another stream first waits for the last one's copies: two callers never share the
recording's buffers at once.

A call whose static input moved (a parameter replaced) records again, up to
:data:`MAX_RECORDINGS` times, then runs the graph normally for good; a call whose non-tensor
input differs from the recorded one runs the graph normally. With ``measure``, the recording
call also times the replay against the graph's own launches and keeps the recording only when
its replay is faster by :data:`KEEP_RATIO` (host-bound graphs of many small kernels gain; a
graph of large kernels gains nothing and pays the output copies). A graph whose GPU work
takes :data:`GPU_BOUND_RATIO` times as long as launching it is not measured at all: its
launches already run ahead of the GPU, and timing both sides would cost the recording call
some twenty calls of a long graph (2.4 s of a 0.1 s block on the H200)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

import torch

log = logging.getLogger(__name__)

#: Most recordings of one graph (the first, and one per moved static input) before it runs
#: without one.
MAX_RECORDINGS = 3
#: With ``measure``, the replay is kept when it takes at most this fraction of the launches'
#: time per call.
KEEP_RATIO = 0.9
#: Calls per timing round of the measurement; the best of :data:`ROUNDS` rounds counts, the
#: two sides taking turns (each first in every other round) after one untimed call each, so
#: neither pays alone for a GPU whose clocks are still rising.
CALLS = 3
ROUNDS = 3
#: With ``measure``, a graph whose warm-up call kept the GPU busy this many times as long as
#: the host took to launch it is neither recorded nor measured.
GPU_BOUND_RATIO = 3.0


def copy_out(t: torch.Tensor) -> torch.Tensor:
    """A copy of an output out of the recording's memory, with ``t``'s own strides. An output
    that is a view with gaps (a padded product's columns: GPT-2's logits are 50257 of 50264)
    is copied as the whole region it spans, in one contiguous copy, and viewed the same way:
    ``clone()`` would compact it element by element, which took GPT-2's 823 MB of logits 0.95
    ms on the H200."""
    if t.is_contiguous() or t.numel() == 0 or any(s < 0 for s in t.stride()):
        return t.clone()
    span = 1  # elements from the first to one past the last, dims taken by rising stride
    for stride, n in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if stride < span:
            return t.clone()  # elements overlap (an expanded dim)
        span += (n - 1) * stride
    if span > 2 * t.numel():
        return t.clone()  # a sparse view: copying its span would copy mostly gaps
    region = t.as_strided((span,), (1,)).clone()
    return region.as_strided(t.shape, t.stride())


#: Outputs of a recording copied out together: their positions, and the first element and
#: the element count of the storage region they span.
Region = tuple[tuple[int, ...], int, int]


def shared_regions(outputs: Sequence[Any]) -> list[Region]:
    """The outputs of a recording that :func:`copy_outputs` copies out as one region: those
    over one storage (a result and its slices, the items of an ``unbind``) or with a zero
    stride (an expanded result). Copied apart, the views would stop sharing memory, as eager's
    do, and an expanded one would become dense. Found once per recording: a replay writes the
    same tensors."""
    by_storage: dict[int, list[int]] = {}
    for i, o in enumerate(outputs):
        if isinstance(o, torch.Tensor) and o.numel() > 0 and all(st >= 0 for st in o.stride()):
            by_storage.setdefault(o.untyped_storage().data_ptr(), []).append(i)
    regions = []
    for members in by_storage.values():
        ts = [outputs[i] for i in members]
        if (len(ts) < 2 and not any(st == 0 and n > 1 for n, st in zip(ts[0].shape, ts[0].stride()))) \
                or len({t.dtype for t in ts}) != 1:
            continue
        lo = min(t.storage_offset() for t in ts)
        hi = max(t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) for t in ts) + 1
        regions.append((tuple(members), lo, hi - lo))
    return regions


def copy_outputs(outputs: Sequence[Any], regions: Sequence[Region]) -> tuple[Any, ...]:
    """Copies of a replay's outputs out of the recording's memory: each of ``regions``
    (:func:`shared_regions`) in one copy, viewed as its outputs were, the others by
    :func:`copy_out`."""
    out = list(outputs)
    together = set()
    for members, lo, span in regions:
        region = outputs[members[0]].as_strided((span,), (1,), lo).clone()
        for i in members:
            t = outputs[i]
            out[i] = region.as_strided(t.shape, t.stride(), t.storage_offset() - lo)
        together.update(members)
    return tuple(copy_out(o) if isinstance(o, torch.Tensor) and i not in together else o
                 for i, o in enumerate(out))


class GraphReplay:
    def __init__(self, fn: Callable[[list[Any]], Any], static: frozenset[int] = frozenset(),
                 measure: bool = False) -> None:
        self.fn = fn
        self.static = static
        self.measure = measure
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[Any] = []  # what the recording reads: static inputs themselves, else its own copies
        # what each call checks, by kind of input: (index, value) of non-tensors, (index,
        # address) of static tensors, (index, own buffer) of the tensors copied in
        self._scalars: list[tuple[int, Any]] = []
        self._fixed: list[tuple[int, int]] = []
        self._copied: list[tuple[int, torch.Tensor]] = []
        self.outputs: Any = None
        self._regions: list[Region] = []  # outputs copied out together (:func:`shared_regions`)
        self.recordings = 0
        self._first_call_due = measure  # with ``measure``, the first call runs without recording
        self.disabled = ""  # why the graph now runs without a recording
        self.timings: tuple[float, float] | None = None  # (replay ms, launches ms)
        self._lock = threading.Lock()
        self._done: torch.cuda.Event | None = None  # recorded after the last replay's output copies

    def __call__(self, args: list[Any]) -> Any:
        if self.disabled:
            return self.fn(args)
        with self._lock:  # one caller at a time between copying inputs in and outputs out
            return self._call(args)

    def _call(self, args: list[Any]) -> Any:
        if self.graph is None:
            if self._first_call_due:
                self._first_call_due = False
                return self.fn(args)
            return self._record(args)
        for i, value in self._scalars:
            if args[i] != value:  # a scalar the recording baked in: this call runs as compiled
                return self.fn(args)
        for i, ptr in self._fixed:
            if args[i].data_ptr() != ptr:  # a parameter moved
                return self._record(args)
        if self._done is not None:  # the last replay, perhaps on another stream, is done reading
            torch.cuda.current_stream().wait_event(self._done)
        self._copy_in(args)
        args.clear()
        return self._replay()

    def _copy_in(self, args: list[Any]) -> None:
        """The call's non-static tensors into the recording's own buffers."""
        for i, mine in self._copied:
            a = args[i]
            if a.data_ptr() != mine.data_ptr():
                mine.copy_(a)

    def describe(self) -> str:
        times = (f" (replay {self.timings[0]:.3f} ms against launches {self.timings[1]:.3f} ms per call)"
                 if self.timings else "")
        if self.disabled:
            return f"CUDA graph not used: {self.disabled}{times}"
        if self.graph is None:
            return "CUDA graph: recorded on the second call" if self.measure else "CUDA graph: recorded on the first call"
        return f"CUDA graph replayed{times}"

    def _replay(self) -> Any:
        stream = torch.cuda.current_stream()
        self.graph.replay()
        out = copy_outputs(self.outputs, self._regions)
        if self._done is None:
            self._done = torch.cuda.Event()
        self._done.record(stream)  # a wait already queued keeps the state it saw
        return out

    def _disable(self, why: str) -> None:
        self.disabled = why
        self.graph, self.inputs, self.outputs = None, [], None
        self._scalars, self._fixed, self._copied = [], [], []
        log.debug("coil: %s", why)

    def _record(self, args: list[Any]) -> Any:
        first = self.fn(list(args))  # tunes and loads every kernel
        if self.recordings >= MAX_RECORDINGS:
            self._disable(f"static inputs moved {self.recordings} times")
            args.clear()
            return first
        self.recordings += 1
        self.graph = None
        self.inputs = [a.clone() if isinstance(a, torch.Tensor) and i not in self.static else a
                       for i, a in enumerate(args)]
        tensors = [(i, t) for i, t in enumerate(self.inputs) if isinstance(t, torch.Tensor)]
        self._scalars = [(i, a) for i, a in enumerate(self.inputs) if not isinstance(a, torch.Tensor)]
        self._fixed = [(i, t.data_ptr()) for i, t in tensors if i in self.static]
        self._copied = [(i, t) for i, t in tensors if i not in self.static]
        caller = list(args)  # for the measurement: a real call copies these in
        args.clear()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(side):
                start.record()
                began = time.perf_counter()
                self.fn(list(self.inputs))  # warm-up on the capture stream, as CUDA asks
                launch_ms = 1e3 * (time.perf_counter() - began)
                end.record()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            gpu_ms = start.elapsed_time(end)
            if self.measure and gpu_ms > GPU_BOUND_RATIO * launch_ms:
                self._disable(f"the GPU is busy {gpu_ms:.3f} ms per call against {launch_ms:.3f} ms "
                              "to launch it (a replay would save nothing)")
                return first
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs = self.fn(list(self.inputs))
        except Exception as exc:  # noqa: BLE001 - an op that cannot be recorded: run as compiled
            self._disable(f"recording failed ({type(exc).__name__}: {exc})")
            log.warning("coil: a CUDA graph could not be recorded; the graph runs without one: %s", exc)
            return first
        self.graph = graph
        self._regions = shared_regions(self.outputs)
        if self.measure and self.timings is None:
            self._choose(caller)
        return first

    def _choose(self, caller: list[Any]) -> None:
        """Time the replay against the graph's own launches; keep the faster. The replay's
        side copies the non-static inputs in from the caller's arguments, as every later call
        does: a graph whose inputs are large (weights passed as arguments) pays more for the
        copies than its replay saves."""
        def replay() -> Any:
            self._copy_in(caller)
            return self._replay()

        def timed(run: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(CALLS):
                run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / CALLS

        sides = [replay, lambda: self.fn(list(self.inputs))]
        for run in sides:
            run()
        best = [float("inf"), float("inf")]
        for r in range(ROUNDS):
            for i in ((0, 1) if r % 2 else (1, 0)):
                best[i] = min(best[i], timed(sides[i]))
        replay_ms, launches_ms = best
        self.timings = (replay_ms, launches_ms)
        if replay_ms > KEEP_RATIO * launches_ms:
            self._disable("its replay was not faster than the launches")
