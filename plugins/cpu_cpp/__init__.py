"""Coil's reference CPU plugin: C++17 kernels with OpenMP threads and SIMD loops.

Registered through the ``coil.plugins`` entry point like any vendor plugin; imports only
``coil.sdk``."""
from __future__ import annotations

import coil.sdk as sdk

from .backend import CppBackend

__version__ = "0.1.0"


@sdk.hookimpl
def coil_api_version() -> str:
    # 1.15.0: declares Capabilities.half_conv_bias_in_kernel (eager's CPU convolution adds a
    # half-type bias in oneDNN's kernel); 1.12.0: builds host programs (Capabilities.host_programs); 1.11.0: declares Capabilities.half_add_scalars_rounded (eager's CPU add and sub round a
    # scalar and alpha to a half tensor's type); 1.10.0: declares Capabilities.float32_variance_in_float64 (eager's CPU var/std run
    # in double); 1.9.0: declares Capabilities.float32_scans_in_float64 (eager's CPU scans run in double);
    # 1.8.0: declares Capabilities.gemm_bias_epilogue False (ATen's CPU addmm copies the
    # bias in a pass of its own); 1.7.0: their backward as matrix products too; 1.6.0: 1x1 convolutions as matrix
    # products (convolution_as_matmul);
    # 1.5.0: packs frozen convolutions' and linear layers' weights (frozen_convolution, frozen_linear); 1.4.0: declares Capabilities.depthwise_conv; 1.1.0: answers
    # DeviceBackend.prefers_channels_last from a graph's convolutions; written
    # against 1.0.0, the first stable SDK (0.19's contract pinned: a generic
    # DeviceBackend[CompiledModule]); its writer is built on coil.sdk.codegen (0.17.0: value
    # scope, visitor, index printer); uses the SDK's own IR modules (0.14.0), the 0.13.0
    # capture signature (declines), DiskCache's layer/remote/count arguments,
    # export_module/import_module, DeviceBackend.Options, coil.sdk.canonical,
    # Capabilities.random, Capabilities.inplace_reductions, template_dialects
    return "1.15.0"


@sdk.hookimpl
def coil_device_backends() -> list[sdk.DeviceBackend]:
    return [CppBackend()]
