"""Base classes a device plugin implements: ``Capabilities`` (a declarative descriptor),
``Scheduling`` (fusion legality and limits) and ``DeviceBackend`` (codegen, compile, load,
launch)."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a device can do; the core reads it for heuristics and cache keys, and the
    conformance kit skips tiers the device lacks."""

    dtypes: frozenset[torch.dtype] = frozenset({
        torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16,
        torch.int32, torch.int64, torch.uint8, torch.bool})
    #: Elements one vector instruction (or one warp) handles.
    vector_width: int = 1
    reductions: frozenset[str] = frozenset(
        {"sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford"})
    scans: bool = True
    scatter: bool = True
    compiler: str = ""
    compiler_version: str = ""


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of ``coil doctor``: what was checked, whether it is fine, and the detail (a
    version, or what to install)."""

    name: str
    ok: bool
    detail: str = ""


class Scheduling:
    """Fusion decisions a device makes. The core proposes a fusion only when iteration spaces
    and data dependencies allow it; ``can_fuse`` may refuse more."""

    #: Most IR nodes one kernel may hold.
    max_fusion_size: int = 64

    def can_fuse(self, x_ranges: tuple, r_ranges: tuple, nodes: Sequence[Any]) -> bool:
        return True


class DeviceBackend:
    """A device's code generator and runtime. Subclass and implement the methods below.

    * ``compile(kernels, graph_name)`` turns a graph's kernels into something loadable and
      returns an object handed back to ``call_line``; compile all of a graph's kernels at
      once (one translation unit, or in parallel).
    * ``call_line(module_var, kernel, args)`` is the wrapper's Python line that launches one
      kernel with ``args`` (names of tensors and size ints, in ``kernel.args`` order).
    """

    #: ``torch.device(...).type`` this backend serves.
    device_type: str = ""
    #: A name for reports and ``coil doctor``.
    name: str = ""
    capabilities: Capabilities = Capabilities()
    scheduling: Scheduling = Scheduling()

    def compile(self, kernels: Sequence[Any], graph_name: str) -> Any:
        raise NotImplementedError

    def call_line(self, module_var: str, kernel: Any, args: Sequence[str]) -> str:
        raise NotImplementedError

    def kernel_source(self, compiled: Any, kernel: Any) -> str:
        """Generated source of one kernel (for reports and ``COIL_DEBUG_DIR``)."""
        return ""

    def synchronize(self) -> None:
        """Wait for the device to finish queued work (benchmarks and tests call it)."""

    def doctor(self) -> list[Check]:
        """Toolchain checks for ``coil doctor`` (compiler found, runtime present...)."""
        return []
