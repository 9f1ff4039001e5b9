"""The device under test, as the kit's tests see it (the ``coil_kit`` fixture): make inputs on
the CPU, copy them to the device, run the compiled function there, copy the result back and
compare it with eager on the CPU; then read Coil's report of what it generated. The compiler
is reached through :mod:`coil.sdk.host`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from coil.sdk import host
from coil.sdk.host import CompileReport, GraphInfo, KernelInfo


def recording() -> ContextManager[CompileReport]:
    """Collect the report of every graph Coil compiles inside the block (forward and
    backward graphs alike)."""
    return host.current().recording()


class CountingCompiler:
    """Coil's Dynamo backend, counting how often Dynamo asks it to compile."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        self.calls += 1
        return host.current().compile_fx(gm, example_inputs, **kwargs)


@dataclass(repr=False)
class Kit:
    """The device under test and the checks every tier shares."""

    device: torch.device
    backend: Any
    #: The run's options (``coil.sdk.testing.plugin.KitOptions``).
    options: Any = None

    def __repr__(self) -> str:
        return f"Kit({self.device.type}, {getattr(self.backend, 'name', '') or type(self.backend).__name__})"

    @property
    def capabilities(self) -> Any:
        return self.backend.capabilities

    # -- moving data -------------------------------------------------------------------------
    def to_device(self, tree: Any) -> Any:
        """Copies of every tensor in ``tree`` on the device (``requires_grad`` kept, as leaves)."""
        def move(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            return t.detach().to(self.device, copy=True).requires_grad_(t.requires_grad)
        return tree_map(move, tree)

    @staticmethod
    def to_cpu(tree: Any) -> Any:
        return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, tree)

    @staticmethod
    def clone(tree: Any) -> Any:
        return tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                        if isinstance(t, torch.Tensor) else t, tree)

    # -- running -----------------------------------------------------------------------------
    def compile(self, fn: Callable[..., Any], *, dynamic: bool | None = False,
                mode: str | None = None) -> Callable[..., Any]:
        """``torch.compile(fn, backend="coil")`` from a fresh Dynamo state."""
        torch._dynamo.reset()
        return torch.compile(fn, backend="coil", dynamic=dynamic, mode=mode)

    def check(self, fn: Callable[..., Any], *cpu_args: Any, atol: float = 1e-5, rtol: float = 1e-5,
              dynamic: bool | None = False, mode: str | None = None) -> CompileReport:
        """Run ``fn`` eagerly on the CPU and compiled on the device; the outputs must be on the
        device and match. Returns Coil's report, with the device result in ``.result``."""
        expected = fn(*self.clone(cpu_args))
        compiled = self.compile(fn, dynamic=dynamic, mode=mode)
        device_args = self.to_device(cpu_args)
        with recording() as report:
            report.result = compiled(*device_args)
        self.backend.synchronize()
        assert report.graphs, "no graph reached Coil: Dynamo ran the function eagerly"
        self.assert_on_device(report.result)
        self.assert_close(report.result, expected, atol=atol, rtol=rtol)
        return report

    def check_grads(self, fn: Callable[..., torch.Tensor], *cpu_args: Any, atol: float = 1e-5,
                    rtol: float = 1e-4) -> CompileReport:
        """Like :meth:`check` for a scalar loss, then ``backward()``: the gradient of every
        input that requires it must be on the device and match eager's."""
        cpu_leaves = self.clone(cpu_args)
        expected = fn(*cpu_leaves)
        expected.backward()
        compiled = self.compile(fn)
        device_leaves = self.to_device(cpu_args)
        with recording() as report:
            report.result = compiled(*device_leaves)
            report.result.backward()
        self.backend.synchronize()
        self.assert_close(report.result, expected.detach(), atol=atol, rtol=rtol, msg="loss: ")
        for i, (dev, ref) in enumerate(zip(device_leaves, cpu_leaves)):
            if isinstance(ref, torch.Tensor) and ref.requires_grad:
                assert dev.grad is not None, f"argument {i}: no gradient"
                self.assert_on_device(dev.grad)
                self.assert_close(dev.grad, ref.grad, atol=atol, rtol=rtol, msg=f"grad of argument {i}: ")
        return report

    def assert_close(self, actual: Any, expected: Any, *, atol: float = 1e-5, rtol: float = 1e-5,
                     msg: str = "") -> None:
        """``actual`` (on the device) copied to the CPU matches ``expected`` (eager, CPU)."""
        torch.testing.assert_close(self.to_cpu(actual), expected, atol=atol, rtol=rtol,
                                   equal_nan=True, msg=(lambda m: f"{msg}{m}") if msg else None)

    def assert_on_device(self, tree: Any) -> None:
        tensors = [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]
        wrong = [str(t.device) for t in tensors if t.device.type != self.device.type]
        assert not wrong, f"outputs on {wrong}, expected every output on {self.device.type}"

    # -- reading the report --------------------------------------------------------------------
    def device_kernels(self, report: CompileReport | GraphInfo) -> list[KernelInfo]:
        return [k for k in report.kernels if k.device == self.device.type]

    def assert_kernels(self, report: CompileReport, count: int | None = None) -> Sequence[KernelInfo]:
        """Every kernel is on the device, there is at least one, and ``count`` when given."""
        kernels = report.kernels
        elsewhere = [f"{k.name} [{k.device}]" for k in kernels if k.device != self.device.type]
        assert not elsewhere, f"kernels generated for another device: {elsewhere}"
        assert kernels, f"Coil generated no kernel for {self.device.type}:\n{report}"
        if count is not None:
            assert len(kernels) == count, (
                f"expected {count} kernel(s) on {self.device.type}, got {len(kernels)}: "
                f"{[k.name for k in kernels]}\n{report}")
        return kernels

    @staticmethod
    def assert_no_fallbacks(report: CompileReport) -> None:
        reasons = [f"{f.op}: {f.reason}" for g in report.graphs for f in g.fallbacks
                   if f.kind == "fallback"]
        assert not reasons, "ops fell back to ATen instead of becoming kernels:\n  " + "\n  ".join(reasons)

    # -- capability-based skips ------------------------------------------------------------------
    def require_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in self.capabilities.dtypes:
            pytest.skip(f"capabilities.dtypes lacks {dtype}")

    def require_reductions(self, *kinds: str) -> None:
        missing = sorted(set(kinds) - set(self.capabilities.reductions))
        if missing:
            pytest.skip(f"capabilities.reductions lacks {', '.join(missing)}")

    def require(self, flag: str) -> None:
        """Skip unless the boolean capability ``flag`` (``scans``, ``scatter``...) is true."""
        if not getattr(self.capabilities, flag, False):
            pytest.skip(f"capabilities.{flag} is False")
