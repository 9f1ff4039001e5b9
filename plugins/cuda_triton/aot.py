"""Ahead-of-time compilation for Hopper of every kernel the interpreter generated.

Under Triton's interpreter each compiled module's source lies in
``CACHE_DIR/triton-source/coil_<digest>.py`` with a manifest ``coil_<digest>.json`` next to it
(kernel names, parameters, signature types, shape, buffers and GPU configurations; see
``backend._record_manifest``). CI runs the differential tests that way on a machine with no
GPU, then this command compiles each of those kernels with ``triton.compile`` for
``cuda:90`` with every configuration its manifest lists, so a kernel Triton cannot compile
for the GPU fails CI even though the interpreter ran it::

    python -m coil_cuda_triton.aot [CACHE_DIR] [--jobs N]

What is compiled is the build the GPU makes first: pointer arguments 16-byte aligned
(``launch.compile_for(..., aligned=True)``); the unaligned fallback build is not compiled.
The sources are the interpreter's: kernel structure, indexing, masks, reductions and the
``coil_*`` helpers are the GPU's, but ops whose GPU spelling differs (``libdevice.*`` calls,
bfloat16 narrowing; :data:`mathlib.SPELLINGS`) are compiled in their interpreter spelling
(``tests/test_triton_mathlib.py`` compiles the GPU spellings). A kernel whose source holds a
``tl.device_assert`` (bounds checks) is compiled with ``debug`` on, as its launcher does.

Identical kernels (same function text, signature and configuration) are compiled once. The
process must not run Triton's interpreter: with ``TRITON_INTERPRET`` set, ``triton.jit``
gives interpreted functions, which do not compile."""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import glob
import hashlib
import importlib.util
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Sequence

import coil.sdk as sdk

from . import loader
from .configs import Config
from .build import HOPPER, compile_for
from .source import KernelShape


@dataclass(frozen=True)
class ManifestKernel:
    """What ``launch.compile_for`` reads of a ``KernelSource``, from a manifest."""

    name: str
    params: tuple[str, ...]
    types: tuple[str, ...]
    shape: KernelShape
    buffers: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    """One ``triton.compile``: a kernel of a source file in one configuration."""

    path: str
    kernel: ManifestKernel
    config: Config
    debug: bool


@dataclass(frozen=True)
class Failure:
    path: str
    kernel: str
    config: str
    error: str


@dataclass
class Plan:
    """The deduplicated compiles of a cache directory, and what could not even be planned."""

    modules: int = 0
    kernels: int = 0
    duplicates: int = 0
    tasks: list[Task] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


# ----------------------------------------------------------------------------- planning


def default_cache_dir() -> str:
    return os.path.dirname(sdk.cache_dir("triton-source"))


def plan(cache_dir: str) -> Plan:
    """Every (kernel, configuration) of every manifest under ``cache_dir/triton-source``,
    each distinct one once."""
    out = Plan()
    seen_kernels: set[str] = set()
    seen_tasks: set[str] = set()
    for manifest in sorted(glob.glob(os.path.join(cache_dir, "triton-source", "coil_*.json"))):
        out.modules += 1
        try:
            entry, path, text = _read(manifest)
            functions = _function_texts(text)
        except (OSError, ValueError, KeyError, SyntaxError) as exc:
            out.failures.append(Failure(manifest, "-", "-", f"unreadable: {type(exc).__name__}: {exc}"))
            continue
        for k in entry["kernels"]:
            kernel = ManifestKernel(k["name"], tuple(k["params"]), tuple(k["types"]), k["shape"],
                                    tuple(k["buffers"]))
            body = functions.get(kernel.name)
            if body is None:
                out.failures.append(Failure(path, kernel.name, "-", "no such function in the source file"))
                continue
            identity = _digest(body, kernel.types, kernel.shape)
            if identity in seen_kernels:
                out.duplicates += 1
                continue
            seen_kernels.add(identity)
            out.kernels += 1
            debug = "tl.device_assert" in body
            for c in k["configs"]:
                cfg = Config(**c)
                key = _digest(identity, str(cfg))
                if key not in seen_tasks:
                    seen_tasks.add(key)
                    out.tasks.append(Task(path, kernel, cfg, debug))
    return out


def _read(manifest: str) -> tuple[dict[str, Any], str, str]:
    with open(manifest) as f:
        entry = json.load(f)
    # the source next to the manifest (the recorded absolute path breaks when a cache moves)
    path = manifest[:-len(".json")] + ".py"
    if not os.path.exists(path):
        path = entry["source_path"]
    with open(path) as f:
        return entry, path, f.read()


