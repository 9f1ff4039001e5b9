"""Coil's reference CPU plugin: C++17 kernels with OpenMP threads and SIMD loops.

Registered through the ``coil.plugins`` entry point like any vendor plugin; imports only
``coil.sdk``."""
from __future__ import annotations

import coil.sdk as sdk

from .backend import CppBackend

__version__ = "0.1.0"


@sdk.hookimpl
def coil_api_version() -> str:
    return "0.8.0"  # current with Coil; uses DeviceBackend.Options, DiskCache, coil.sdk.canonical,
    #               Capabilities.random, Capabilities.inplace_reductions


@sdk.hookimpl
def coil_device_backends() -> list[sdk.DeviceBackend]:
    return [CppBackend()]
