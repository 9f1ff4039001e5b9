"""Test helpers: run a function eagerly and through Coil, and compare."""
from __future__ import annotations

import contextlib
import math
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest
import torch

import coil
from coil import plugins


def check(fn: Callable[..., Any], *args: Any, atol: float = 1e-5, rtol: float = 1e-5,
          dynamic: bool | None = False) -> "coil.explain":
    """Compile ``fn`` with Coil, compare with eager, and return Coil's report."""
    expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    report = coil.explain(fn, *args, dynamic=dynamic)
    torch.testing.assert_close(report.result, expected, atol=atol, rtol=rtol, equal_nan=True)
    return report


def matches_golden(text: str, path: Path, what: str) -> None:
    """Assert ``text`` equals the golden file ``path``; with ``COIL_UPDATE_GOLDEN=1`` (or when
    the file is missing, which then fails) write it instead."""
    if os.environ.get("COIL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(text)
        if os.environ.get("COIL_UPDATE_GOLDEN") != "1":
            pytest.fail(f"wrote missing golden file {path}; check it in")
    assert text == path.read_text(), f"{what} changed; see {path}"


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """``torch.set_num_threads(count)`` inside the block (the C++ plugin's choices depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def cpu_tensors() -> Iterator[None]:
    """CPU as the default device inside the block, even under ``COIL_TEST_DEVICE=cuda``: for
    tests that route the ``cpu`` device to each plugin in turn."""
    before = torch.get_default_device()
    # None drops the default-device mode altogether (make_fx of an op taking a generator
    # fails under one on torch 2.11, even a mode for the CPU)
    torch.set_default_device(None)
    try:
        yield
    finally:
        torch.set_default_device(None if before.type == "cpu" else before)


@contextlib.contextmanager
def cpu_routed_to(plugin: str, name: str) -> Iterator[Any]:
    """Route the ``cpu`` device to the C++ plugin (``"cpu_cpp"``) or to the Triton plugin's
    interpreted backend (``"triton"``, skipped where the interpreter is off) under the
    registration ``name``; yields the backend, and rebuilds the registry afterwards."""
    plugins.reset()
    try:
        if plugin == "cpu_cpp":
            from coil_cpu_cpp.backend import CppBackend
            backend = CppBackend()
            coil.register_backend_for_device("cpu", backend, name=name)
            yield backend
        else:
            triton = pytest.importorskip("triton")
            if not triton.knobs.runtime.interpret:
                pytest.skip("Triton's interpreter is off (tests/conftest.py sets TRITON_INTERPRET)")
            from coil_cuda_triton import mathlib
            from coil_cuda_triton.testing import interpreted_backend
            backend = interpreted_backend()
            coil.register_backend_for_device("cpu", backend, name=name)
            with mathlib.interpreting():
                yield backend
    finally:
        plugins.reset()


def special_values(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Values on a coarse grid (ties in most windows), with NaN, +-inf and signed zeros
    sprinkled in, and one corner of -inf wide enough to fill a padded window."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 2).round() / 2
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=gen)
    n = max(flat.numel() // 24, 1)
    for k, value in enumerate((math.nan, -math.inf, math.inf, -0.0, 0.0, math.nan)):
        flat[picks[k * n:(k + 1) * n]] = value
    x[..., :3, :3] = -math.inf
    return x.to(dtype)


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as module ``name`` (``bench/`` is scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module



#: Prepended to a script by :func:`processes_in_turn`: counts AOTAutograd traces of Coil's
#: backend in ``calls`` (the layers before AOTAutograd skip them).
COUNT_TRACES = """
import coil.backend as cb
calls = []
real = cb.aot_module_simplified
cb.aot_module_simplified = lambda *a, **k: calls.append(1) or real(*a, **k)
"""


def processes_in_turn(script: str, cache_dir: Path, count: int = 2) -> list[dict[str, Any]]:
    """Run ``script`` (after :data:`COUNT_TRACES`) in ``count`` fresh Python processes one
    after another, sharing the Coil cache ``cache_dir``; each prints one JSON line last,
    returned in order."""
    import json
    import subprocess
    env = dict(os.environ, COIL_CACHE_DIR=str(cache_dir))
    runs = []
    for _ in range(count):
        done = subprocess.run([sys.executable, "-c", COUNT_TRACES + script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def dynamo_graph(fn: Callable[..., Any], *args: Any) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The first graph Dynamo hands a backend for ``fn(*args)``, with its example inputs."""
    seen: list[Any] = []

    def grab(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=grab)(*args)
    return seen[0]


def clone_args(args: Any) -> list[Any]:
    """Fresh copies of a call's tensor arguments (detached, keeping ``requires_grad``), so
    that eager's and Coil's runs mutate and differentiate their own."""
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args]


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) result, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    return []


def wrapper_source(report: Any) -> str:
    """The wrapper source of every graph a ``coil.explain`` report holds."""
    return "\n".join(g.wrapper_source for g in report.graphs)

