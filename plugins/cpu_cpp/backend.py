"""The C++/OpenMP device backend: all kernels of a graph in one translation unit, compiled by
the system compiler, loaded through cffi, launched with raw data pointers."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Sequence

import coil.sdk as sdk

from . import toolchain
from .codegen import KernelWriter


@dataclass
class CompiledModule:
    lib: Any
    path: str
    sources: dict[str, str]
    source: str


class CppScheduling(sdk.Scheduling):
    max_fusion_size = 64


class CppBackend(sdk.DeviceBackend):
    device_type = "cpu"
    name = "cpu_cpp"
    scheduling = CppScheduling()

    @dataclass(frozen=True)
    class Options:
        #: Extra C++ compiler flags, after Coil's ``-O3 -march=native -fopenmp ...`` (a later
        #: flag wins: ``"-O1"``, ``"-fno-tree-vectorize"``, ``"-DNAME=1"``).
        extra_cflags: str = ""

    def __init__(self) -> None:
        import os
        self.capabilities = sdk.Capabilities(vector_width=16, compiler=os.environ.get("CXX", "g++"))

    def generate(self, kernels: Sequence[sdk.Kernel]) -> tuple[str, list[str], dict[str, str]]:
        bodies: list[str] = []
        decls: list[str] = []
        per_kernel: dict[str, str] = {}
        for k in kernels:
            text, decl = KernelWriter(k, k.name).generate()
            bodies.append(text)
            decls.append(decl)
            per_kernel[k.name] = text
        source = "\n".join(['#include "coil_cpu.h"', "#include <algorithm>",
                            toolchain.vector_math_prelude(), "", *bodies])
        return source, decls, per_kernel

    def compile(self, kernels: Sequence[sdk.Kernel], graph_name: str) -> CompiledModule:
        import cffi
        source, decls, per_kernel = self.generate(kernels)
        path = toolchain.library_for(source, shlex.split(self.options.extra_cflags),
                                     f"{self.options_key()}|{self.capabilities.cache_key()}")
        ffi = cffi.FFI()
        ffi.cdef("\n".join(decls))
        lib = ffi.dlopen(str(path))
        return CompiledModule(lib, str(path), per_kernel, source)

    def call_line(self, module_var: str, kernel: sdk.Kernel, args: Sequence[str]) -> str:
        n_buffers = len(kernel.inputs) + len(kernel.outputs)
        parts = [f"{a}.data_ptr()" for a in args[:n_buffers]] + list(args[n_buffers:])
        return f"{module_var}.lib.{kernel.name}({', '.join(parts)})"

    def kernel_source(self, compiled: CompiledModule, kernel: sdk.Kernel) -> str:
        return compiled.sources.get(kernel.name, "")

    def doctor(self) -> list[sdk.Check]:
        checks = []
        try:
            cxx = toolchain.compiler()
            checks.append(sdk.Check("C++ compiler", True, f"{cxx}: {toolchain.compiler_version(cxx)}"))
        except sdk.ToolchainError as exc:
            checks.append(sdk.Check("C++ compiler", False, str(exc)))
        try:
            import cffi
            checks.append(sdk.Check("cffi", True, cffi.__version__))
        except ImportError:
            checks.append(sdk.Check("cffi", False, "pip install cffi"))
        else:
            checks.append(self._build_check())
        vector_math = bool(toolchain.vector_math_prelude())
        checks.append(sdk.Check("vector math (glibc libmvec)", vector_math,
                                "declared" if vector_math else "not available: math runs scalar"))
        return checks

    @staticmethod
    def _build_check() -> sdk.Check:
        """A found compiler is not a working one (``CXX=/bin/false``): build and load a test
        library with the kernels' flags."""
        name = "C++ build (compile, link, load)"
        try:
            return sdk.Check(name, True, toolchain.self_test())
        except toolchain.CppCompileError as exc:
            return sdk.Check(name, False, f"{exc.summary}. Fix the compiler or point CXX at a working one.")
        except (sdk.ToolchainError, OSError) as exc:
            return sdk.Check(name, False, str(exc))
