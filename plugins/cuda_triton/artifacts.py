"""What a compiled Triton module is made of, in a form that pickles: per Coil kernel, its
canonical Triton functions (source and launch fields) and what its launcher needs beyond
them. ``TritonBackend.compile`` builds launchers from these plans, and so does
``import_module`` on a graph-cache hit, from the plans ``export_module`` saved: loading the
source again makes Triton's own disk cache hit on each build, and the autotune cache (keyed
by the same source) on each tuning."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import coil.sdk as sdk

from .codegen import KernelSource

#: The form of ``TritonBackend.export_module``'s bytes; raise it when they change.
EXPORT_FORMAT = "cuda_triton-module-1"


@dataclass(frozen=True)
class TemplateSpec:
    """What :class:`~.template.TemplateLauncher` reads of a template kernel: enough to stand
    in for the ``Kernel`` when the module is imported instead of compiled."""

    args: tuple[Any, ...]
    problem: Any
    output: str
    bias: Any
    alpha: float
    beta: float
    measure: bool
    layout: tuple[tuple[int, ...], tuple[int, ...], Any]  # the product's size, stride, dtype
    unfused_args: tuple[Any, ...] | None

    @classmethod
    def of(cls, k: sdk.Kernel) -> TemplateSpec:
        call = k.template
        layout = call.node.layout
        return cls(tuple(k.args), call.problem, call.output, call.bias, call.alpha, call.beta, call.measure,
                   (tuple(int(s) for s in layout.size), tuple(int(s) for s in layout.stride), layout.dtype),
                   tuple(call.unfused.args) if call.unfused is not None else None)

    def kernel(self) -> Any:
        """A stand-in for the kernel, with the attributes the launcher reads."""
        size, stride, dtype = self.layout
        unfused = SimpleNamespace(args=list(self.unfused_args)) if self.unfused_args is not None else None
        call = SimpleNamespace(problem=self.problem, output=self.output, bias=self.bias, alpha=self.alpha,
                               beta=self.beta, measure=self.measure, unfused=unfused,
                               node=SimpleNamespace(layout=SimpleNamespace(size=size, stride=stride, dtype=dtype)))
        return SimpleNamespace(args=list(self.args), template=call)


@dataclass(frozen=True)
class KernelPlan:
    """How one Coil kernel launches: its canonical Triton functions in launch order, the
    argument positions tuning must clone, the count of buffer arguments (split reductions
    put workspaces after them) and, for a template kernel, its :class:`TemplateSpec`."""

    name: str
    sources: tuple[KernelSource, ...]
    mutated: tuple[int, ...]
    n_buffers: int
    template: TemplateSpec | None = None


__all__ = ["EXPORT_FORMAT", "KernelPlan", "TemplateSpec"]
