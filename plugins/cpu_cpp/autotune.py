"""Schedules chosen by measurement: for a kernel big enough to matter, a few variants of its
loop schedule are compiled into the graph's library, timed at the kernel's first launch on
its real arguments, and the fastest is kept; the choice is cached on disk, so a later
process compiles only the winner.

Why: the plugin's schedule rules are constants measured on one machine, and another machine
may answer differently. Tiled transposes (:mod:`.tiling`) used 32x32 tiles, measured on an AMD
EPYC; on this project's Intel Xeon VM, ``x + y.t()`` of 1536x4096 float32 (one thread) took
11.0 ms with them and 6.1 ms with 64x64 tiles (the kernel alone as timed by the tuner, before
transposes went through registers; 16x16: 8.7, untiled: 44.2). The variants differ in one
choice each from the rule's schedule:

* streaming stores off, or on wherever the loop allows them (:mod:`.streaming`);
* the next row's prefetch in multi-pass reductions off (:mod:`.prefetch`);
* tiled transposes with tiles of 32 instead of 64 (:mod:`.tiling`).

None of them changes a result: the same operations in the same order, only how stores reach
memory, what is prefetched, and the order in which independent points are visited. (The
number of reduction lanes would change a sum's rounding, so it is not among them.)

The timing repeats the kernel on the same buffers, so they are in the caches: it understates
what streaming stores save where a kernel's outputs go to fresh memory, and a variant must
beat the rule's schedule by :data:`MIN_GAIN` to replace it.

Variants whose source is the rule's are dropped; a kernel with none left is not tuned. A
kernel is tuned only where running it twice gives what running it once does: no output over
an input's memory (:attr:`coil.sdk.Kernel.inplace`), no load of a buffer it writes (an
in-place update of a graph input), no scan, scatter or template; its sizes static and its
inputs and outputs at least :data:`MIN_BYTES` for one pass over them. At the first launch, two
buffer arguments at one address also leave that launch untuned.

The ``cpu_cpp.autotune`` option (``COIL_CPU_CPP_AUTOTUNE=1``) turns it on; it is off by
default, because the variants' compile and the timing lengthen a cold first call (the kernel
suite's pointwise chain 0.37 -> 0.60 s, layer norm 0.23 -> 0.40, on this project's 2-core
machine), where Coil's first call is meant to stay under half of Inductor's."""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sympy
import torch

import coil.sdk as sdk
from coil.sdk.diskcache import DiskCache

from .tiling import TILE

log = logging.getLogger(__name__)

#: Kernels that move fewer bytes than this in one pass over their inputs and outputs are not
#: tuned: a variant would save microseconds and cost a compile.
MIN_BYTES = 8 << 20
#: Timed calls per variant (after one warm-up call); the fastest counts.
CALLS = 5
#: Seconds of timing after which no further round starts (after two): a kernel of 20 ms
#: in three variants would otherwise take 0.4 s of its graph's first call.
BUDGET_S = 0.15
#: A variant must beat the rule's schedule by this share to replace it (timing noise).
MIN_GAIN = 0.03
#: Enters every key: raise it when the variants or the stored form change.
CACHE_FORMAT = "cpu-tune-2"


@dataclass(frozen=True)
class Variant:
    """One schedule: ``streaming`` "rule" (the cache-size rule), "off" or "on"."""

    name: str
    streaming: str = "rule"
    prefetch: bool = True
    tile: int = TILE


RULE = Variant("rule")
VARIANTS = (RULE, Variant("no-streaming", streaming="off"), Variant("streaming", streaming="on"),
            Variant("no-prefetch", prefetch=False), Variant("tile-64", tile=64))


def tunable(k: sdk.Kernel) -> bool:
    """Whether ``k`` may be run more than once on its launch's arguments and is big enough."""
    if k.special is not None or k.template is not None or k.inplace:
        return False
    points = sympy.Mul(*k.x_ranges, *k.r_ranges)
    if not points.is_number:
        return False
    per_point = sum(k.dtypes[b].itemsize for b in (*k.inputs, *k.outputs) if b in k.dtypes)
    if int(points) * per_point < MIN_BYTES:
        return False
    written = set(k.outputs)
    return not any(isinstance(v, sdk.Load) and v.buffer in written
                   for loop in k.loops for kn in loop.nodes for v in sdk.walk(kn.body))


