"""The system C++ compiler: detection, flags, errors that show the compiler's own message,
and compiled libraries kept in Coil's disk cache (:mod:`coil.sdk.diskcache`) under a hash
of source, flags, compiler version and CPU. The cache checks a library before it is loaded
(a damaged one is rebuilt, never loaded), writes it atomically, and caps its size; a
second process with the same cache calls no compiler."""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import coil.sdk as sdk
from coil.sdk.diskcache import DiskCache

log = logging.getLogger(__name__)

HEADER = Path(__file__).with_name("coil_cpu.h")
#: Every header a kernel may include (coil_cpu.h includes the others): all enter the cache key.
HEADERS = tuple(sorted(HEADER.parent.glob("*.h")))
#: ``-mno-red-zone`` (x86-64 only): GCC 12.2 miscompiles some leaf kernels (reductions with no
#: OpenMP region). The vectoriser raises a short lane array's alignment, the function gets a
#: frame pointer but no realignment, and the array lands in the red zone at an address that the
#: callee-saved pushes leave at 8 mod 16, where an aligned ``vmovdqa`` faults (F.normalize's
#: gradient over 4 elements segfaulted). Without a red zone the frame is allocated aligned; the
#: cost is a ``sub``/``add`` of the stack pointer per call.
#: FMA contraction stays GCC's default (``a * b + c`` of two ops may fuse into one rounding):
#: with ``-ffp-contract=off`` (tried in session 37, after a hunt's ``relu(0.1 * 10 - 1)``:
#: 1.49e-8 and a gradient of 10 where eager gives 0 and 0) ResNet-18's training gradients at
#: the model suite's small size left eager's tolerance in 59 of 63 tensors (all far closer to
#: float64 than eager's; eager's CPU kernels use FMAs of their own). The user can turn it off
#: with ``cpu_cpp.extra_cflags="-ffp-contract=off"``; code that wants an FMA asks for it by
#: name (``std::fma`` in the vector math, the GEMM template's micro-kernel).
#: ``-fwrapv``: signed integer arithmetic wraps, as eager's does. Without it a signed overflow is
#: undefined and GCC at -O3 folded ``(x + 1) > x`` to true and ``(x * 2) // 2`` to x for int32
#: and int64 tensors (session 34); float code is unaffected.
#: ``-mprefer-vector-width=512`` (x86-64 only; without AVX-512 there are no wider vectors to
#: prefer): GCC 12 tunes ``-march=native`` on these Xeons for 256-bit vectors, but the inner loop
#: of a channels-last kernel runs over 16 to 96 channels, one to six 512-bit vectors. Measured
#: side by side in one process (one thread, float32 inference at real sizes, 2026-12-02,
#: medians): mobilenetv3_small_050 160 -> 145 ms, EfficientNet-B0 2900 -> 2716 ms; a
#: channels-last batch norm + hardswish over 64x16x112x112 alone 11.8 -> 8.7 ms.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC",
         "-fno-math-errno", "-fno-trapping-math", "-fwrapv", "-w",
         *(["-mno-red-zone", "-mprefer-vector-width=512"] if platform.machine() == "x86_64" else [])]


def compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx)
    if path is None:
        raise sdk.ToolchainError(
            cxx, "C++ compiler not found",
            "Coil's CPU backend compiles kernels with the system C++ compiler. Install one "
            "(Debian/Ubuntu: `apt-get install g++`), or point CXX at it.")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


@functools.lru_cache(maxsize=None)
def cpu_id() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                model += line
    except OSError:
        pass
    return platform.machine() + hashlib.sha256(model.encode()).hexdigest()[:16]


#: glibc's libmvec: the vector variants of libm functions, by the glibc version that added them.
_LIBMVEC = {
    (2, 22): [("exp", 1), ("log", 1), ("sin", 1), ("cos", 1), ("pow", 2)],
    (2, 35): [("acos", 1), ("acosh", 1), ("asin", 1), ("asinh", 1), ("atan", 1), ("atan2", 2),
              ("atanh", 1), ("cbrt", 1), ("cosh", 1), ("erf", 1), ("erfc", 1), ("exp10", 1),
              ("exp2", 1), ("expm1", 1), ("hypot", 2), ("log10", 1), ("log1p", 1), ("log2", 1),
              ("sinh", 1), ("tan", 1), ("tanh", 1)],
}


