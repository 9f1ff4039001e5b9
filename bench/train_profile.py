"""Where a training step of one zoo model spends its time and its memory, named after Coil's kernels.

Two modes, each on one model of ``tests/models/zoo.py`` and one backend (``coil``, ``inductor``
or ``eager``). A step is ``bench/train_side_by_side.py``'s: ``zero_grad(set_to_none=True)``,
forward and loss under bf16 autocast (float32 with ``--precision fp32``), backward, SGD.

``kernels``: three warm-up steps (inference calls in ``eval()`` under ``no_grad`` with
``--infer``), then ``--steps`` steps under ``torch.profiler``; the top
``--top`` kernels by device time per step, each with the Coil kernels it runs for (``kN_<ops>``,
the ATen ops they fuse, the graphs they are in), and the copy-like ATen ops (``copy_``,
``clone``, ``_to_copy``...) with their input shapes. On the GPU the profiler names a Triton
kernel of Coil's ``coil_<digest>``: one canonical function serves every kernel that differs
only in names (``coil_cuda_triton.dedup``), so the tool wraps ``dedup.canonical`` during the
compile to learn which ``kN_...`` kernels each digest stands for, and writes the top kernels'
Triton sources to ``--out``. On the CPU there is no device time: the rows are the ops'
self CPU time, Coil's kernels timed by ``profile_kernels``'s ``coil:<kernel>`` ranges and named
from Coil's report directly (their C++ sources go to ``--out``).

``memory``: after the warm-up, one step under
``torch.cuda.memory._record_memory_history(stacks="python")``; the trace is replayed to find the
peak of live bytes above the step's start, and the blocks live at that peak are grouped by
the frame that allocated them: the innermost Python frame outside torch and Coil's own
packages, which is ``<coil-wrapper>:LINE call`` for Coil's generated wrapper (with the text of
that line in each graph's wrapper that has one, since every wrapper shares that file name),
Inductor's generated module for Inductor, the model's code for eager. On the CPU the step
runs under the profiler's memory events instead, and blocks are named by the innermost
profiler range around their allocation (``bench/cpu_memory.py``); ``--batch N`` keeps the
first N samples of the inputs (the real widths at a batch the CPU runs in seconds).

``kernels`` compiles with Coil's graph cache off (``coil.config.override(graph_cache=False)``):
a graph loaded from that cache skips codegen, so no canonical function would be made and no
digest mapped to a kernel's name (a cached graph's report, which ``memory`` reads for the
wrapper's lines, comes back whole). Plain text goes to stdout; with ``--out DIR`` the same
rows go to ``DIR/<model>_<backend>_<mode>.json``, with the sources next to it.

    python3 bench/train_profile.py kernels tv_resnet18 --device cuda --top 25 --out /tmp/prof
    python3 bench/train_profile.py kernels tv_resnet18 --backend inductor --device cuda
    python3 bench/train_profile.py kernels timm_swin_tiny --device cuda --infer
    python3 bench/train_profile.py memory hf_gpt2 --device cuda --backend coil --out /tmp/prof
    python3 bench/train_profile.py kernels tv_resnet18 --device cpu --size small --precision fp32
    python3 bench/train_profile.py memory timm_deit_tiny --device cpu --batch 8 --backend inductor"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))  # train_side_by_side, also when this file is loaded by path (tests)
sys.path.insert(0, str(ROOT / "tests"))  # ahead of bench/, whose models.py would shadow tests/models
import coil  # noqa: E402
import coil.report  # noqa: E402
from models import imports, zoo  # noqa: E402
from train_side_by_side import make_infer, make_step  # noqa: E402
import cpu_memory  # noqa: E402

#: Steps run before profiling: the first compiles (forward and backward), the next ones
#: catch a recompile and the autotuning done at first launches.
WARMUP_STEPS = 3
#: ATen ops that move data without computing: a layout conversion or a dtype cast that a
#: fused kernel could have absorbed shows up here.
COPY_OPS = ("aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous", "aten::fill_",
            "aten::zero_")
#: Entries the CUDA allocator's history keeps; a step of a large model makes a few 10^5.
MAX_TRACE_ENTRIES = 1_000_000
#: The suffix and comment mark of the sources written: Triton on the GPU, C++ on the CPU.
SOURCE_FORMAT = {"cuda": (".py", "#"), "cpu": (".cpp", "//")}


@dataclasses.dataclass
class KernelRow:
    """One profiler name: its time and calls per step and, for Coil, the kernels it stands for."""

    name: str
    us_per_step: float
    calls_per_step: float
    coil_kernels: list[str] = dataclasses.field(default_factory=list)
    ops: list[str] = dataclasses.field(default_factory=list)
    graphs: list[str] = dataclasses.field(default_factory=list)
    source_file: str = ""


@dataclasses.dataclass
class CopyRow:
    op: str
    us_per_step: float
    calls_per_step: float
    input_shapes: str


@dataclasses.dataclass
class MemoryGroup:
    """Blocks live at the step's peak that one frame allocated."""

    where: str
    mib: float
    blocks: int
    #: For ``<coil-wrapper>:LINE``: graph name -> that line of its wrapper.
    lines: dict[str, str] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------- Coil's names


