"""``torch_emu``: the runtime of the emulated "emu" chip, standing in for a vendor's PyTorch
device extension (such as ``torch_npu``). It is emulation, not part of the Coil plugin.

It names PyTorch's PrivateUse1 device type ``emu``, loads ``_emu_device`` (a C++ library, built
when the package is installed, with an allocator whose memory is host RAM and the few ATen
kernels a device needs: empty, copies, views, resize, fill; every other ATen op runs through a
CPU fallback), and registers ``torch.emu``, the device module PyTorch and Dynamo query
(``is_available()`` and friends).

PyTorch imports it on ``import torch`` (the ``torch.backends`` entry point calls
:func:`register`); with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, ``import torch_emu`` does it."""
from __future__ import annotations

import glob
import os
import types

import torch

DEVICE_TYPE = "emu"


def _library_path() -> str:
    found = glob.glob(os.path.join(os.path.dirname(__file__), "_emu_device*.so"))
    if not found:
        raise ImportError("torch_emu's device library (_emu_device*.so) is missing: install the "
                          "package (pip install --no-build-isolation examples/emu_chip) to build it")
    return found[0]


def _device_module() -> types.ModuleType:
    """``torch.emu``: one device, always available, nothing asynchronous."""
    mod = types.ModuleType(f"torch.{DEVICE_TYPE}")
    mod.is_available = lambda: True  # type: ignore[attr-defined]
    mod.is_initialized = lambda: True  # type: ignore[attr-defined]
    mod._is_in_bad_fork = lambda: False  # type: ignore[attr-defined]
    mod.device_count = lambda: 1  # type: ignore[attr-defined]
    mod.current_device = lambda: 0  # type: ignore[attr-defined]
    mod.set_device = lambda device: None  # type: ignore[attr-defined]
    mod.synchronize = lambda device=None: None  # type: ignore[attr-defined]
    mod.manual_seed = lambda seed: None  # type: ignore[attr-defined]
    mod.manual_seed_all = lambda seed: None  # type: ignore[attr-defined]
    return mod


def register() -> None:
    """Load the device library and name PrivateUse1 ``emu``; once per process."""
    if getattr(torch, DEVICE_TYPE, None) is not None:
        return
    torch.ops.load_library(_library_path())
    torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    torch._register_device_module(DEVICE_TYPE, _device_module())
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)


register()
