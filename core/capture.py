"""Graph capture: which compiled graphs a backend records once and replays (CUDA graphs on the
Triton plugin), and which of their inputs keep a fixed address.

The ``graph_capture`` knob picks the mode:

* ``on`` (what ``torch.compile(..., mode="reduce-overhead")`` sets): every graph that can be
  recorded is recorded;
* ``auto`` (the default): inference graphs only, and the backend keeps the replay only where it
  measured faster than running the graph's launches one by one (a graph of many small kernels,
  where the host is the bottleneck; the Triton plugin records and measures on the graph's
  second call, so the first returns without waiting for it); elsewhere the graph runs as
  compiled;
* ``off``: nothing is recorded.

A graph is recorded only when one backend runs every kernel, every tensor input lives on that
backend's device, its sizes are static and it mutates no input. Inputs that AOTAutograd marks
static (parameters and buffers) are recorded at their own address and never copied; the
backend re-records if such an address changes. Every other input is copied into the
recording's own buffer on each call, and every output is cloned out of the recording's memory,
so a result the caller keeps is never overwritten by the next replay."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from coil.sdk import versions

log = logging.getLogger(__name__)

#: The SDK release whose ``DeviceBackend.capture`` takes ``static_inputs`` and ``measure``.
CAPTURE_API = (0, 13, 0)


@dataclass
class CaptureNote:
    """What graph capture did with one graph, for ``coil.explain``: a decision at compile time
    (``skipped: why``) or the recording's own account once it has run."""

    text: str
    replay: Any = None

    def __str__(self) -> str:
        describe = getattr(self.replay, "describe", None)
        return describe() if callable(describe) else self.text


def mutates_inputs(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` calls an op that writes into one of its arguments (a copy back into a
    graph input, an in-place update of a buffer)."""
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def static_input_indices() -> frozenset[int]:
    """Indices of the graph inputs whose address stays fixed across calls (parameters and
    buffers), as AOTAutograd recorded them for the graph being compiled; empty outside one."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    return frozenset(getattr(meta, "static_input_indices", None) or ())


def _symbolic(example_inputs: Sequence[Any]) -> bool:
    for a in example_inputs:
        if isinstance(a, torch.SymInt):
            return True
        if isinstance(a, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in a.shape):
            return True
    return False


def captured(fn: Callable[[list[Any]], Any], mode: str, kind: str, mutates: bool,
             modules: dict[str, tuple[Any, Any]], example_inputs: Sequence[Any],
             static: frozenset[int], api_of: Callable[[Any], str | None]) -> tuple[Callable, CaptureNote]:
    """``fn`` recorded for replay by its device's backend where ``mode`` asks for it and the
    graph allows it, else ``fn`` itself; with the note that says which and why.
    ``api_of(backend)`` is the SDK version the backend's plugin declares."""
    reason = _ineligible(mode, kind, mutates, modules, example_inputs)
    if reason is None:
        backend, _ = next(iter(modules.values()))
        new_api = versions.parse(api_of(backend) or "0.0.0") >= CAPTURE_API
        if mode == "auto" and not new_api:
            reason = f"{backend.name}'s plugin declares an SDK older than 0.13.0"
        else:
            replay = (backend.capture(fn, example_inputs, static_inputs=static, measure=mode == "auto")
                      if new_api else backend.capture(fn, example_inputs))
            if replay is not None:
                return replay, CaptureNote(f"recorded by {backend.name}", replay)
            reason = f"{backend.name} declined"
    if mode == "on":
        log.info("coil: graph capture skipped: %s", reason)
    return fn, CaptureNote(f"not recorded: {reason}")


def _ineligible(mode: str, kind: str, mutates: bool, modules: dict[str, tuple[Any, Any]],
                example_inputs: Sequence[Any]) -> str | None:
    """Why the graph is not to be recorded, or None."""
    if mode == "off":
        return "the graph_capture knob is off"
    if mode == "auto" and kind != "inference":
        return f"a {kind} graph (graph_capture=auto records inference graphs only)"
    devices = {t.device for t in example_inputs if isinstance(t, torch.Tensor)}
    if len(modules) != 1 or len(devices) != 1 or set(modules) != {d.type for d in devices}:
        return f"kernels on {sorted(modules)}, inputs on {sorted(map(str, devices))}"
    if _symbolic(example_inputs):
        return "symbolic sizes"
    if mutates:
        return "the graph mutates an input"
    backend, _ = next(iter(modules.values()))
    if not backend.capabilities.graph_capture:
        return f"{backend.name} cannot record graphs"
    return None
