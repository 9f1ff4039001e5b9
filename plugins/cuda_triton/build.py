"""One ``triton.compile`` of a generated kernel in one configuration (:func:`compile_for`),
through Coil's build index. Imports neither torch nor the code writer: the compile workers
(:mod:`.compile_worker`) import this module, and a worker that imported torch took about
4 s to come up on the H200's host instead of about 1.5."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

from . import build_index
from .configs import Config

if TYPE_CHECKING:  # annotations only
    from .source import KernelSource

HOPPER = ("cuda", 90, 32)


def has_rblock(src: KernelSource) -> bool:
    """Whether the kernel takes an ``RBLOCK`` (reductions and scans; not pointwise kernels,
    nor serial scatters, which take only ``XBLOCK``)."""
    return src.shape not in ("pointwise", "serial")


def signature(src: KernelSource, reduction: bool) -> dict[str, str]:
    sig = dict(zip(src.params, src.types))
    sig["XBLOCK"] = "constexpr"
    if reduction:
        sig["RBLOCK"] = "constexpr"
    if src.shape == "template":
        sig["KBLOCK"] = sig["GROUP_M"] = "constexpr"
    return sig


def compile_for(fn: Any, src: KernelSource, cfg: Config, target: Any = None, aligned: bool = True,
                debug: bool = False, on_cache: Callable[[bool], None] | None = None,
                cached_only: bool = False) -> Any:
    """``triton.compile`` of one configuration (``target``: None for the current GPU);
    ``on_cache(hit)`` learns whether Triton's disk cache held the binary. ``cached_only``:
    only what Coil's build index finds (None when it finds nothing), never a compile."""
    import triton  # optional: the CPU-only path imports this module and never compiles
    from triton.compiler import ASTSource
    reduction = has_rblock(src)
    n_ptrs = len(src.buffers)
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(n_ptrs)} if aligned else {}
    sig, constexprs = signature(src, reduction), cfg.constexprs(reduction)
    ast = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "debug": debug}
    if debug:  # the bounds checks' asserts only: Coil's integer arithmetic wraps on purpose
        options["sanitize_overflow"] = False
    indexed = None
    if not triton.knobs.compilation.always_compile:
        where = target if target is not None else triton.runtime.driver.active.get_current_target()
        indexed = build_index.key(fn, sig, constexprs, attrs, options, where)
        built = build_index.load(indexed, ast)
        if built is not None:  # read from Triton's cache without its key's dependency walk
            if on_cache is not None:
                on_cache(True)
            return built
    if cached_only:
        return None
    with _listening(on_cache):
        built = triton.compile(ast, target=target, options=options)
    if indexed is not None:
        build_index.record(indexed, ast, built)
    return built


@contextlib.contextmanager
def _listening(on_cache: Callable[[bool], None] | None) -> Iterator[None]:
    """Triton's compilation listener (its only report of a cache hit) set to tell
    ``on_cache``, and whoever listened before, for the duration of one compile."""
    from triton import knobs  # optional: only when compiling
    compilation = getattr(knobs, "compilation", None)
    if on_cache is None or not hasattr(compilation, "listener"):
        yield
        return
    before = compilation.listener

    def listener(**kwargs: Any) -> None:
        on_cache(bool(kwargs.get("cache_hit")))
        if before is not None:
            before(**kwargs)

    compilation.listener = listener
    try:
        yield
    finally:
        compilation.listener = before
