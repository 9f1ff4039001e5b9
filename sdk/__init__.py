"""``coil.sdk``: the stable surface for Coil plugin authors.

A plugin imports only this module. It provides device backends through the hooks of
:mod:`coil.sdk.hookspecs` (decorate implementations with :data:`hookimpl`), subclasses
:class:`DeviceBackend` and :class:`Scheduling`, and reads the kernel IR types re-exported
here. ``API_VERSION`` follows semantic versioning (a new major version breaks plugins); its
history and the compatibility policy are in :mod:`coil.sdk.versions`.

The SDK is the layer beneath Coil's compiler and imports none of it: the knobs
(:mod:`coil.sdk.config`) and the plugin registry (:mod:`coil.sdk.registry`) are the SDK's,
and its tools that drive the compiler (the conformance kit, ``coil cache export|import``)
reach it through :mod:`coil.sdk.host`."""
from __future__ import annotations

import importlib
from typing import Any

from .versions import API_VERSION, compatibility

#: Public name -> module it lives in. Loaded on first use, so importing ``coil.sdk`` (the
#: conformance kit's pytest plugin does, in every pytest session) does not import torch.
_LAZY = {
    "KernelCompileError": "coil.sdk.errors", "PluginError": "coil.sdk.errors", "ToolchainError": "coil.sdk.errors",
    "REDUCTION_TYPES": "coil.sdk.ir", "Cast": "coil.sdk.ir", "Const": "coil.sdk.ir", "Expr": "coil.sdk.ir",
    "ExternNode": "coil.sdk.ir", "IndexValue": "coil.sdk.ir", "Indirect": "coil.sdk.ir", "Load": "coil.sdk.ir",
    "Masked": "coil.sdk.ir", "Op": "coil.sdk.ir", "PointwiseNode": "coil.sdk.ir", "ReductionNode": "coil.sdk.ir",
    "ScanNode": "coil.sdk.ir", "ScatterNode": "coil.sdk.ir", "Value": "coil.sdk.ir", "walk": "coil.sdk.ir",
    "loads": "coil.sdk.ir",
    "Kernel": "coil.sdk.kernel", "KernelNode": "coil.sdk.kernel", "Loop": "coil.sdk.kernel",
    "POINTWISE_OPS": "coil.sdk.ops", "register_backend_for_device": "coil.sdk.registry",
    "ExprPrinter": "coil.sdk.symbolic", "FloorDiv": "coil.sdk.symbolic", "ModIdx": "coil.sdk.symbolic",
    "Capabilities": "coil.sdk.backend", "Check": "coil.sdk.backend", "DeviceBackend": "coil.sdk.backend",
    "ConvolutionInfo": "coil.sdk.backend",
    "Scheduling": "coil.sdk.backend", "CodeWriter": "coil.sdk.codewriter",
    "hookimpl": "coil.sdk.hookspecs", "ReferenceBackend": "coil.sdk.reference",
    "DiskCache": "coil.sdk.diskcache", "cache_dir": "coil.sdk.diskcache",
    "Template": "coil.sdk.templates", "TemplateConfig": "coil.sdk.templates",
    "GemmProblem": "coil.sdk.templates", "Operand": "coil.sdk.templates",
    "TemplateCall": "coil.sdk.kernel",
    "HostProgram": "coil.sdk.programs", "Launch": "coil.sdk.programs", "ProgramOperand": "coil.sdk.programs",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coil.sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "API_VERSION", "hookimpl", "DeviceBackend", "Scheduling", "Capabilities", "Check", "CodeWriter",
    "register_backend_for_device", "cache_dir", "Kernel", "KernelNode", "Loop", "Value", "Load",
    "Const", "Op", "Cast", "Masked", "IndexValue", "Indirect", "PointwiseNode", "ReductionNode",
    "ScanNode", "ScatterNode", "ExternNode", "REDUCTION_TYPES", "POINTWISE_OPS", "ExprPrinter",
    "FloorDiv", "ModIdx", "walk", "loads", "KernelCompileError", "ToolchainError", "PluginError",
    "compatibility", "ReferenceBackend", "Expr", "DiskCache", "Template", "TemplateConfig",
    "GemmProblem", "Operand", "TemplateCall", "ConvolutionInfo",
]
