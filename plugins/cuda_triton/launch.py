"""Launchers: what the wrapper calls for each kernel, with as little Python per launch as we
can manage.

On the GPU a kernel is compiled once per configuration with ``triton.compile`` (no JIT
argument binding at launch time) and launched through the compiled binary's own launcher
on the stream the wrapper passes. Pointer arguments are compiled as 16-byte aligned (Triton
then emits 128-bit accesses); a launch whose pointers are not aligned (a view with an odd
offset) uses a second, unspecialised build, made on first need.

The first launch tunes: every candidate configuration runs on the real arguments (buffers
the kernel both reads and writes are cloned first, so tuning never changes results), the
winner goes to the disk cache, and the launcher rebinds itself to the winner so later
launches skip the bookkeeping. With symbolic sizes the winner is kept per size bucket."""
from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from typing import Any, Callable, Sequence

from coil.sdk import ExprPrinter, cachestats

from . import autotune, compile_pool, configs
from .build import HOPPER, compile_for, has_rblock, signature  # noqa: F401  (the launcher's; re-exported)
from .codegen import KernelSource
from .configs import Config
from .raw_launch import RawLauncher, usable

log = logging.getLogger(__name__)

def count_build(hit: bool) -> None:
    """One build of a Triton binary, counted in the kernel layer (``coil.explain``)."""
    cachestats.count("kernel", "triton", "hit" if hit else "miss")


_built_twice = [0]


def _worker_build_found(hit: bool) -> None:
    """After a compile worker built a binary, whether this process found it in the cache. A
    miss means the build is made twice, here in the launching thread: the worker built under
    other Triton settings than this process's (:func:`.compile_pool.triton_settings`)."""
    if hit:
        return
    _built_twice[0] += 1
    cachestats.count("kernel", "triton", "miss")
    if _built_twice[0] == 1:
        log.warning("coil: a kernel a compile worker built was not in Triton's cache here, so it "
                    "is built again in this process: the worker's Triton settings differ")


def built_twice() -> int:
    """Binaries a worker built that this process had to build again (should stay 0)."""
    return _built_twice[0]