def key(rule_body: str, names: Sequence[str], target: str) -> str:
    """The cache key of a kernel's choice: its schedule by the rule (canonical source), the
    variants it has, the machine and compiler (the backend's target key) and the threads."""
    text = "\n".join([rule_body, ",".join(names), target, str(torch.get_num_threads()), CACHE_FORMAT])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Choices:
    """Chosen variants in Coil's disk cache (:mod:`coil.sdk.diskcache`): one small JSON file
    per key, checked when read, evicted with the rest of the cache."""

    def __init__(self) -> None:
        self.store = DiskCache.in_namespace("cpu-autotune", layer="autotune")

    def get(self, key: str, count: bool = True) -> str | None:
        """The variant chosen for ``key``, or None; ``count``: as a hit or miss of the
        autotune layer (a kernel counts once, when it is generated)."""
        data = self.store.read(key, ".json", count=count)
        if data is None:
            return None
        try:
            return str(json.loads(data)["variant"])
        except (ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, variant: str, timings: dict[str, float], kernel: str) -> None:
        record = {"variant": variant, "kernel": kernel, "ms": timings}
        self.store.write(key, ".json", json.dumps(record, sort_keys=True).encode())


def choices() -> Choices:
    """The choices under the ``COIL_CACHE_DIR`` in force."""
    return Choices()


class Tuner:
    """What the wrapper calls for a kernel compiled in several variants: the first call times
    each (``functions``: variant name -> library function, the rule's first) on the call's
    arguments, caches the fastest and puts it in the module in its own place, so later calls
    go straight to the library."""

    def __init__(self, module: Any, kernel: str, key: str, functions: dict[str, Callable[..., None]],
                 buffers: int) -> None:
        self.module, self.kernel, self.key = module, kernel, key
        self.functions, self.buffers = functions, buffers
        #: The chosen function, for a caller that kept this tuner (a profiling wrapper).
        self.chosen: Callable[..., None] | None = None

    def __call__(self, *args: Any) -> None:
        if self.chosen is not None:
            self.chosen(*args)
            return
        pointers = args[:self.buffers]
        if len(set(pointers)) < len(pointers):  # maybe an output over an input: run once
            next(iter(self.functions.values()))(*args)
            return
        timings = _timings(self.functions, args)
        rule = timings[RULE.name]
        name = min(timings, key=timings.__getitem__)
        if timings[name] > rule * (1 - MIN_GAIN):
            name = RULE.name
        log.debug("coil: %s: %s chosen (ms: %s)", self.kernel, name,
                  ", ".join(f"{n} {t:.3f}" for n, t in timings.items()))
        try:
            choices().put(self.key, name, timings, self.kernel)
        except OSError as exc:  # a read-only or full cache: the choice holds for this process
            log.warning("coil: could not store the schedule chosen for %s: %s", self.kernel, exc)
        self.chosen = self.functions[name]
        setattr(self.module, self.kernel, self.chosen)
        self.chosen(*args)  # the outputs as the chosen schedule writes them


def _timings(functions: dict[str, Callable[..., None]], args: Sequence[Any]) -> dict[str, float]:
    """Milliseconds of each function's fastest call on ``args``: one warm-up call each (pages
    touched, code loaded), then up to :data:`CALLS` rounds calling each in turn, so that a
    drift of the machine's speed falls on all alike (no round after two past
    :data:`BUDGET_S`)."""
    for fn in functions.values():
        fn(*args)
    best = dict.fromkeys(functions, float("inf"))
    start = time.perf_counter()
    for round_ in range(CALLS):
        if round_ >= 2 and time.perf_counter() - start > BUDGET_S:
            break
        for name, fn in functions.items():
            t0 = time.perf_counter()
            fn(*args)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: t * 1e3 for name, t in best.items()}
