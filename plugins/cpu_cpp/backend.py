"""The C++/OpenMP device backend: all kernels of a graph in one translation unit, compiled by
the system compiler, loaded through cffi, launched with raw data pointers."""
from __future__ import annotations

import os
import pickle
import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import coil.sdk as sdk
from coil.sdk.canonical import PLACEHOLDER, Renamer, canonical_text, digest_name
from coil.sdk.ir import Node

from . import autotune, cpp, prepack, programs, streaming, toolchain
from .codegen import KernelWriter
from .optable import integer_division


@dataclass
class CompiledModule:
    lib: Any
    path: str
    sources: dict[str, str]
    source: str
    #: The cffi declarations and kernel name -> function in the library (for export).
    decls: list[str] = field(default_factory=list)
    functions: dict[str, str] = field(default_factory=dict)
    #: Kernels compiled in several schedules, timed at their first launch (:mod:`.autotune`):
    #: kernel name -> {"key", "buffers", "functions": variant -> function in the library}.
    tuning: dict[str, dict[str, Any]] = field(default_factory=dict)

    def checked(self, function: Any, *args: Any) -> None:
        """Launch a kernel that may report an error (:func:`may_raise`) and raise it as eager
        does. The error flag (``coil::kernel_error``, coil_cpu.h) is one per process: another
        thread's launch between this kernel and the read of the flag would take this call's
        error or give it its own (cffi runs the kernels without the GIL; found by a hunt),
        so the launch and the read hold :data:`ERRORS`."""
        with ERRORS:
            function(*args)
            error = self.lib.coil_take_kernel_error()
        if error:
            raise_kernel_error(error)

    def checked_program(self, function: Any, *args: Any) -> None:
        """Run a host program with such kernels (:mod:`.programs`): it returns the flag it
        took, under :data:`ERRORS` as :meth:`checked`."""
        with ERRORS:
            error = function(*args)
        if error:
            raise_kernel_error(error)

    @staticmethod
    def raise_error(error: int) -> None:
        """Raise the error a host program's code says (the wrapper's line for a program
        without such kernels)."""
        raise_kernel_error(error)


#: Held while a kernel that may set ``coil::kernel_error`` runs and its flag is read: the
#: flag is process-wide (and GCC may merge the libraries' inline variable into one).
ERRORS = threading.Lock()


def raise_kernel_error(error: int) -> None:
    """Raise as eager does where a kernel divided an integer by zero or used an index outside
    its dim, or where a host program found no memory for its scratch (bits of
    ``coil::kernel_error``, coil_cpu.h)."""
    if error & 4:
        raise MemoryError("a compiled graph's host program could not allocate its scratch memory")
    if error & 2:
        raise KernelIndexError("index out of bounds: a compiled kernel read or wrote through an "
                               "index outside its dim (eager raises here too)")
    if error & 1:
        raise RuntimeError("ZeroDivisionError")


class KernelIndexError(IndexError, RuntimeError):
    """An index out of its dim's range, found by a kernel. Eager raises IndexError for some
    ops (``index_select``, ``x[idx]``) and RuntimeError for others (``gather``, ``scatter``):
    this is both."""


#: Reads and clears ``coil::kernel_error`` (coil_cpu.h), in every library.
TAKE_KERNEL_ERROR = ('extern "C" int coil_take_kernel_error() '
                     "{ return __atomic_exchange_n(&coil::kernel_error, 0, __ATOMIC_RELAXED); }")
TAKE_KERNEL_ERROR_DECL = "int coil_take_kernel_error();"


def may_raise(kernel: sdk.Kernel) -> bool:
    """Whether ``kernel`` divides integer values (so may divide by zero) or indexes through
    values read from memory (so may meet an index out of range)."""
    bodies = [kn.body for loop in kernel.loops for kn in loop.nodes]
    special = kernel.special
    bodies += [b for b in (getattr(special, "body", None), getattr(special, "value", None))
               if isinstance(b, sdk.Value)]
    if isinstance(special, sdk.ScatterNode) and special.target_indirect:
        return True
    return any(integer_division(v) or isinstance(v, sdk.Indirect) for body in bodies for v in sdk.walk(body))


#: The form of :meth:`CppBackend.export_module`'s bytes; raise it when they change.
EXPORT_FORMAT = "cpu_cpp-module-5"