class Launcher:
    """Launches one kernel: ``launcher(stream, *args)`` with args in ``Kernel.args`` order."""

    def __init__(self, src: KernelSource, fn: Any, *, interpret: bool, tune_key: Callable[[Any], str],
                 mutated: Sequence[int] = (), debug: bool = False, tune_in_interpreter: bool = False) -> None:
        self.src = src
        self.fn = fn
        self.interpret = interpret
        self.tune_in_interpreter = tune_in_interpreter
        self.debug = debug
        self.reduction = has_rblock(src)
        self.n_ptrs = len(src.buffers)
        self.mutated = tuple(mutated)
        self._tune_key = tune_key
        self._xnumel = _size_fn(src, "xnumel")
        self._binaries: dict[tuple[Config, bool], Any] = {}
        #: Aligned builds queued in the compile pool, not yet taken into ``_binaries``.
        self._jobs: dict[Config, compile_pool.Job] = {}
        #: Builds already counted (a compile worker made them; the build here hits its cache)
        self.counted: set[tuple[Config, bool]] = set()
        self._raw: dict[tuple[Config, bool], Any] = {}
        self._grids: dict[Config, int] = {}
        self._winners: dict[Any, Config] = {}
        #: (its raw launcher's ``run``, grid) of a static kernel's winning configuration, once it ran
        self._fast: tuple[Any, int] | None = None
        self.static = not src.params[self.n_ptrs:]
        self.cache = autotune.TuneCache()
        self.tuned = 0  # configurations benchmarked by this launcher (the conformance kit reads it)
        #: The configuration a static kernel builds and launches without tuning, when its
        #: graph's build budget left it out (:mod:`.build_budget`); None: it tunes.
        self.untuned: Config | None = None
        #: The disk cache's winner for static sizes, once looked up (a 1-tuple; None: not yet).
        self._cached_winner: tuple[Config | None] | None = None

    # -- compilation

    def binary(self, cfg: Config, aligned: bool = True) -> Any:
        got = self._binaries.get((cfg, aligned))
        if got is not None:
            return got
        job = self._jobs.get(cfg) if aligned else None
        if job is not None:
            if not compile_pool.serving() and job.claim():  # no worker is up: build it here
                try:
                    self.build_queued(cfg)
                except Exception:
                    job.finish({"ok": False})
                    raise
                job.finish({"ok": True, "local": True})
            else:
                answer = compile_pool.wait(job)
                self._jobs.pop(cfg, None)
                if answer.get("ok") and not answer.get("local"):  # the build below hits the cache
                    count_build(bool(answer.get("hit")))
                    self.counted.add((cfg, True))
            got = self._binaries.get((cfg, aligned))
            if got is not None:
                return got
        counted = (cfg, aligned) in self.counted
        got = compile_for(self.fn, self.src, cfg, aligned=aligned, debug=self.debug,
                          on_cache=_worker_build_found if counted else count_build)
        self._binaries[(cfg, aligned)] = got
        return got

    def queue(self, cfg: Config, job: compile_pool.Job) -> None:
        """``cfg``'s aligned build is ``job`` in the compile pool: :meth:`binary` takes it from
        there (or claims it, if no worker has started it)."""
        self._jobs[cfg] = job

    def build_queued(self, cfg: Config) -> None:
        """Build ``cfg`` in this process, its pool job claimed by this thread."""
        self._jobs.pop(cfg, None)
        self._binaries[(cfg, True)] = compile_for(self.fn, self.src, cfg, debug=self.debug, on_cache=count_build)

    def load_indexed(self, cfg: Config) -> bool:
        """Whether the aligned build of ``cfg`` is loaded, from Coil's build index if this
        launcher lacked it (a warm cache: no compile worker need be asked)."""
        if (cfg, True) not in self._binaries:
            got = compile_for(self.fn, self.src, cfg, debug=self.debug, on_cache=count_build, cached_only=True)
            if got is None:
                return False
            self._binaries[(cfg, True)] = got
        return True

    def built(self) -> list[Any]:
        """The binaries built so far (``triton.compile`` results)."""
        return list(self._binaries.values())

    def candidates(self, sizes: tuple[int, ...]) -> list[Config]:
        if self.static:
            return [self.untuned] if self.untuned is not None else list(self.src.configs)
        shape = self.src.shape
        xn = self._xnumel(sizes)
        return configs.candidates(shape, xn, None, self.src.x_contiguous) if shape != "persistent" \
            else list(self.src.configs)

    def to_build(self) -> list[Config]:
        """What the first launch will need: the cached winner if there is one, else every
        candidate (symbolic sizes: none yet, their candidates depend on the size bucket)."""
        if self.interpret or not self.static:
            return []
        candidates = self.candidates(())
        if len(candidates) == 1:  # nothing to tune, so nothing on disk to ask for
            return candidates
        if self._cached_winner is None:  # asked once: the lookup may go to a remote cache
            self._cached_winner = (self.cache.get(self._tune_key(None)),)
        winner = self._cached_winner[0]
        return [winner] if winner else candidates

    def skip_tuning(self) -> None:
        """Build and launch the first candidate alone (the build budget's choice)."""
        self.untuned = self.src.configs[0]

    def describe(self) -> str:
        """The configuration launches use and how it was chosen (``coil.explain``)."""
        if not self.static:
            return "; ".join(f"sizes up to {bucket}: {cfg}" for bucket, cfg in self._winners.items())
        cfg = self._winners.get(None)
        if cfg is None:
            return ""
        if self.interpret and not self.tune_in_interpreter:
            return f"{cfg} (the interpreter's widest blocks, not tuned)"
        if self.untuned is not None:
            return f"{cfg} (its shape's usual winner, not tuned: the graph's build budget)"
        n = len(self.src.configs)
        return f"{cfg} (tuned over {n} candidates)" if n > 1 else str(cfg)

    def precompile(self) -> None:
        for cfg in self.to_build():
            self.binary(cfg)

    def winner(self, bucket: Any = None) -> Config | None:
        """The configuration launches of a size bucket use (None: static sizes), once chosen."""
        return self._winners.get(bucket)

    def pin(self, cfg: Config, bucket: Any = None) -> None:
        """Launch ``cfg`` for the size bucket from now on, without tuning (chosen elsewhere)."""
        self._winners[bucket] = cfg

    # -- launching

    def __call__(self, stream: Any, *args: Any) -> None:
        fast = self._fast
        if fast is not None and fast[0](fast[1], stream, args):
            return  # a static kernel, tuned: only the pointers change (False: not aligned)
        sizes = tuple(args[self.n_ptrs:])
        bucket = None if self.static else configs.bucket(sizes)
        cfg = self._winners.get(bucket)
        if cfg is None:
            cfg = self._choose(bucket, stream, args)
            self._winners[bucket] = cfg
        self.launch(cfg, stream, args, sizes)
        if self.static and not self.interpret and self._fast is None:
            raw, grid = self._raw.get((cfg, True)), self.grid(cfg, sizes)
            if raw and grid:
                self._fast = (raw.run, grid)

    def _choose(self, bucket: Any, stream: Any, args: Sequence[Any]) -> Config:
        if self.interpret and not self.tune_in_interpreter:
            return self._interpreter_config(tuple(args[self.n_ptrs:]))
        candidates = self.candidates(tuple(args[self.n_ptrs:]))
        if len(candidates) == 1:
            return candidates[0]
        key = self._tune_key(bucket)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        bench = autotune.wall_bench if self.interpret else autotune.cuda_bench
        with autotune.trial_args(args, self.mutated) as trial:
            best, timings = autotune.select(
                candidates, lambda cfg: (lambda: self.launch(cfg, stream, trial)), bench)
        self.tuned += len(timings)
        log.debug("coil: tuned %s: %s", self.src.name, timings)
        self.cache.put(key, best, timings, self.src.name)
        return best

    def _interpreter_config(self, sizes: tuple[int, ...]) -> Config:
        """The interpreter runs programs one after another, in Python: the fewest, widest
        programs that the kernel's source allows (blocks must divide an extent the source
        reads without a mask)."""
        src = self.src
        xnumel = self._xnumel(sizes)
        budget = 2**14
        if src.shape in ("serial", "scan", "split", "pointwise-2d", "tile2d", "template"):
            return src.configs[0]
        if src.shape == "persistent":
            rblock = src.configs[0].rblock
        elif src.shape == "looped":
            rnumel = int(src.rnumel) if src.rnumel.is_number else None
            rblock = _block_within(rnumel, 1024, masked=src.rmask)
        else:
            rblock = 1
        xblock = _block_within(xnumel, max(1, budget // rblock), masked=src.xmask)
        return Config(xblock, rblock, num_warps=1)

    def grid(self, cfg: Config, sizes: tuple[int, ...]) -> int:
        """Programs to launch (0: nothing to write); memoised for static kernels, whose
        launches all have the same sizes."""
        if not self.static:
            return self._grid(cfg, sizes)
        got = self._grids.get(cfg)
        if got is None:
            got = self._grids[cfg] = self._grid(cfg, sizes)
        return got

    def _grid(self, cfg: Config, sizes: tuple[int, ...]) -> int:
        xnumel = self._xnumel(sizes)
        if xnumel == 0:
            return 0
        if self.src.shape == "serial":
            return 1
        if self.src.grid_dims is not None:  # a template: tiles of the product, batch by batch
            b, m, n = self.src.grid_dims
            return b * -(-m // cfg.xblock) * -(-n // cfg.rblock)
        if self.src.shape == "tile2d":  # static sizes: tiles of rows times tiles of columns
            cols = int(self.src.rnumel)
            return -(-xnumel // cfg.xblock) * -(-cols // cfg.rblock)
        return -(-xnumel // cfg.xblock)

    def launch(self, cfg: Config, stream: Any, args: Sequence[Any],
               sizes: tuple[int, ...] | None = None) -> None:
        if sizes is None:
            sizes = tuple(args[self.n_ptrs:])
        grid = self.grid(cfg, sizes)
        if grid == 0:
            return  # nothing to write (and an empty tensor may have no memory at all)
        if self.interpret:
            _interpreted_launch(self.fn, grid, args, cfg.constexprs(self.reduction), self.debug)
            return
        ptrs = [a.data_ptr() for a in args[:self.n_ptrs]]
        aligned = not functools.reduce(operator.or_, ptrs, 0) & 15
        raw = self._raw.get((cfg, aligned))
        if raw is None:
            raw = self._raw_launcher(cfg, aligned)
        if raw is not False:
            raw.run(grid, stream, args if isinstance(args, tuple) else tuple(args))
            return
        b = self.binary(cfg, aligned)
        b.run(grid, 1, 1, stream, b.function, b.packed_metadata, None, None, None, *args,
              *cfg.constexprs(self.reduction).values())

    def _raw_launcher(self, cfg: Config, aligned: bool) -> Any:
        """A raw launcher for the binary (False when it needs Triton's own)."""
        b = self.binary(cfg, aligned)
        raw: Any = RawLauncher(b, self.src.types, aligned) if usable(b) else False
        self._raw[(cfg, aligned)] = raw
        return raw


def _interpreted_launch(fn: Any, grid: int, args: Sequence[Any], consts: dict[str, int], debug: bool) -> None:
    """One launch under Triton's interpreter, which patches ``triton.language`` as it runs:
    :func:`mathlib.interpreting` undoes that afterwards (else a later ``triton.compile`` in
    the process fails). With ``debug``, ``tl.device_assert`` is checked, as a debug build on
    the GPU does (the interpreter's builder ignores Triton's debug settings otherwise)."""
    # optional: triton (mathlib imports it at the top), only when a kernel is interpreted
    from triton.runtime import interpreter

    from . import mathlib
    builder = interpreter.interpreter_builder
    saved = builder.options
    if debug:
        builder.options = dataclasses.replace(saved, debug=True, sanitize_overflow=False)
    try:
        with mathlib.interpreting():
            fn[(grid,)](*args, **consts)
    finally:
        builder.options = saved


def _block_within(n: int | None, most: int, masked: bool) -> int:
    """A power-of-two block of at most ``most``: covering ``n`` when the source masks that
    extent, else dividing it."""
    if n is None:
        return most
    if masked:
        return min(configs.pow2_at_least(n), most)
    block = 1
    while block * 2 <= most and n % (block * 2) == 0:
        block *= 2
    return block


def _size_fn(src: KernelSource, what: str) -> Callable[[tuple[int, ...]], int]:
    """A function of the size arguments giving ``xnumel`` (compiled from the expression)."""
    expr = getattr(src, what)
    names = src.params[len(src.buffers):]
    text = ExprPrinter().print(expr)  # Python's spelling (the kernel's own is Triton's)
    code = f"lambda {', '.join(['_sizes'])}: (lambda {', '.join(names) or '*_'}: int({text}))(*_sizes)"
    return eval(code)  # noqa: S307 - our own generated expression over size names