@dataclasses.dataclass
class _Kernel:
    ops: list[str]
    graphs: list[str]
    source: str


class KernelIndex:
    """Coil's kernels of a recorded run by name. Names restart at ``k0`` in every graph, so one
    name may be in several graphs; its ops are the union."""

    def __init__(self, report: coil.report.ExplainReport) -> None:
        self.kernels: dict[str, _Kernel] = {}
        for graph in report.graphs:
            for k in graph.kernels:
                entry = self.kernels.setdefault(k.name, _Kernel([], [], k.source))
                entry.ops.extend(op for op in k.ops if op not in entry.ops)
                entry.graphs.append(graph.name)

    def resolve(self, name: str) -> _Kernel | None:
        """The kernel ``name`` is, or the longest whose name it extends (a backend may name a
        kernel's second function ``<kernel>_<part>``)."""
        if name in self.kernels:
            return self.kernels[name]
        stems = [k for k in self.kernels if name.startswith(k + "_")]
        return self.kernels[max(stems, key=len)] if stems else None

    def describe(self, row: KernelRow) -> None:
        """Fill ``row``'s ops and graphs from its Coil kernels."""
        for name in row.coil_kernels:
            k = self.resolve(name)
            if k is not None:
                row.ops.extend(op for op in k.ops if op not in row.ops)
                row.graphs.extend(g for g in k.graphs if g not in row.graphs)


@dataclasses.dataclass
class Digest:
    """A canonical Triton function: the kernel functions it was made from, and its source."""

    sources: set[str] = dataclasses.field(default_factory=set)
    text: str = ""


@contextlib.contextmanager
def digest_names() -> Iterator[dict[str, Digest]]:
    """Inside the block, every canonical Triton function Coil makes (``coil_<digest>``) maps to
    the kernel functions it was made from. Empty where the Triton plugin does not load."""
    digests: dict[str, Digest] = collections.defaultdict(Digest)
    try:
        from coil_cuda_triton import dedup
    except ImportError:
        yield digests
        return
    original = dedup.canonical

    def canonical(src: Any) -> Any:
        out = original(src)
        digests[out.name].sources.add(src.name)
        digests[out.name].text = out.source
        return out
    dedup.canonical = canonical  # the backend calls it as dedup.canonical, at every compile
    try:
        yield digests
    finally:
        dedup.canonical = original


@contextlib.contextmanager
def compile_settings(triton_names: bool) -> Iterator[dict[str, Digest]]:
    """How this tool compiles: Coil's graph cache off, since a graph loaded from it skips
    codegen (no canonical function made, so no digest named); with ``triton_names``, the
    digests' names (:func:`digest_names`), else each Coil kernel in a ``coil:<kernel>``
    profiler range (``profile_kernels``), the only name a kernel has on the CPU."""
    names = digest_names() if triton_names else contextlib.nullcontext({})
    with coil.config.override(graph_cache=False, profile_kernels=not triton_names), names as digests:
        yield digests


# ----------------------------------------------------------------------------- the runs


def _build(name: str, size: str, device: torch.device) -> zoo.Built:
    for package in ("transformers", "timm", "torchvision"):
        imports.import_optional(package)
    with torch.device(device):
        return zoo.build(name, size)  # type: ignore[arg-type]


