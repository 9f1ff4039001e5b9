"""Finding a kernel Triton already built without asking ``triton.compile``.

On a cache hit ``triton.compile`` still computes its cache key, and that key hashes the
kernel's function with every function it calls (Triton's dependency walk over the source):
measured on the 2-core development machine, 11 ms per kernel, where reading the built kernel
from Triton's cache takes 0.5 ms. A model's warm start loads a hundred kernels or more, so
the walk was most of a graph-cache hit's kernel loading.

This index maps a key of Coil's own -- the function's text, signature, constants, options,
target, Triton's version and cache-invalidating environment, Triton's backend hash (the
compiler tools) and a digest of this plugin's sources (the helper functions kernels call) --
to the Triton cache entry the build went to, in Coil's disk cache (namespace
``triton-builds``). A lookup reads that entry from Triton's cache as ``triton.compile``
would on a hit; an entry whose files are gone (Triton's cache cleared) is built again."""
from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from coil.sdk.diskcache import DiskCache

log = logging.getLogger(__name__)

FORMAT = "triton-builds-1"


def key(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], attrs: dict[Any, Any],
        options: dict[str, Any], target: Any) -> str:
    """Coil's key of one build: of ``fn`` (a ``triton.jit`` function) with what
    ``triton.compile``'s ``ASTSource`` and options get (``target``: a ``GPUTarget``)."""
    import triton  # optional: the CPU-only path imports this module and never compiles
    from triton.compiler.compiler import get_cache_invalidating_env_vars
    parts = [FORMAT, triton.__version__, _plugin_digest(), _compiler_tools(target),
             repr(target), _file_digest(_tool("libdevice_path")),
             fn.src, fn.__name__, repr(sorted(signature.items())), repr(sorted(constexprs.items())),
             repr(sorted(attrs.items())), repr(sorted(options.items())),
             repr(sorted(get_cache_invalidating_env_vars().items()))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]


@functools.lru_cache(maxsize=None)
def _plugin_digest() -> str:
    """A digest of this package's sources: the helpers a kernel calls are defined here, and a
    changed helper must not find a build of the old one."""
    h = hashlib.sha256()
    folder = Path(__file__).parent
    for path in sorted(folder.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _tool(name: str) -> Any:
    """Triton's NVIDIA knob ``name`` (a ptxas, with its path and version; the libdevice's
    path) as this process has it now: torch's Inductor points both at the CUDA toolkit's
    when it compiles."""
    import triton  # optional: only when compiling
    try:
        return getattr(triton.knobs.nvidia, name)
    except Exception:  # noqa: BLE001 - no such knob on this Triton, or a tool not found
        return None


def _file_digest(path: Any) -> str:
    """A digest of the file at ``path`` (Triton keys its builds by the libdevice's content);
    empty for None (Triton's own)."""
    if not path:
        return ""
    try:
        stat = Path(path).stat()
    except OSError:
        return f"missing:{path}"
    return _digest_of(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _digest_of(path: str, size: int, mtime_ns: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _compiler_tools(target: Any) -> str:
    """The compiler tools a build for ``target`` runs. For CUDA, the ptxas Triton would run
    now, path and version, asked afresh: Triton's own hash of its CUDA backend keeps the
    ptxas version it first saw for the rest of the process, and torch's Inductor moves
    Triton to the CUDA toolkit's ptxas when it first compiles. A process where Inductor ran
    first thus keys its builds by one ptxas and runs another; its compile workers, started
    later, key them by the one that runs, and every kernel they built was missed and built
    again here. Elsewhere, Triton's backend hash."""
    if getattr(target, "backend", None) == "cuda":
        return repr(_tool("ptxas_blackwell" if int(target.arch) >= 100 else "ptxas"))
    return _backend_hash(target)


@functools.lru_cache(maxsize=None)
def _backend_hash(target: Any) -> str:
    from triton.compiler.compiler import make_backend  # optional: only when compiling
    return str(make_backend(target).hash())


@functools.lru_cache(maxsize=1)
def _store() -> DiskCache:
    return DiskCache.in_namespace("triton-builds", layer="kernel")


def load(build_key: str, ast_source: Any) -> Any | None:
    """The kernel built under ``build_key``, read from Triton's cache; None when the index
    or Triton's cache lacks it."""
    data = _store().read(build_key, ".json", remote=False, count=False)
    if data is None:
        return None
    try:
        entry = json.loads(data)
        from triton.compiler import CompiledKernel  # optional: only when compiling
        from triton.runtime.cache import get_cache_manager
        group = get_cache_manager(entry["hash"]).get_group(entry["file"])
        if not group or entry["file"] not in group or len(group) < 2:
            return None  # Triton's cache no longer holds the build
        return CompiledKernel(ast_source, group, entry["hash"])
    except Exception as exc:  # noqa: BLE001 - a stale or foreign entry: build as usual
        log.debug("coil: build index entry %s unusable (%s: %s)", build_key, type(exc).__name__, exc)
        return None


def record(build_key: str, ast_source: Any, compiled: Any) -> None:
    """Remember where ``triton.compile`` put ``compiled`` (a ``CompiledKernel``): the entry
    ``hash`` of Triton's cache, and the metadata file it names after the function."""
    name = f"{ast_source.name[:150]}.json"
    if name not in (getattr(compiled, "metadata_group", None) or {}):
        return
    try:
        _store().write(build_key, ".json", json.dumps({"hash": compiled.hash, "file": name}).encode(),
                       remote=False)
    except OSError as exc:  # a read-only or full cache: the next process asks Triton again
        log.debug("coil: build index not written: %s", exc)
