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


def library_for(source: str) -> Path:
    """Path of the compiled library for ``source``, compiling it if the cache lacks it."""
    cxx = compiler()
    header = HEADER.read_text()
    key = hashlib.sha256("\0".join([source, header, " ".join(FLAGS), compiler_version(cxx),
                                    cpu_id()]).encode()).hexdigest()
    folder = Path(sdk.cache_dir("cpu_cpp")) / key[:2]
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"{key}.so"
    if lib.exists():
        return lib
    src = folder / f"{key}.cpp"
    _write_atomic(src, source)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
    os.close(fd)
    cmd = [cxx, *FLAGS, f"-I{HEADER.parent}", str(src), "-o", tmp]
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
