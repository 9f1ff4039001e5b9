"""What a compiled Triton module is made of, in a form that pickles: per Coil kernel, its
canonical Triton functions (source and launch fields) and what its launcher needs beyond
them, plus the binaries built so far. ``TritonBackend.compile`` builds launchers from these
plans, and so does ``import_module`` on a graph-cache hit, from the plans ``export_module``
saved: loading the source again makes Triton's own disk cache hit on each build, and the
autotune cache (keyed by the same source) on each tuning.

Binaries (:class:`Binary`): a module exported on a GPU carries every build its launchers
hold (Triton's metadata JSON and the cubin, not the intermediate IR), so that a load on
another machine of the same kind puts them into Triton's cache under the key Triton gives
them and builds nothing. A binary made for another target or Triton version is refused with
the reason (:func:`refusal`) and that kernel is built from source as on a miss; a key that
Triton computes differently here (another ``ptxas``, other cache-invalidating environment
variables) simply misses, harmlessly. Only what the module held when the graph was stored
travels: static kernels' builds (made before the first launch), not those a kernel with
symbolic sizes makes per size bucket at run time."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

import coil.sdk as sdk

from .codegen import KernelSource
from .template import product_host

log = logging.getLogger(__name__)

#: The form of ``TritonBackend.export_module``'s bytes; raise it when they change.
EXPORT_FORMAT = "cuda_triton-module-4"


@dataclass(frozen=True)
class TemplateSpec:
    """What :class:`~.template.TemplateLauncher` reads of a template kernel: enough to stand
    in for the ``Kernel`` when the module is imported instead of compiled."""

    args: tuple[Any, ...]
    problem: Any
    output: str
    bias: Any
    alpha: float
    beta: float
    measure: bool
    layout: tuple[tuple[int, ...], tuple[int, ...], Any]  # the product's size, stride, dtype
    unfused_args: tuple[Any, ...] | None
    #: The epilogue output that may hold the product on the library side (``template.product_host``).
    product_host: str | None = None

    @classmethod
    def of(cls, k: sdk.Kernel) -> TemplateSpec:
        call = k.template
        layout = call.node.layout
        return cls(tuple(k.args), call.problem, call.output, call.bias, call.alpha, call.beta, call.measure,
                   (tuple(int(s) for s in layout.size), tuple(int(s) for s in layout.stride), layout.dtype),
                   tuple(call.unfused.args) if call.unfused is not None else None,
                   product_host(call, {name: i for i, name in enumerate(k.args)}))

    def kernel(self) -> Any:
        """A stand-in for the kernel, with the attributes the launcher reads."""
        size, stride, dtype = self.layout
        unfused = SimpleNamespace(args=list(self.unfused_args)) if self.unfused_args is not None else None
        call = SimpleNamespace(problem=self.problem, output=self.output, bias=self.bias, alpha=self.alpha,
                               beta=self.beta, measure=self.measure, unfused=unfused,
                               product_host=self.product_host,
                               node=SimpleNamespace(layout=SimpleNamespace(size=size, stride=stride, dtype=dtype)))
        return SimpleNamespace(args=list(self.args), template=call)


@dataclass(frozen=True)
class KernelPlan:
    """How one Coil kernel launches: its canonical Triton functions in launch order, the
    argument positions tuning must clone, the count of buffer arguments (split reductions
    put workspaces after them) and, for a template kernel, its :class:`TemplateSpec`."""

    name: str
    sources: tuple[KernelSource, ...]
    mutated: tuple[int, ...]
    n_buffers: int
    template: TemplateSpec | None = None
    #: A template kernel's library side: the positions to clone among its epilogue kernel's
    #: own arguments (the second source), which are not the template's.
    unfused_mutated: tuple[int, ...] = ()

    def mutated_of(self, source: int) -> tuple[int, ...]:
        """The argument positions tuning must clone for the ``source``-th function."""
        return self.unfused_mutated if self.template is not None and source == 1 else self.mutated


Target = tuple[str, Any, int]  # Triton's GPUTarget as a tuple: backend, arch, warp size


@dataclass(frozen=True)
class Binary:
    """One Triton build as bytes: the key Triton's cache files it under
    (``CompiledKernel.hash``), the file name of its metadata, the target and Triton version it
    was built for, and the files of its cache group a load needs (the metadata JSON and the
    binary), by file name."""

    hash: str
    metadata_file: str
    target: Target
    triton_version: str
    files: dict[str, bytes]

    @classmethod
    def of(cls, compiled: Any) -> Binary | None:
        """The build ``compiled`` (a ``triton.compile`` result) as bytes; None for anything
        else (a launcher under the interpreter holds no builds)."""
        group = getattr(compiled, "metadata_group", None)
        asm = getattr(compiled, "asm", None)
        if not group or asm is None:
            return None
        binary_ext = next((ext for ext, value in dict(asm).items() if isinstance(value, bytes)), None)
        wanted = [name for name in group if name.endswith(".json") or name.endswith(f".{binary_ext}")]
        metadata_file = next((name for name in wanted if name.endswith(".json")), None)
        if binary_ext is None or metadata_file is None:
            return None
        try:
            files = {name: Path(group[name]).read_bytes() for name in wanted}
        except OSError:  # Triton's cache lost the files since the build: it travels as source
            return None
        md = compiled.metadata
        target = md.target
        return cls(compiled.hash, metadata_file, (target.backend, target.arch, target.warp_size),
                   str(getattr(md, "triton_version", triton_version())), files)


def current_target() -> Target | None:
    """The GPU Triton would build for here (None without one)."""
    try:
        if not torch.cuda.is_available():
            return None
        from triton.runtime import driver  # optional: only with a GPU
        t = driver.active.get_current_target()
        return (t.backend, t.arch, t.warp_size)
    except Exception:  # noqa: BLE001 - no driver, no GPU: nothing to install into
        return None


def triton_version() -> str:
    import triton  # optional: the CPU-only path imports this module
    return triton.__version__


def _spell(target: Target) -> str:
    backend, arch, warp = target
    return f"{backend} arch {arch} (warp size {warp})"


def refusal(binary: Binary, here: Target | None, version: str) -> str | None:
    """Why ``binary`` cannot serve this machine (``here``: :func:`current_target`,
    ``version``: Triton's), or None when it can."""
    if here is None:
        return f"built for {_spell(binary.target)}, and this machine has no GPU"
    if tuple(binary.target) != tuple(here):
        return f"built for {_spell(binary.target)}, this GPU is {_spell(here)}"
    if binary.triton_version != version:
        return f"built by Triton {binary.triton_version}, this is Triton {version}"
    return None


def install(binary: Binary) -> bool:
    """Put ``binary`` into Triton's disk cache under its key, where ``triton.compile`` of the
    same kernel finds it; whether it was new there."""
    from triton.runtime.cache import get_cache_manager  # optional: only when installing a build
    manager = get_cache_manager(binary.hash)
    if manager.get_group(binary.metadata_file) is not None:
        return False
    group = {name: manager.put(data, name, binary=True) for name, data in binary.files.items()}
    manager.put_group(binary.metadata_file, group)
    return True


def install_all(binaries: list[Binary], graph_name: str, here: Target | None,
                version: str) -> tuple[int, list[str]]:
    """Install the binaries of an imported module that fit this machine (``here``:
    :func:`current_target`; ``version``: Triton's): how many were new in Triton's cache, and
    the reason for each refused one (logged once per module)."""
    if not binaries:
        return 0, []
    installed, refused = 0, []
    for binary in binaries:
        reason = refusal(binary, here, version)
        if reason is not None:
            refused.append(reason)
            continue
        try:
            installed += install(binary)
        except OSError as exc:  # an unwritable Triton cache: those kernels build from source
            refused.append(f"Triton's cache could not take it ({exc})")
    if refused:
        log.warning("coil: %s: %d of %d cached Triton binaries not used (%s); building those kernels "
                    "from source", graph_name, len(refused), len(binaries), refused[0])
    return installed, refused


__all__ = ["EXPORT_FORMAT", "KernelPlan", "TemplateSpec", "Binary", "current_target", "triton_version",
           "refusal", "install", "install_all"]
