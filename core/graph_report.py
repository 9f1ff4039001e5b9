"""What compiling one graph records: a :class:`GraphReport` (its kernels as
:class:`KernelReport` s, fallbacks, planned peak, seconds per stage, fusion decisions, the
wrapper's source), which :mod:`coil.compile` builds, :mod:`coil.graph_cache` rebuilds on a
hit, and ``coil.explain`` shows. Its own module so that the compiler and the graph cache both
import it at the top without importing each other."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .lowering.context import FallbackRecord
    from .scheduler import FusionDecision


@dataclass
class KernelReport:
    """One generated kernel: its name, device, source, the ATen ops it holds."""

    name: str
    device: str
    source: str
    ops: tuple[str, ...]
    num_nodes: int
    #: Template kernels: the template, the product, what the epilogue holds, how the choice
    #: against the library is made.
    template: str = ""
    #: What the backend chose at run time (template or library, configuration); "" before
    #: the first launch or when there is no run-time choice.
    chosen: Callable[[], str] | None = None


@dataclass
class GraphReport:
    """One compiled graph, as ``coil.explain`` and the debug dump show it."""

    name: str
    kind: str  # "forward" | "backward" | "inference"
    kernels: list[KernelReport]
    fallbacks: list[FallbackRecord]
    peak_bytes: int
    stage_seconds: dict[str, float]
    decisions: list[FusionDecision]
    wrapper_source: str
    num_inputs: int = 0
    symbolic: bool = False
    #: Kernel outputs that took the memory of a buffer dead since an earlier step.
    reused: int = 0
    #: Kernel outputs stored over an input of their own kernel that died there.
    inplace: int = 0
    #: Loaded from the graph cache (:mod:`coil.graph_cache`): nothing was lowered or generated.
    cached: bool = False
    #: Whether the graph is recorded and replayed (:mod:`coil.capture`), and why.
    capture: Any = None
    #: A training forward graph whose saved activations are not laid out as traced
    #: (channels-last convolutions): each output's strides, reported to AOTAutograd.
    output_strides: list[tuple[int, ...] | None] | None = None
    #: What the ``freezing`` knob did to the graph (:mod:`coil.freezing`); "" where it did not apply.
    frozen: str = ""
    #: Host programs (:mod:`coil.host_programs`) the wrapper calls, each "<name>: <kernels>".
    programs: tuple[str, ...] = ()

    @property
    def fallback_ops(self) -> list[str]:
        return [f.op for f in self.fallbacks if f.kind == "fallback"]

    @property
    def library_ops(self) -> list[str]:
        return [f.op for f in self.fallbacks if f.kind == "library"]


__all__ = ["GraphReport", "KernelReport"]


_graph_ids = itertools.count()
#: Observers of every compiled graph (``coil.explain`` installs one).
_observers: list[Callable[[GraphReport], None]] = []


def next_graph_name() -> str:
    return f"graph{next(_graph_ids)}"


def add_observer(fn: Callable[[GraphReport], None]) -> None:
    _observers.append(fn)


def remove_observer(fn: Callable[[GraphReport], None]) -> None:
    if fn in _observers:
        _observers.remove(fn)


def notify(report: GraphReport) -> None:
    """Hand ``report`` to every observer."""
    for obs in list(_observers):
        obs(report)
