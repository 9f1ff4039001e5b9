"""Turning generated Triton source into kernel objects.

Triton reads a kernel's source back with ``inspect`` (both ``triton.jit`` and the
interpreter rewrite the function from its text), so a graph's kernels are written to a
file under Coil's cache directory and imported from there, in a namespace holding ``tl``,
the math helpers of :mod:`.mathlib` and the reduction helpers of :mod:`.runtime_lib`.
``jit`` in that namespace is ``triton.jit``, which is Triton's interpreter when
``TRITON_INTERPRET=1`` was set before triton was imported (the only way: Triton builds its
standard library, ``tl.sum`` included, at import time), so one source serves both."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from types import ModuleType
from typing import Any

import coil.sdk as sdk

_module_counter = [0]


def _jit(interpret: bool) -> Any:
    import triton  # optional: the CPU-only path imports this module
    if interpret and not triton.knobs.runtime.interpret:
        raise sdk.ToolchainError(
            "Triton's interpreter is off: set TRITON_INTERPRET=1 in the environment before "
            "triton is first imported (its standard library is built at import time)")
    return triton.jit


def namespace(interpret: bool) -> dict[str, Any]:
    """Names generated kernels may use."""
    from . import mathlib, runtime_lib  # they import triton: only when kernels load
    ns = dict(mathlib.namespace(interpret))
    jit = _jit(interpret)
    for name in runtime_lib.HELPERS:
        ns[name] = jit(getattr(runtime_lib, name))
    if interpret:
        ns["loop_bound"] = runtime_lib.interpreted_loop_bound
    ns["jit"] = jit
    return ns


def source_path(source: str) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    return os.path.join(sdk.cache_dir("triton-source"), f"coil_{digest}.py")


def write(source: str) -> str:
    """The cache file holding ``source`` (written once, atomically)."""
    path = source_path(source)
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: concurrent processes never see half a file
    return path


def load(source: str, interpret: bool) -> ModuleType:
    """Import ``source`` (a module of ``@jit`` functions) from a file in the cache."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    path = write(source)
    _module_counter[0] += 1
    name = f"coil_triton_{digest}_{_module_counter[0]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace(interpret))
    spec.loader.exec_module(module)
    return module