# Convolution layout (prefers_channels_last). ATen's CPU convolutions (oneDNN), one thread,
# float32, each timed alone with NCHW and with channels-last operands: depthwise ones take
# 0.3-0.7x the time channels-last at the model zoo's small sizes (batch 2, 64x64 images) and
# 0.13-0.5x at batch 16 and 224x224 sizes (bfloat16: 0.3-0.4x); dense and grouped (32 groups) ones are level
# within 10%, except large weights over a few output points, which swing both ways
# (ResNet-18's 512x512 3x3 on 2x2 takes 2.5 ms channels-last against 1.0; ResNet-50's
# 512->2048 1x1 on 2x2 0.42 against 2.4, but its 1024->2048 1x1 stride 2 6.7 against 0.85).
# Whole models compiled both ways in one process (rounds rotating, 2026-12-02), ms per call
# NCHW -> channels-last: EfficientNet-B0 15.5 -> 9.8, MobileNetV3-small 6.1 -> 4.6,
# mobilenetv3_small_050 2.75 -> 2.12, ShuffleNetV2 4.9 -> 4.1, ConvNeXt-atto 4.05 -> 3.46,
# but ResNet-18 13.3 -> 39.8 and ResNet-50 43.0 -> 59.3. So a graph goes channels-last when
# its depthwise convolutions carry a fair share of its convolution multiply-accumulates:
# they cost ~40x more time per multiply-accumulate than dense ones here and carry 3.4%
# (ShuffleNetV2 x0.5) to 16% (mobilenetv3_small_050) of those models', none of a ResNet's;
# a dense net with a token depthwise convolution stays NCHW. Training steps, same way:
# MobileNetV3-small 17.9 -> 16.0 ms, ShuffleNetV2 10.3 -> 8.2, ConvNeXt-atto 17.5 -> 16.8,
# so training forward graphs follow the same rule.
#: Share of a graph's convolution multiply-accumulates in depthwise convolutions from which
#: the C++ plugin asks for the graph channels-last.
DEPTHWISE_SHARE = 0.01
#: Whether training forward graphs may go channels-last too (when the
#: ``training_channels_last`` knob is on); see the measurements above.
TRAINING_CHANNELS_LAST = True


def onednn_weight_grad_broken(c: sdk.ConvolutionInfo) -> bool:
    """Whether ATen's CPU weight gradient of ``c`` with channels-last operands is wrong.

    torch 2.13's oneDNN path, for a 1x1 convolution with a stride above 1 and 2 to 7 input
    channels per group, corrupts the heap or returns wrong values (errors of 40-110 where
    the gradient's elements are ~10) with channels-last operands, and is right with NCHW
    ones (``tests/repros_open/onednn_channels_last_1x1_strided_weight_grad.py``; FastViT's
    stem). Strides of 2 and 4 fail, 3 passes; 1 and 8 or more channels pass: the rule takes
    every stride above 1 and every count from 2 to 7."""
    return (not c.transposed and c.kernel_size == (1, 1) and max(c.stride) > 1
            and 2 <= c.weight[1] <= 7)


class CppScheduling(sdk.Scheduling):
    max_fusion_size = 64

    def can_fuse(self, x_ranges: tuple[Any, ...], r_ranges: tuple[Any, ...],
                 nodes: Sequence[Node]) -> bool:
        """Not a window (a depthwise convolution's or a pooling's taps, each a masked load)
        into a kernel with reduced dims: there the reduction's lane loop holds the taps'
        masks, which GCC does not vectorise, where a pointwise kernel reads whole rows
        through them (``masked_rows.py``). EfficientNet-B0's squeeze-and-excitation means
        had taken in their 3x3 depthwise convolutions and run 2-3x slower than both apart."""
        return not r_ranges or not any(_window(n) for n in nodes)


#: Masked loads from which a node's body counts as a window (a 3x3 window with padding has
#: up to eight; a ``cat`` or a ``pad`` one or two).
WINDOW_MASKS = 4


def _window(node: Node) -> bool:
    body = getattr(node, "body", None)
    return isinstance(body, sdk.Value) and sum(isinstance(v, sdk.Masked) for v in sdk.walk(body)) >= WINDOW_MASKS