def _warm_step(built: zoo.Built, backend: str, device: torch.device, bf16: bool,
               sync: Callable[[], Any], infer: bool = False) -> tuple[Callable[[], None], coil.report.ExplainReport]:
    """A compiled training step (an inference call with ``infer``), run
    :data:`WARMUP_STEPS` times while Coil's reports are recorded."""
    torch._dynamo.reset()  # a model compiled before in this process would skip the compile
    with coil.report.recording() as report:
        step, first = (make_infer if infer else make_step)(built, backend, device, bf16)
        for _ in range(WARMUP_STEPS):
            step()
        sync()
    # make_step keeps the first step's loss and gradients to check against eager; nothing is
    # checked here, so free them (the list stays non-empty: no later step refills it)
    first[0].clear()
    return step, report


def profile_kernels(built: zoo.Built, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The ``kernels`` mode: rows of kernels and of copy-like ops, per step."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with compile_settings(triton_names=cuda) as digests:
        step, report = _warm_step(built, args.backend, device, args.precision == "bf16", sync, args.infer)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(args.steps):
            step()
        sync()
    index = KernelIndex(report)
    rows = device_rows(prof, args.steps, digests) if cuda else cpu_rows(prof, args.steps)
    for row in rows:
        index.describe(row)
    busy = sum(r.us_per_step for r in rows)
    calls = sum(r.calls_per_step for r in rows)
    top = rows[:args.top]
    if args.out:
        _write_sources(top, digests, index, args, device)
    return {"model": args.model, "backend": args.backend, "device": device.type, "size": args.size,
            "precision": args.precision + (", inference" if args.infer else ""), "steps": args.steps,
            "time": "device" if cuda else "self CPU",
            "busy_ms_per_step": busy / 1e3, "calls_per_step": calls,
            "coil_kernels": len(index.kernels), "graphs": [g.name for g in report.graphs],
            "kernels": [dataclasses.asdict(r) for r in top],
            "copies": [dataclasses.asdict(r) for r in _copy_rows(prof, args.steps, cuda)[:args.top]]}


def device_rows(prof: Any, steps: int, digests: dict[str, Digest]) -> list[KernelRow]:
    """Every GPU kernel (and memcpy/memset) by name, busiest first."""
    total: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time_total
            calls[e.name] += 1
    return [KernelRow(name, us / steps, calls[name] / steps,
                      sorted(digests[name].sources) if name in digests else [])
            for name, us in total.most_common()]


def cpu_rows(prof: Any, steps: int) -> list[KernelRow]:
    """Every op and range by self CPU time, busiest first; Coil's kernels are the
    ``coil:<kernel>`` ranges."""
    events = sorted((e for e in prof.key_averages() if e.self_cpu_time_total > 0),
                    key=lambda e: -e.self_cpu_time_total)
    return [KernelRow(e.key, e.self_cpu_time_total / steps, e.count / steps,
                      [e.key.removeprefix("coil:")] if e.key.startswith("coil:") else [])
            for e in events]


def _copy_rows(prof: Any, steps: int, cuda: bool) -> list[CopyRow]:
    """Copy-like ATen ops grouped by input shapes: device time (theirs and their children's)
    on the GPU, self CPU time on the CPU."""
    def us(e: Any) -> float:
        return e.device_time_total if cuda else e.self_cpu_time_total
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in COPY_OPS]
    events.sort(key=lambda e: -us(e))
    return [CopyRow(e.key, us(e) / steps, e.count / steps, str(e.input_shapes)) for e in events]


