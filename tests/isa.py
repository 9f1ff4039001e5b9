"""Test helper: build the C++ plugin's kernels for an instruction set below the machine's.

``built_for("avx2")`` adds ``-mno-avx512f`` to the plugin's flags (after ``-march=native``),
so GCC vectorises for AVX2 on a machine that has AVX-512: the code an AVX2-only machine
(most laptops and CI runners) gets. Where the machine is not x86-64 with AVX-512 that build
is the machine's own, and the test skips, saying why."""
from __future__ import annotations

import contextlib
import platform
from pathlib import Path
from typing import Iterator

import pytest

import coil

#: Instruction set -> the C++ plugin's extra flags.
FLAGS = {"native": "", "avx2": "-mno-avx512f"}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def below_native_reason(name: str) -> str:
    """Why ``name`` cannot be built below this machine's instruction set ("" if it can)."""
    if name == "native":
        return ""
    if platform.machine() != "x86_64":
        return f"{name}: an x86-64 instruction set, on {platform.machine()}"
    if "avx512f" not in cpu_flags():
        return f"{name}: this machine has no AVX-512, so its own build is already AVX2 or less"
    return ""


@contextlib.contextmanager
def built_for(name: str) -> Iterator[None]:
    reason = below_native_reason(name)
    if reason:
        pytest.skip(reason)
    with coil.config.override(**{"cpu_cpp.extra_cflags": FLAGS[name]}):
        yield
