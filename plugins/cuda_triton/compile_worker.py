"""A compile worker of :mod:`.compile_pool`: reads jobs as JSON lines on stdin, builds each
kernel into Triton's cache, answers ``{"ok": ...}`` on stdout (everything else it or Triton
prints goes to stderr).

Only ever run as its own process (``python -m coil_cuda_triton.compile_worker``), so it
imports triton at the top, and never torch (:mod:`.build` and :mod:`.loader` need neither
torch nor the code writer): importing torch was most of a worker's start, and every first
call waits for its workers (``tests/test_triton_compile_pool.py`` checks the imports)."""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import get_cache_invalidating_env_vars

from . import loader
from .build import compile_for
from .configs import Config


def adopt(settings: dict[str, Any] | None) -> None:
    """Take over the parent's Triton settings (:func:`.compile_pool.triton_settings`): its
    ``TRITON_*`` and cache-invalidating environment, exactly, and its libdevice. The build
    then lands under the cache key the parent looks up."""
    if not settings:
        return
    env = settings.get("env", {})
    ours = [k for k in os.environ if k.startswith("TRITON_")] + list(get_cache_invalidating_env_vars())
    for name in {k for k in ours if k not in env}:
        os.environ.pop(name, None)
    os.environ.update(env)
    knobs = triton.knobs
    if knobs.nvidia.libdevice_path != settings.get("libdevice"):
        knobs.nvidia.libdevice_path = settings.get("libdevice")


def build(path: str, fields: dict[str, Any], cfg: dict[str, Any], aligned: bool, debug: bool, arch: int,
          settings: dict[str, Any] | None = None) -> bool:
    """Build one kernel under the parent's Triton ``settings``; whether Triton's cache held it
    already."""
    adopt(settings)
    with open(path) as f:
        module = loader.load(f.read(), interpret=False)
    src = SimpleNamespace(**fields)
    hits: list[bool] = []
    # the parent's GPU, named: a worker never creates a CUDA context
    compile_for(getattr(module, src.name), src, Config(**cfg), target=GPUTarget("cuda", arch, 32),
                       aligned=aligned, debug=debug, on_cache=hits.append)
    return bool(hits and hits[0])


def _warm_up(arch: int) -> None:
    """Compile one tiny kernel: a process's first ``triton.compile`` pays for initialising
    MLIR and LLVM (seconds), which must not land on the first real job."""

    @triton.jit
    def coil_warm_up(x, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + i, tl.load(x + i, mask=i < n) * 2.0, mask=i < n)

    src = ASTSource(fn=coil_warm_up, signature={"x": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                    constexprs={"BLOCK": 128})
    triton.compile(src, target=GPUTarget("cuda", arch, 32))


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints must not corrupt the replies
    try:
        _warm_up(int(sys.argv[1]))
    except Exception as exc:  # a worker that cannot compile never reports ready
        print(f"coil compile worker: warm-up failed: {exc}", file=sys.stderr)
        return
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        try:
            answer = {"ok": True, "hit": build(*json.loads(line))}
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(answer) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