def _write_sources(rows: list[KernelRow], digests: dict[str, Digest], index: KernelIndex,
                   args: argparse.Namespace, device: torch.device) -> None:
    """Each top row's source, where there is one: the canonical Triton function on the GPU,
    the kernel's source from Coil's report on the CPU."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for rank, row in enumerate(rows):
        if row.name in digests:
            text = digests[row.name].text
        else:
            kernel = index.resolve(row.coil_kernels[0]) if row.coil_kernels else None
            text = kernel.source if kernel is not None else ""
        if not text:
            continue
        stem = row.coil_kernels[0] if device.type == "cpu" and row.coil_kernels else row.name
        suffix, comment = SOURCE_FORMAT.get(device.type, (".txt", "#"))
        path = out / f"{args.model}_{args.backend}_{rank:02d}_{stem}{suffix}"
        path.write_text(f"{comment} {row.us_per_step:.1f} us/step, {row.calls_per_step:.4g} calls/step; "
                        f"{', '.join(row.coil_kernels)}; ops {', '.join(row.ops)}\n{text}")
        row.source_file = str(path)


def profile_memory(built: zoo.Built, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The ``memory`` mode: the blocks live at the step's peak, grouped by allocating frame."""
    sync = torch.cuda.synchronize
    step, report = _warm_step(built, args.backend, device, args.precision == "bf16", sync)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=MAX_TRACE_ENTRIES, stacks="python",
                                             clear_history=True)
    try:
        step()
        sync()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    allocator_peak = torch.cuda.max_memory_allocated() - base
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    peak, live = replay_peak(trace)
    wrappers = {g.name: g.wrapper_source.splitlines() for g in report.graphs}
    groups = group_blocks(live, _library_dirs(), wrappers)
    return {"model": args.model, "backend": args.backend, "device": device.type, "size": args.size,
            "precision": args.precision, "base_mib": base / 2**20, "peak_mib": peak / 2**20,
            "allocator_peak_mib": allocator_peak / 2**20, "live_blocks": len(live),
            "trace_entries": len(trace), "trace_full": len(trace) >= MAX_TRACE_ENTRIES,
            "groups": [dataclasses.asdict(g) for g in groups[:args.top]],
            "live_sizes": sorted((b["size"] for b in live), reverse=True),
            "peak_frame": where(trace[_peak(trace)[1]].get("frames", []), _library_dirs())}