class CppBackend(sdk.DeviceBackend[CompiledModule]):
    device_type = "cpu"
    name = "cpu_cpp"
    scheduling = CppScheduling()

    @dataclass(frozen=True)
    class Options:
        #: Extra C++ compiler flags, after Coil's ``-O3 -march=native -fopenmp ...`` (a later
        #: flag wins: ``"-O1"``, ``"-fno-tree-vectorize"``, ``"-DNAME=1"``).
        extra_cflags: str = ""
        #: Write the outputs of kernels that move more bytes than the last-level cache holds
        #: with streaming (non-temporal) stores (:mod:`.streaming`).
        streaming: bool = True
        #: Compile a few schedules of each large kernel and keep the fastest, measured at its
        #: first launch and cached (:mod:`.autotune`). Off by default: the variants' compile
        #: and timing lengthen a cold first call (0.2-0.3 s a tuned kernel).
        autotune: bool = False

    def __init__(self) -> None:
        # inplace_reductions: one thread runs a kept point's loops in order (the split
        # schedule ends each loop's parallel region, a barrier, before the next), and a stash
        # is not kept in an output that overwrites an input read later (stash.py)
        self.capabilities = sdk.Capabilities(vector_width=16, random=True, inplace_reductions=True,
                                             conv_channels_last=True, depthwise_conv=True,
                                             gemm_bias_epilogue=False, float32_scans_in_float64=True,
                                             float32_variance_in_float64=True, half_add_scalars_rounded=True,
                                             half_conv_bias_in_kernel=True,
                                             template_dialects=frozenset({"cpp"}), host_programs=True,
                                             compiler=os.environ.get("CXX", "g++"))

    def generate(self, kernels: Sequence[sdk.Kernel], host: Sequence[sdk.HostProgram] = ()
                 ) -> tuple[str, list[str], dict[str, str], dict[str, str], dict[str, dict[str, Any]]]:
        """The translation unit, its declarations, each kernel's readable source, each
        kernel's (and each host program's) function in the unit, and the kernels to tune at
        their first launch (see :class:`CompiledModule`): kernels that differ only in names
        (a model's repeated layers) share one canonical function (:mod:`coil.sdk.canonical`),
        compiled once. A program with a kernel to tune is not built (its launches go one by
        one until the choice is made)."""
        bodies: dict[str, str] = {}
        decls: dict[str, str] = {}
        per_kernel: dict[str, str] = {}
        functions: dict[str, str] = {}
        tuning: dict[str, dict[str, Any]] = {}
        for k in kernels:
            variants = self._variants(k)
            key = None
            if len(variants) > 1:  # a choice made before (this process or an earlier one)?
                key = autotune.key(canonical_text(variants[0][1], k.name, Renamer()),
                                   [v.name for v, _, _ in variants], self.target_key())
                chosen = [x for x in variants if x[0].name == autotune.choices().get(key)]
                if chosen:
                    variants, key = chosen, None
            names: dict[str, str] = {}
            for variant, text, decl in variants:
                renamer = Renamer()
                body = canonical_text(text, k.name, renamer)
                names[variant.name] = name = digest_name("k_", body)
                if name not in bodies:
                    bodies[name] = body.replace(PLACEHOLDER, name)
                    decls[name] = canonical_text(decl, k.name, renamer).replace(PLACEHOLDER, name)
            per_kernel[k.name] = variants[0][1]
            functions[k.name] = names[variants[0][0].name]
            if key is not None:
                tuning[k.name] = {"key": key, "buffers": len(k.inputs) + len(k.outputs), "functions": names}
        for program in host:
            if any(launch.kernel.name in tuning for launch in program.launches):
                continue
            text, decl, name = programs.host_function(program, functions, may_raise)
            bodies.setdefault(name, text)
            decls.setdefault(name, decl)
            functions[program.name] = name
        transposes = any("coil::transpose_tile" in body for body in bodies.values())
        source = "\n".join(['#include "coil_cpu.h"', "#include <algorithm>",
                            *(['#include "coil_transpose.h"'] if transposes else []),
                            toolchain.vector_math_prelude(), "", *bodies.values(), TAKE_KERNEL_ERROR])
        return source, [*decls.values(), TAKE_KERNEL_ERROR_DECL], per_kernel, functions, tuning

    def _variants(self, k: sdk.Kernel) -> list[tuple[autotune.Variant, str, str]]:
        """(variant, source, declaration) of each distinct schedule of ``k`` to compile, the
        rule's first: only the rule's unless ``k`` is tuned (:mod:`.autotune`)."""
        llc = streaming.llc_bytes() if self.options.streaming else 0
        stream = {"rule": llc, "off": 0, "on": 1 if self.options.streaming else 0}
        candidates = autotune.VARIANTS if self.options.autotune and autotune.tunable(k) else (autotune.RULE,)
        out: list[tuple[autotune.Variant, str, str]] = []
        for v in candidates:
            text, decl = KernelWriter(k, k.name, llc=stream[v.streaming], prefetch=v.prefetch,
                                      tile=v.tile).generate()
            if all(text != t for _, t, _ in out):
                out.append((v, text, decl))
        return out

    def compile(self, kernels: Sequence[sdk.Kernel], graph_name: str,
                programs: Sequence[sdk.HostProgram] = ()) -> CompiledModule:
        source, decls, per_kernel, functions, tuning = self.generate(kernels, programs)
        path = toolchain.library_for(source, shlex.split(self.options.extra_cflags),
                                     f"{self.options_key()}|{self.capabilities.cache_key()}")
        return self._load(str(path), decls, functions, per_kernel, source, tuning)

    @staticmethod
    def _load(path: str, decls: list[str], functions: dict[str, str], per_kernel: dict[str, str],
              source: str, tuning: dict[str, dict[str, Any]]) -> CompiledModule:
        import cffi  # optional until a library loads; its C parser costs ~60 ms to import
        ffi = cffi.FFI()
        ffi.cdef("\n".join(decls))
        lib = ffi.dlopen(path)
        module = CompiledModule(lib, path, per_kernel, source, decls, functions, tuning)
        for kernel_name, function in functions.items():
            setattr(module, kernel_name, getattr(lib, function))  # what the wrapper calls
        for kernel_name, tune in tuning.items():
            variants = {v: getattr(lib, f) for v, f in tune["functions"].items()}
            chosen = autotune.choices().get(tune["key"], count=False)  # since the library was built
            setattr(module, kernel_name, variants[chosen] if chosen in variants else
                    autotune.Tuner(module, kernel_name, tune["key"], variants, tune["buffers"]))
        return module

    def export_module(self, compiled: CompiledModule) -> bytes | None:
        """The library's bytes with its cache key, declarations and function names: an
        import loads it without compiling (on a machine with the same ``target_key``)."""
        key = Path(compiled.path).name.removesuffix(".so")
        library = toolchain.library_cache().read(key, ".so", remote=False, count=False)  # just looked up
        if library is None:
            return None
        return pickle.dumps({"format": EXPORT_FORMAT, "key": key, "library": library,
                             "decls": compiled.decls, "functions": compiled.functions,
                             "sources": compiled.sources, "source": compiled.source,
                             "tuning": compiled.tuning})

    def import_module(self, data: bytes, graph_name: str) -> CompiledModule | None:
        entry = pickle.loads(data)
        if entry.get("format") != EXPORT_FORMAT:
            return None
        cache = toolchain.library_cache()  # the entry holds the library: no remote, no count
        path = (cache.lookup(entry["key"], ".so", remote=False, count=False)
                or cache.write(entry["key"], ".so", entry["library"], remote=False))
        return self._load(str(path), entry["decls"], entry["functions"], entry["sources"], entry["source"],
                          entry["tuning"])

    def target_key(self) -> str:
        """The compiler, the CPU (kernels are built with ``-march=native``), its last-level
        cache (where stores stream, :mod:`.streaming`) and whether the kernels are written for
        one thread (:func:`.cpp.serial`)."""
        try:
            cxx = toolchain.compiler_version(toolchain.compiler())
        except sdk.ToolchainError:
            cxx = "no compiler"
        threads = "one thread" if cpp.serial() else "threads"
        return f"{cxx}; cpu {toolchain.cpu_id()}; llc {streaming.llc_bytes()}; {threads}"

    def prefers_channels_last(self, convolutions: Sequence[sdk.ConvolutionInfo], *,
                              training: bool) -> bool:
        """Channels-last where depthwise convolutions carry a fair share of the graph's
        convolution work (:data:`DEPTHWISE_SHARE`; see the notes above it), except training
        graphs with a convolution whose channels-last weight gradient ATen gets wrong
        (:func:`onednn_weight_grad_broken`)."""
        if training and (not TRAINING_CHANNELS_LAST or any(onednn_weight_grad_broken(c) for c in convolutions)):
            return False
        if any(prepack.packs(c) for c in convolutions):  # oneDNN's packed calls return channels-last
            return True
        total = sum(c.macs for c in convolutions)
        depthwise = sum(c.macs for c in convolutions if c.depthwise)
        return total > 0 and depthwise >= DEPTHWISE_SHARE * total

    def frozen_convolution(self, info: sdk.ConvolutionInfo, weight: Any, bias: Any) -> Any:
        """oneDNN's convolution over a weight packed once (:mod:`.prepack`)."""
        return prepack.frozen_convolution(info, weight, bias)

    def convolution_as_matmul(self, info: sdk.ConvolutionInfo) -> bool:
        """float32 1x1 convolutions as ``mm`` (:mod:`.prepack`)."""
        return prepack.as_matmul(info)

    def frozen_linear(self, rows: int, weight: Any, bias: Any) -> Any:
        """MKL's matrix product over a weight packed once, where it wins (:mod:`.prepack`)."""
        return prepack.frozen_linear(rows, weight, bias)

    def call_line(self, module_var: str, kernel: sdk.Kernel, args: Sequence[str]) -> str:
        n_buffers = len(kernel.inputs) + len(kernel.outputs)
        parts = [f"{a}.data_ptr()" for a in args[:n_buffers]] + list(args[n_buffers:])
        if may_raise(kernel):
            return f"{module_var}.checked({', '.join([f'{module_var}.{kernel.name}', *parts])})"
        return f"{module_var}.{kernel.name}({', '.join(parts)})"

    def host_call_line(self, module_var: str, compiled: CompiledModule, program: sdk.HostProgram) -> str | None:
        if program.name not in compiled.functions:
            return None
        return programs.call_line(module_var, program, any(may_raise(launch.kernel) for launch in program.launches))

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
            import cffi  # optional: `coil doctor` reports it missing
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
