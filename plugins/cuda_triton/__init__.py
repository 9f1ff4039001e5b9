"""Coil's reference GPU plugin: Triton kernels for CUDA tensors, autotuned, launched from a
lean wrapper, optionally replayed as CUDA graphs.

Registered through the ``coil.plugins`` entry point like any vendor plugin; imports only
``coil.sdk`` (Triton itself is imported when a graph is compiled, so a machine without
Triton still loads Coil and reports the missing package in ``coil doctor``)."""
from __future__ import annotations

import coil.sdk as sdk

__version__ = "0.1.0"


@sdk.hookimpl
def coil_api_version() -> str:
    # written against 1.0.0, the first stable SDK (0.19's contract pinned: a generic
    # DeviceBackend[CompiledModule]); its writer is built on coil.sdk.codegen (0.17.0: value
    # scope, visitor, index printer, reduction identities); uses the SDK's own IR modules,
    # capture(static_inputs=, measure=), coil.sdk.cachestats, DiskCache(layer=...),
    # export_module/import_module, template_dialects, Check.skip, coil.sdk.canonical,
    # gemm_alignment_bytes, coil.sdk.progress, Capabilities.random,
    # Capabilities.inplace_reductions, Kernel.inplace, warm_up, Capabilities.zero_dim_operands_cast
    return "1.0.0"


@sdk.hookimpl
def coil_device_backends() -> list[sdk.DeviceBackend]:
    from .backend import TritonBackend
    return [TritonBackend()]