def replay_peak(trace: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    """The peak of bytes allocated since the trace began (frees of older blocks count against
    it), and the trace's ``alloc`` entries still live at that peak. A block is live from its
    ``alloc`` to its ``free_completed`` (its memory back in the allocator's pool)."""
    peak, at = _peak(trace)
    live: dict[int, dict[str, Any]] = {}
    for entry in trace[:at + 1]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry
        elif entry["action"] == "free_completed":
            live.pop(entry["addr"], None)
    return peak, list(live.values())


def _peak(trace: list[dict[str, Any]]) -> tuple[int, int]:
    """``replay_peak``'s peak and the index of the ``alloc`` entry that reached it (-1: none)."""
    current = peak = 0
    at = -1
    for i, entry in enumerate(trace):
        if entry["action"] == "alloc":
            current += entry["size"]
            if current > peak:
                peak, at = current, i
        elif entry["action"] == "free_completed":
            current -= entry["size"]
    return peak, at


def _library_dirs() -> tuple[str, ...]:
    """Folders of the packages whose frames say nothing of where a block belongs: torch's,
    Coil's and its plugins' (the frame that called into them does)."""
    names = ("torch", "coil", "coil.sdk", "coil_cuda_triton", "coil_cpu_cpp", "coil_template_gemm")
    modules = [sys.modules.get(n) for n in names]
    return tuple(os.path.dirname(m.__file__) + os.sep for m in modules
                 if m is not None and getattr(m, "__file__", None))


def where(frames: list[dict[str, Any]], library: tuple[str, ...]) -> str:
    """The innermost frame (frames come innermost first) outside ``library``, as
    ``file:line function``; the innermost frame when all are inside."""
    if not frames:
        return "(no Python frame: allocated from C++, e.g. the autograd engine's thread)"
    frame = next((f for f in frames if not f["filename"].startswith(library)), frames[0])
    filename = frame["filename"]
    if filename.startswith(str(ROOT) + os.sep):
        filename = os.path.relpath(filename, ROOT)
    return f"{filename}:{frame['line']} {frame['name']}"


def group_blocks(live: list[dict[str, Any]], library: tuple[str, ...],
                 wrappers: dict[str, list[str]]) -> list[MemoryGroup]:
    """``live``'s blocks by allocating frame, largest total first; a frame of Coil's wrapper
    gets the text of its line in each graph's wrapper (``wrappers``: graph -> lines)."""
    size: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    line_of: dict[str, int] = {}
    for block in live:
        key = where(block.get("frames", []), library)
        size[key] += block["size"]
        count[key] += 1
        if key.startswith("<coil-wrapper>:"):
            line_of[key] = int(key.split(":")[1].split()[0])
    groups = []
    for key, total in size.most_common():
        line = line_of.get(key)
        lines = {g: text[line - 1].strip() for g, text in wrappers.items()
                 if line is not None and 0 < line <= len(text)}
        groups.append(MemoryGroup(key, total / 2**20, count[key], lines))
    return groups


# ----------------------------------------------------------------------------- output


def print_kernels(result: dict[str, Any]) -> None:
    unit = "device" if result["device"] == "cuda" else "self CPU"
    print(f"== {result['model']} {result['backend']} on {result['device']} ({result['precision']}, "
          f"{result['size']}): {unit} time {result['busy_ms_per_step']:.2f} ms/step over "
          f"{result['calls_per_step']:.0f} calls/step; {result['coil_kernels']} Coil kernels in "
          f"{len(result['graphs'])} graph(s)")
    print(f"{'us/step':>10}  {'calls':>6}  name  [Coil kernels]  ops")
    for row in result["kernels"]:
        kernels = row["coil_kernels"]
        more = f" +{len(kernels) - 3} more" if len(kernels) > 3 else ""
        named = f"  [{', '.join(kernels[:3])}{more}]" if kernels else ""
        ops = f"  {', '.join(row['ops'][:8])}" if row["ops"] else ""
        print(f"{row['us_per_step']:10.1f}  {row['calls_per_step']:6.4g}  {row['name'][:70]}{named}{ops}")
    print(f"-- copy-like ATen ops ({unit} time):")
    for row in result["copies"]:
        print(f"{row['us_per_step']:10.1f}  {row['calls_per_step']:6.4g}  {row['op']}  shapes "
              f"{row['input_shapes'][:150]}")


def print_memory(result: dict[str, Any]) -> None:
    print(f"== {result['model']} {result['backend']} on {result['device']} ({result['precision']}, "
          f"{result['size']}): allocated before the step {result['base_mib']:.0f} MiB; the step's "
          f"peak above that {result['peak_mib']:.2f} MiB (allocator's count "
          f"{result['allocator_peak_mib']:.2f}); {result['live_blocks']} blocks live at the peak")
    if result["trace_full"]:
        print(f"   (the trace kept only its last {MAX_TRACE_ENTRIES} entries: the replay misses "
              f"the step's start)")
    for group in result["groups"]:
        print(f"{group['mib']:10.1f} MiB  x{group['blocks']:<5d} {group['where']}")
        for graph, line in list(group["lines"].items())[:4]:
            print(f"{'':20}{graph}: {line[:100]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("kernels", "memory"))
    parser.add_argument("model", choices=zoo.names())
    parser.add_argument("--backend", default="coil", choices=("coil", "inductor", "eager"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--size", default="real", choices=("small", "real"))
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"),
                        help="bf16 autocast (the default) or plain float32")
    parser.add_argument("--infer", action="store_true",
                        help="kernels: profile inference calls (eval, no_grad) instead of training steps")
    parser.add_argument("--steps", type=int, default=3, help="steps profiled (kernels)")
    parser.add_argument("--top", type=int, default=25, help="rows listed per table")
    parser.add_argument("--out", default="", help="folder for the JSON of the results and the sources")
    parser.add_argument("--batch", type=int, default=0,
                        help="keep the first N samples of the inputs (0: the model's own batch)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    has_cuda = device.type == "cuda" and torch.cuda.is_available()
    if device.type == "cuda" and not has_cuda:
        parser.error("--device cuda, but torch sees no CUDA device; use --device cpu")
    torch.backends.cudnn.allow_tf32 = False  # as bench/train_side_by_side.py
    began = time.perf_counter()
    built = _build(args.model, args.size, device)
    if args.batch:
        built = cpu_memory.slice_batch(built, args.batch)
    if args.mode == "kernels":
        result = profile_kernels(built, args, device)
        print_kernels(result)
    else:
        if device.type == "cpu":
            step, _ = _warm_step(built, args.backend, device, args.precision == "bf16", lambda: None)
            result = cpu_memory.profile_memory_cpu(step, args.model, args.backend, args.size,
                                                   args.precision, args.top)
        else:
            result = profile_memory(built, args, device)
        print_memory(result)
    if args.out:
        path = Path(args.out) / f"{args.model}_{args.backend}_{args.mode}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {path}")
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
