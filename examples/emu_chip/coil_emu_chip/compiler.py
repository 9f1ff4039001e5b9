"""The emu chip's toolchain: the system C compiler (``$CC``, default ``cc``) builds a graph's
kernels into a shared library, cached under ``COIL_CACHE_DIR/emu_chip/`` by a hash of the
source, the runtime header, the compiler and its flags."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import coil.sdk as sdk

HEADER = Path(__file__).with_name("emu_chip.h")
FLAGS = ("-std=c11", "-O2", "-fPIC", "-shared")


def compiler() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise sdk.ToolchainError(cc, "C compiler not found", "install gcc or clang, or set $CC")
    return cc


def version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]


def build(source: str) -> Path:
    """The shared library of ``source`` (compiled unless the cache has it)."""
    cc = compiler()
    key = hashlib.sha256("\0".join([source, HEADER.read_text(), cc, version(cc), *FLAGS]).encode())
    folder = Path(sdk.cache_dir("emu_chip"))
    lib, src = folder / f"{key.hexdigest()[:32]}.so", folder / f"{key.hexdigest()[:32]}.c"
    if lib.exists():
        return lib
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(source)
    os.replace(tmp, src)  # atomic, like the library below: concurrent builds never see half a file
    proc = subprocess.run([cc, *FLAGS, f"-I{HEADER.parent}", str(src), "-o", str(tmp), "-lm"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise sdk.KernelCompileError(str(src), (proc.stderr or proc.stdout)[-8000:])
    os.replace(tmp, lib)
    return lib
