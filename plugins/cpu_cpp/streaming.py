"""Streaming stores: a kernel that moves more bytes than the last-level cache holds writes its
outputs around the caches.

A plain store to a line that is not in the cache first reads the line from memory (the
"read for ownership"), so a kernel that reads one 24 MiB tensor and writes another moves
72 MiB, not 48; its written lines also evict data it reads again. A non-temporal store
writes a whole line without reading it. Measured on RMS norm (1536x4096 float32, the kernel
alone through ctypes, five inputs in turn so that none stays in the cache, one thread, AMD
EPYC with 32 MiB of L3, 2026-12-05, medians of 41 rounds of 20 calls): as generated before
3.05 ms, with streaming stores 1.87, Inductor's kernel 2.70.

So a loop that writes outputs along its innermost variable with unit stride computes a chunk
of one cache line per output into aligned locals (the ``omp simd`` loop as before) and
streams each line (``coil::stream_line``: non-temporal where the destination is
line-aligned, plain stores elsewhere), with ``coil::stream_fence`` after each row and at
the end of each thread's share. Where:

* the plugin's ``streaming`` option is on (``COIL_CPU_CPP_STREAMING``, default on) and the
  kernel's static iteration space times the bytes of an element of each input and output
  (what it moves if each is touched once per point) is at least the last-level cache
  (:func:`llc_bytes`, part of the backend's target key), and the streamed outputs alone at
  least half of it: below that, the output may still be in the cache when the next kernel
  reads it, which a streaming store would give up;
* every output stored in the loop has one element size, dividing 64 bytes, and the loop's
  length is a whole number of lines of at least :data:`MIN_ROW_BYTES` (a fence per row);
* no node of the loop loads what the loop stores (it would read memory the line has not
  reached yet), and (in a reduction kernel's last pass) the pass reads no stash: a softmax
  keeps its exponentials in the output, so those lines are in the cache already, and a
  streaming store to a cached line costs more than it saves (softmax 3.26 -> 3.75 ms in
  ``bench/cpu.py``, one thread, with the exponentials moved to a scratch row so that the
  last pass could stream).

In ``bench/cpu.py`` (one thread, a process per setting, two runs each, same host as above):
RMS norm 2.87/3.38 -> 2.17/2.14 ms, layer norm 3.56/3.91 -> 2.26/2.22; the pointwise chain,
bias+GELU+residual in bf16 and cross-entropy unchanged (compute-bound, or small outputs)."""
from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import sympy

from coil.sdk import Kernel, KernelNode, Load, ReductionNode

from .cpp import for_header
from .hoist import unmasked
from .optable import CTYPES

if TYPE_CHECKING:
    from .codegen import KernelWriter

#: Bytes per cache line.
LINE = 64
#: Shortest row that streams: each row ends with a fence, which waits for its lines.
MIN_ROW_BYTES = 1024


@functools.lru_cache(maxsize=None)
def llc_bytes() -> int:
    """Bytes of the last-level cache this process can count on: the largest cache level of
    CPU 0 (sysfs, else ``sysconf``), at most :data:`SHARE_PER_CPU` per CPU sharing it; 0 when
    unknown, which turns streaming off."""
    best = (0, 0, 1)
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
            sharing = _cpu_count((index / "shared_cpu_list").read_text())
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        size = int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text or 0)
        best = max(best, (level, size, sharing))
    if best[1]:
        return min(best[1], SHARE_PER_CPU * best[2])
    try:
        return max(0, int(os.sysconf("SC_LEVEL3_CACHE_SIZE")))
    except (ValueError, OSError, AttributeError):
        return 0


#: The most last-level cache a CPU sharing it is counted for. A virtual machine of a few
#: CPUs may report its host's whole cache: this project's 2-CPU Intel Xeon VM reports 480 MiB
#: of L3, so the rule never streamed there, and layer norm (1536x4096 float32, one thread,
#: one process, alternating) took 2.5-5.5 ms without streaming stores against 2.8-3.0 with
#: them (eager 3.0-5.1). 16 MiB per CPU keeps the 2-CPU AMD EPYC's 32 MiB (the rule's
#: measurements above) and any machine whose cache is at most that per CPU.
SHARE_PER_CPU = 16 << 20


def _cpu_count(cpu_list: str) -> int:
    """How many CPUs a sysfs list (``0-3,8``) names; at least 1."""
    count = 0
    for part in cpu_list.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            count += int(hi) - int(lo) + 1
        elif part:
            count += 1
    return max(1, count)


