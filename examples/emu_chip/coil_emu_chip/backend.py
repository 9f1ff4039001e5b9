"""The emu chip's device backend: every kernel of a graph in one C file, built by the system C
compiler, loaded with ctypes, launched with the data pointers of the emu tensors (the chip's
memory is host RAM)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Sequence

import torch

import coil.sdk as sdk

from . import compiler
from .codegen import KernelWriter


@dataclass
class EmuModule:
    """A graph's compiled kernels: ``lib.<kernel name>(pointers..., sizes...)``."""

    lib: ctypes.CDLL
    sources: dict[str, str]
    source: str


class EmuBackend(sdk.DeviceBackend[EmuModule]):
    device_type = "emu"
    name = "emu_chip"
    # Scans and scatters are generated too (the core does not consult these flags yet).
    capabilities = sdk.Capabilities(vector_width=1, compiler="cc")

    def compile(self, kernels: Sequence[sdk.Kernel], graph_name: str) -> EmuModule:
        sources = {k.name: KernelWriter(k).generate() for k in kernels}
        source = "\n".join(['#include "emu_chip.h"', "", *sources.values()])  # cached by content
        lib = ctypes.CDLL(str(compiler.build(source)))
        for k in kernels:
            pointers = len(k.inputs) + len(k.outputs)
            fn = getattr(lib, k.name)
            fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * len(k.size_args)
            fn.restype = None
        return EmuModule(lib, sources, source)

    def call_line(self, module_var: str, kernel: sdk.Kernel, args: Sequence[str]) -> str:
        n_buffers = len(kernel.inputs) + len(kernel.outputs)
        parts = [f"{a}.data_ptr()" for a in args[:n_buffers]] + list(args[n_buffers:])
        return f"{module_var}.lib.{kernel.name}({', '.join(parts)})"

    def kernel_source(self, compiled: EmuModule, kernel: sdk.Kernel) -> str:
        return compiled.sources.get(kernel.name, "")

    def doctor(self) -> list[sdk.Check]:
        try:
            cc = compiler.compiler()
            checks = [sdk.Check("C compiler", True, f"{cc}: {compiler.version(cc)}")]
        except sdk.ToolchainError as exc:
            checks = [sdk.Check("C compiler", False, str(exc))]
        registered = getattr(torch, self.device_type, None) is not None
        return checks + [sdk.Check("emu device", registered, "torch.emu, PrivateUse1" if registered
                                   else "not registered: import torch_emu")]
