"""``coil.sdk``: the stable surface for Coil plugin authors.

A plugin imports only this module. It provides device backends through the hooks of
:mod:`coil.sdk.hookspecs` (decorate implementations with :data:`hookimpl`), subclasses
:class:`DeviceBackend` and :class:`Scheduling`, and reads the kernel IR types re-exported
here. ``API_VERSION`` follows semantic versioning (a new major version breaks plugins); its
history and the compatibility policy are in :mod:`coil.sdk.versions`."""
from __future__ import annotations

from coil import ir as _ir
from coil.errors import KernelCompileError, PluginError, ToolchainError
from coil.ir import (REDUCTION_TYPES, Cast, Const, Expr, ExternNode, IndexValue, Indirect, Load,
                     Masked, Op, PointwiseNode, ReductionNode, ScanNode, ScatterNode, Value)
from coil.kernel import Kernel, KernelNode, Loop
from coil.ops import POINTWISE_OPS
from coil.plugins import register_backend_for_device
from coil.symbolic import ExprPrinter, FloorDiv, ModIdx

from .backend import Capabilities, Check, DeviceBackend, Scheduling
from .codewriter import CodeWriter
from .hookspecs import hookimpl
from .reference import ReferenceBackend
from .versions import API_VERSION, compatibility

walk = _ir.walk
loads = _ir.loads


def cache_dir(subdir: str) -> str:
    """A folder under ``COIL_CACHE_DIR`` (created) where a plugin keeps its on-disk cache."""
    import os

    from coil import config
    path = os.path.join(config.current().cache_dir, subdir)
    os.makedirs(path, exist_ok=True)
    return path


__all__ = [
    "API_VERSION", "hookimpl", "DeviceBackend", "Scheduling", "Capabilities", "Check", "CodeWriter",
    "register_backend_for_device", "cache_dir", "Kernel", "KernelNode", "Loop", "Value", "Load",
    "Const", "Op", "Cast", "Masked", "IndexValue", "Indirect", "PointwiseNode", "ReductionNode",
    "ScanNode", "ScatterNode", "ExternNode", "REDUCTION_TYPES", "POINTWISE_OPS", "ExprPrinter",
    "FloorDiv", "ModIdx", "walk", "loads", "KernelCompileError", "ToolchainError", "PluginError",
    "compatibility", "ReferenceBackend", "Expr",
]