@functools.lru_cache(maxsize=None)
def vector_math_prelude() -> str:
    """Declarations that let ``omp simd`` loops call glibc's vector math (libmvec), so
    ``std::exp`` and friends vectorise; empty where libmvec is not there."""
    if platform.machine() != "x86_64":
        return ""
    try:
        version = tuple(int(p) for p in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    except (ValueError, OSError, IndexError, AttributeError):
        return ""
    lines = ['extern "C" {']
    for since, fns in _LIBMVEC.items():
        if version < since:
            continue
        for name, arity in fns:
            for ctype, suffix in (("float", "f"), ("double", "")):
                params = ", ".join([ctype] * arity)
                lines.append("#pragma omp declare simd notinbranch")
                lines.append(f"{ctype} {name}{suffix}({params}) noexcept;")
    lines.append("}")
    return "\n".join(lines) if len(lines) > 2 else ""


#: Enters every cache key: raise it when what a cached library means or holds changes.
CACHE_FORMAT = "diskcache-1"

#: What ``coil doctor`` builds and loads: Coil's header, OpenMP and the flags kernels get.
_PROBE = """#include "coil_cpu.h"
extern "C" int coil_probe(int n) {
  int count = 0;
#pragma omp parallel for reduction(+ : count)
  for (int i = 0; i < n; ++i) count += 1;
  return count;
}
"""


class CppCompileError(sdk.KernelCompileError):
    """The C++ compiler failed on a library: carries the command, its exit status, what the
    compiler printed and the source path."""

    def __init__(self, command: Sequence[str], returncode: int, output: str, source_path: str) -> None:
        output = output.strip()[-8000:] or _silence(returncode)
        super().__init__(source_path, output)
        self.command = list(command)
        self.returncode = returncode
        self.args = (f"the C++ compiler failed ({_status(returncode)}) on {source_path}\n"
                     f"command: {shlex.join(self.command)}\n{output}\n"
                     f"If the compiler itself is broken, fix it or point CXX at a working one "
                     f"(`coil doctor` builds a test program); otherwise report this with the "
                     f"source file.",)

    @property
    def summary(self) -> str:
        """One line: which compiler failed, how, and the last line it printed."""
        last = self.output.strip().splitlines()[-1][:300]
        return f"{self.command[0]} failed ({_status(self.returncode)}): {last}"


def _status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _silence(returncode: int) -> str:
    if returncode < 0:
        return f"the compiler was {_status(returncode)} and printed nothing"
    return f"the compiler exited with status {returncode} and printed nothing"


def run_compiler(command: Sequence[str], source_path: Path, output: Path) -> None:
    """Run ``command``, which builds ``output`` from ``source_path``; :class:`CppCompileError`
    unless it exits 0 having written a non-empty ``output``."""
    log.debug("compiling %s", shlex.join(command))
    try:
        proc = subprocess.run(list(command), capture_output=True, text=True, check=False,
                              stdin=subprocess.DEVNULL)
    except OSError as exc:  # not executable, a folder, a bad interpreter line...
        raise sdk.ToolchainError(command[0], f"cannot run the C++ compiler: {exc}",
                                 "Point CXX at a working C++ compiler (e.g. g++).") from None
    printed = (proc.stderr + proc.stdout).strip()
    if proc.returncode != 0:
        raise CppCompileError(command, proc.returncode, printed, str(source_path))
    if not (output.is_file() and output.stat().st_size > 0):
        printed = f"{printed}\n{command[0]} exited with status 0 but wrote no library".strip()
        raise CppCompileError(command, proc.returncode, printed, str(source_path))


def _command(cxx: str, flags: Sequence[str], source: Path, output: Path) -> list[str]:
    return [cxx, *flags, f"-I{HEADER.parent}", str(source), "-o", str(output), "-lm"]


def library_key(source: str, extra_flags: Sequence[str] = (), key_extra: str = "") -> str:
    """The cache key of the library :func:`library_for` builds from these arguments."""
    flags = [*FLAGS, *extra_flags]
    headers = "\0".join(h.read_text() for h in HEADERS)
    return hashlib.sha256("\0".join([source, headers, " ".join(flags), compiler_version(compiler()),
                                     cpu_id(), key_extra, CACHE_FORMAT]).encode()).hexdigest()


def library_cache() -> DiskCache:
    return DiskCache.in_namespace("cpu_cpp", fanout=True, layer="kernel")


def library_for(source: str, extra_flags: Sequence[str] = (), key_extra: str = "") -> Path:
    """Path of the compiled library for ``source``, compiling it if the cache lacks it (or
    holds a damaged copy). ``extra_flags`` follow Coil's flags; ``key_extra`` (the backend's
    options and capabilities) enters the cache key."""
    cxx = compiler()
    flags = [*FLAGS, *extra_flags]
    key = library_key(source, extra_flags, key_extra)
    cache = library_cache()
    lib = cache.lookup(key, ".so")
    if lib is not None:
        return lib
    src = cache.write_plain(key, ".cpp", source)
    with cache.producing(key, ".so") as tmp:
        run_compiler(_command(cxx, flags, src, tmp), src, tmp)
    return cache.path(key, ".so")


def self_test() -> str:
    """Build and load a small library the way kernels are built (Coil's header, OpenMP, the
    same flags); what ``coil doctor`` reports. Raises what a kernel build would raise."""
    import cffi  # optional: `coil doctor` reports it missing

    cxx = compiler()
    with tempfile.TemporaryDirectory(prefix="coil-doctor-") as folder:
        src, lib = Path(folder, "probe.cpp"), Path(folder, "probe.so")
        src.write_text(_PROBE)
        run_compiler(_command(cxx, FLAGS, src, lib), src, lib)
        ffi = cffi.FFI()
        ffi.cdef("int coil_probe(int n);")
        got = ffi.dlopen(str(lib)).coil_probe(1000)
    if got != 1000:
        raise sdk.ToolchainError(cxx, f"a test library built with OpenMP counted {got} of 1000 "
                                      f"iterations", "Check the compiler's OpenMP support (-fopenmp).")
    return "compiled, linked and ran an OpenMP test library"
