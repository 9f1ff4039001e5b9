"""Coil plugin for the "emu" chip, an example of an out-of-tree device (PyTorch's PrivateUse1
device type, registered by the ``torch_emu`` runtime shipped alongside): ``backend`` compiles
and launches a graph's kernels, ``codegen`` writes each kernel as C loops using the tables of
``optable`` (ops, types) and ``accumulators`` (reductions), ``special`` writes scans and
scatters, ``compiler`` builds the C with the system compiler.

Coil finds the plugin through the ``coil.plugins`` entry point; it imports only ``coil.sdk``,
torch and the standard library."""
from __future__ import annotations

import coil.sdk as sdk

from .backend import EmuBackend


@sdk.hookimpl
def coil_api_version() -> str:
    return "1.0.0"  # the first stable SDK (a generic DeviceBackend: DeviceBackend[EmuModule])


@sdk.hookimpl
def coil_device_backends() -> list[sdk.DeviceBackend]:
    return [EmuBackend()]
