"""The system C++ compiler: detection, flags, and an on-disk cache of compiled libraries keyed
by a hash of source, flags, compiler version and CPU. Libraries are written atomically
(compiled to a temporary name, then renamed), so concurrent processes never load a
half-written file, and a second process calls no compiler."""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import coil.sdk as sdk

log = logging.getLogger(__name__)

HEADER = Path(__file__).with_name("coil_cpu.h")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC",
         "-fno-math-errno", "-fno-trapping-math", "-w"]


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


def library_for(source: str, extra_flags: Sequence[str] = (), key_extra: str = "") -> Path:
    """Path of the compiled library for ``source``, compiling it if the cache lacks it.
    ``extra_flags`` follow Coil's flags; ``key_extra`` (the backend's options and
    capabilities) enters the cache key."""
    cxx = compiler()
    header = HEADER.read_text()
    flags = [*FLAGS, *extra_flags]
    key = hashlib.sha256("\0".join([source, header, " ".join(flags), compiler_version(cxx),
                                    cpu_id(), key_extra]).encode()).hexdigest()
    folder = Path(sdk.cache_dir("cpu_cpp")) / key[:2]
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"{key}.so"
    if lib.exists():
        return lib
    src = folder / f"{key}.cpp"
    _write_atomic(src, source)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
    os.close(fd)
    cmd = [cxx, *flags, f"-I{HEADER.parent}", str(src), "-o", tmp, "-lm"]
    log.debug("compiling %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise sdk.KernelCompileError(str(src), (proc.stderr or proc.stdout)[-8000:])
    os.replace(tmp, lib)
    return lib


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