def _itemsize(kw: KernelWriter, buf: str) -> int:
    dtype = kw.k.dtypes.get(buf)
    return dtype.itemsize if dtype is not None else 0  # type: ignore[union-attr]


def moves_more_than_cache(kw: KernelWriter) -> bool:
    """Whether the kernel's points times its buffers' element bytes reach the LLC."""
    k: Kernel = kw.k
    points = sympy.Mul(*k.x_ranges, *k.r_ranges)
    llc = kw.llc
    if not llc or not points.is_number:
        return False
    per_point = sum(_itemsize(kw, b) for b in (*k.inputs, *k.outputs))
    return int(points) * per_point >= llc


@dataclass(frozen=True)
class Streams:
    """A loop that streams: its variable, length, chunk (elements per line) and the store
    names it streams (each an output of the kernel) with their C++ element types."""

    var: sympy.Symbol
    length: int
    chunk: int
    ctypes: dict[str, str]


def plan(kw: KernelWriter, nodes: list[KernelNode], var: sympy.Symbol, size: sympy.Expr) -> Streams | None:
    """How the loop over ``var`` (of ``size``) that runs ``nodes`` streams its stores; None
    where it stores as before."""
    if not size.is_number or not moves_more_than_cache(kw):
        return None
    sizes: set[int] = set()
    ctypes: dict[str, str] = {}
    for kn in nodes:
        if isinstance(kn.node, ReductionNode):
            return None
        buf = kn.node.outputs()[0]
        if buf in kw.k.internal:
            continue
        if sympy.diff(kn.store_index, var) != 1:
            return None
        sizes.add(kn.node.layout.dtype.itemsize)
        ctypes[kn.stores[0]] = CTYPES[kn.node.layout.dtype]
    if not ctypes or len(sizes) != 1 or LINE % next(iter(sizes)):
        return None
    itemsize = sizes.pop()
    points = int(sympy.Mul(*kw.k.x_ranges, *kw.k.r_ranges))
    if points * itemsize * len(ctypes) * 2 < kw.llc:
        return None  # the outputs would fit in half the cache: the next kernel may read them there
    chunk, length = LINE // itemsize, int(size)
    if length % chunk or length * itemsize < MIN_ROW_BYTES:
        return None
    stored = set(ctypes) | {kn.node.outputs()[0] for kn in nodes}
    for kn in nodes:
        if any(isinstance(v, Load) and v.buffer in stored for v in unmasked(kn.body)):
            return None
    return Streams(var, length, chunk, ctypes)


@contextlib.contextmanager
def chunked(kw: KernelWriter, streams: Streams, pragma: str = "") -> Iterator[None]:
    """The loop of ``streams`` in chunks of a line (``pragma`` before it: an ``omp for``
    sharing the chunks): the body, emitted inside, stores into the chunk's locals
    (``kw.streams`` set meanwhile), which are then streamed; a fence after the loop."""
    v, chunk = streams.var.name, streams.chunk
    kw.streams, kw.streamed = streams, {}
    try:
        kw.pragma(pragma)
        with kw.w.block(for_header(f"{v}_c", sympy.Integer(streams.length), step=chunk), "}"):
            for name, ctype in streams.ctypes.items():
                kw.w.line(f"alignas(64) {ctype} s_{name}[{chunk}];")
            kw.w.line("#pragma omp simd")
            with kw.w.block(for_header(v, f"{v}_c + {chunk}", start=f"{v}_c"), "}"):
                yield
            for name, start in kw.streamed.items():
                kw.w.line(f"coil::stream_line(&{name}[{start}], s_{name});")
    finally:
        kw.streams, kw.streamed = None, {}
    kw.w.line("coil::stream_fence();")


def store_line(kw: KernelWriter, store_name: str, index: sympy.Expr, value: str, ctype: str) -> str | None:
    """The store into a streamed chunk's local, or None when ``store_name`` is not streamed;
    remembers the line's index (the store's, at the chunk's start)."""
    if kw.streams is None or store_name not in kw.streams.ctypes:
        return None
    var = kw.streams.var
    start = sympy.Symbol(f"{var.name}_c", integer=True, nonnegative=True)
    kw.streamed[store_name] = kw.idx(sympy.sympify(index).subs(var, start))
    return f"s_{store_name}[{var.name} - {start}] = coil::cast<{ctype}>({value});"


__all__ = ["plan", "chunked", "store_line", "llc_bytes", "Streams", "LINE", "MIN_ROW_BYTES"]
