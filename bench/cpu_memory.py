"""A training step's memory peak on the CPU, for ``bench/train_profile.py memory --device cpu``.

The CPU has no caching allocator with a history, so the step runs under ``torch.profiler``
with ``profile_memory=True``: every allocation and free of the step is an event with its
address and size. Replaying them in time order gives the peak of bytes allocated since the
step began (blocks allocated before it and freed during it count against it, as in the CUDA
mode's replay) and the blocks live at that peak, each named by the innermost profiler range
around its allocation (an ATen op, or the compiled graph's own range for the buffers a
backend's wrapper allocates). The same backend-neutral count serves Inductor and Coil, so
their peaks compare; it is a proxy for the GPU's, whose attention and library ops differ.

``--batch N`` keeps the first N samples of the model's inputs (and labels): the real widths
at a batch the CPU runs in seconds."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
from typing import Any, Callable

import torch

#: Profiler event categories whose ranges name an allocation.
_RANGES = ("cpu_op", "user_annotation")


def slice_batch(built: Any, n: int) -> Any:
    """``built`` with the first ``n`` samples of every batched input, keyword input and label
    (a loss function's ``labels`` bound with ``functools.partial``)."""
    def cut(value: Any) -> Any:
        return value[:n] if isinstance(value, torch.Tensor) and value.dim() > 0 else value

    loss_fn = built.loss_fn
    if isinstance(loss_fn, functools.partial) and "labels" in loss_fn.keywords:
        loss_fn = functools.partial(loss_fn.func, *loss_fn.args,
                                    **{**loss_fn.keywords, "labels": cut(loss_fn.keywords["labels"])})
    return dataclasses.replace(built, args=tuple(cut(a) for a in built.args),
                               kwargs={k: cut(v) for k, v in built.kwargs.items()},
                               train_kwargs={k: cut(v) for k, v in built.train_kwargs.items()},
                               loss_fn=loss_fn)


def replay(events: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
    """Chrome-trace events -> (peak bytes since the first memory event, the allocation events
    live at the peak, the memory event that reached it)."""
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    current = peak = 0
    at = -1
    for i, e in enumerate(memory):
        current += e["args"]["Bytes"]
        if current > peak:
            peak, at = current, i
    live: dict[int, dict[str, Any]] = {}
    for e in memory[:at + 1]:
        if e["args"]["Bytes"] > 0:
            live[e["args"]["Addr"]] = e
        else:
            live.pop(e["args"]["Addr"], None)
    return peak, list(live.values()), memory[at] if at >= 0 else None


def enclosing(events: list[dict[str, Any]]) -> Callable[[float], str]:
    """A function from a timestamp to the name of the innermost range around it."""
    ranges = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") in _RANGES), key=lambda r: r[0])

    def name(ts: float) -> str:
        inside = [r for r in ranges if r[0] <= ts <= r[1]]
        return min(inside, key=lambda r: r[1] - r[0])[2] if inside else "(no range)"
    return name


def profile_memory_cpu(step: Callable[[], None], model: str, backend: str, size: str,
                       precision: str, top: int) -> dict[str, Any]:
    """One profiled step (after the caller's warm-up) -> the CUDA mode's result keys."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    peak, live, peak_event = replay(events)
    name = enclosing(events)
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    for e in live:
        where = name(e["ts"])
        sizes[where] = sizes.get(where, 0) + e["args"]["Bytes"]
        counts[where] = counts.get(where, 0) + 1
    groups = [{"where": w, "mib": b / 2**20, "blocks": counts[w], "lines": {}}
              for w, b in sorted(sizes.items(), key=lambda kv: -kv[1])[:top]]
    return {"model": model, "backend": backend, "device": "cpu", "size": size, "precision": precision,
            "base_mib": 0.0, "peak_mib": peak / 2**20, "allocator_peak_mib": peak / 2**20,
            "live_blocks": len(live), "trace_entries": sum(e.get("name") == "[memory]" for e in events),
            "trace_full": False,
            "groups": groups, "live_sizes": sorted((e["args"]["Bytes"] for e in live), reverse=True),
            "peak_frame": name(peak_event["ts"]) if peak_event else ""}
