"""Coil: a pluggable-device compiler for PyTorch.

``torch.compile(model, backend="coil")`` works after ``pip install`` (the backend reaches
Dynamo through an entry point). Public API: :func:`compile_fx` (the backend),
:func:`explain`, :func:`register_backend_for_device`, and :mod:`coil.config`."""
from __future__ import annotations

from typing import Any

from . import config
from .host import CoilHost
from .plugins import register_backend_for_device
from .sdk import host as _sdk_host
from .version import __version__

# the SDK's tools that drive the compiler (the conformance kit, `coil cache export|import`)
# reach it through coil.sdk.host, as the SDK imports nothing of the core
_sdk_host.register(CoilHost())

__all__ = ["compile_fx", "explain", "register_backend_for_device", "config", "__version__"]


def __getattr__(name: str) -> Any:
    # lazy: `import coil` imports no torch (0.06 s); coil.backend brings torch._dynamo
    # (~2.4 s), coil.report the compiler and torch (~1.4 s)
    if name == "compile_fx":
        from .backend import compile_fx
        return compile_fx
    if name == "explain":
        from .report import explain
        return explain
    if name == "cache":  # coil.cache: save_artifacts / load_artifacts
        import importlib
        return importlib.import_module(".cache", __name__)
    raise AttributeError(name)