def _function_texts(source: str) -> dict[str, str]:
    """Top-level function name -> its source text (decorators included)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = "\n".join(lines[first - 1:node.end_lineno])
    return out


def _digest(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


# ----------------------------------------------------------------------------- compiling (workers)

_modules: dict[str, ModuleType] = {}


def _load(path: str) -> ModuleType:
    """Import a generated source file with GPU ``triton.jit`` (once per worker process)."""
    module = _modules.get(path)
    if module is None:
        digest = hashlib.sha256(path.encode()).hexdigest()[:16]
        spec = importlib.util.spec_from_file_location(f"coil_aot_{digest}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        module.__dict__.update(loader.namespace(interpret=False))
        spec.loader.exec_module(module)
        _modules[path] = module
    return module


def compile_task(task: Task) -> Failure | None:
    """``triton.compile`` of one task for Hopper; a :class:`Failure` with Triton's error."""
    from triton.backends.compiler import GPUTarget  # optional: planning needs no triton
    try:
        fn = getattr(_load(task.path), task.kernel.name)
        compile_for(fn, task.kernel, task.config, target=GPUTarget(*HOPPER), aligned=True,  # type: ignore[arg-type]
                    debug=task.debug)
    except Exception as exc:  # Triton raises many kinds; each is a failure to report
        return Failure(task.path, task.kernel.name, str(task.config), f"{type(exc).__name__}: {exc}")
    return None


def _compile_chunk(tasks: Sequence[Task]) -> list[Failure | None]:
    return [compile_task(t) for t in tasks]


def run(tasks: Sequence[Task], jobs: int) -> list[Failure]:
    """Compile ``tasks`` on ``jobs`` processes; the failures."""
    if jobs <= 1 or len(tasks) <= 1:
        return [f for f in _compile_chunk(tasks) if f is not None]
    # small chunks, grouped by source file: each worker loads a file once, and stays busy
    ordered = sorted(tasks, key=lambda t: (t.path, t.kernel.name))
    size = max(1, min(16, len(ordered) // (jobs * 4)))
    chunks = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    failures: list[Failure] = []
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = {pool.submit(_compile_chunk, chunk): chunk for chunk in chunks}
        for future in concurrent.futures.as_completed(futures):
            try:
                failures += [f for f in future.result() if f is not None]
            except Exception as exc:  # a worker died (a crash inside Triton's C++)
                failures += [Failure(t.path, t.kernel.name, str(t.config), f"worker died: {exc!r}")
                             for t in futures[future]]
    return failures


# ----------------------------------------------------------------------------- command line


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no", "off")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coil_cuda_triton.aot",
        description="Compile for Hopper (cuda:90) every Triton kernel recorded under "
                    "CACHE_DIR/triton-source, in every configuration its manifest lists.")
    parser.add_argument("cache_dir", nargs="?", default=None,
                        help="Coil cache directory (default: coil's, COIL_CACHE_DIR)")
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: the CPU count)")
    args = parser.parse_args(argv)
    if _interpreting():
        print("coil aot: TRITON_INTERPRET is set, so triton.jit makes interpreted functions, "
              "which cannot be compiled; run without it (env -u TRITON_INTERPRET ...)", file=sys.stderr)
        return 2
    cache_dir = args.cache_dir or default_cache_dir()
    work = plan(cache_dir)
    if not work.tasks and not work.failures:
        print(f"coil aot: no Triton kernel manifests under {os.path.join(cache_dir, 'triton-source')}; "
              "run the tests with COIL_TEST_BACKEND=triton and this COIL_CACHE_DIR first", file=sys.stderr)
        return 1
    import triton.compiler  # noqa: F401  (once, before workers fork)
    start = time.perf_counter()
    failures = work.failures + run(work.tasks, max(1, args.jobs))
    seconds = time.perf_counter() - start
    print(f"coil aot: {work.modules} module(s), {work.kernels} distinct kernel(s) "
          f"({work.duplicates} duplicate(s) skipped), {len(work.tasks)} configuration(s) compiled for "
          f"cuda:{HOPPER[1]} in {seconds:.1f} s with {max(1, args.jobs)} job(s); {len(failures)} failure(s)")
    for f in failures:
        print(f"FAILED {f.kernel} [{f.config}] in {f.path}:\n  " + f.error.replace("\n", "\n  "))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
