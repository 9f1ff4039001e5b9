"""Template kernels: a matrix-product template (:mod:`coil.sdk.templates`, dialect
``"triton"``) with the kernel's epilogue written after it.

The template's statements leave the product tile in ``acc`` (``[XBLOCK, RBLOCK]`` float32)
with its rows ``offs_m`` and columns ``offs_n`` of batch ``pid_b``. The epilogue is then a
2-D tile kernel, as :class:`~.codegen.KernelWriter` writes transposes: the ``x`` level holds
the product's leading dims (batch, rows) flattened into ``xindex``, the ``r`` level its
columns in ``rindex``; the product's value (``alpha * acc + beta * bias``, rounded once to
the output dtype) stands in for every read of the product buffer, so it never goes through
memory unless something outside the kernel reads it.

:class:`TemplateLauncher` decides, on the first launch, between the template (its best
configuration) and the library: ATen's GEMM into a scratch buffer followed by the same
epilogue as a kernel of its own (``TemplateCall.unfused``), both timed on the real
arguments; the choice is kept in the autotune cache, keyed by the kernel's source."""
from __future__ import annotations

import logging
from typing import Any, Sequence

import sympy
import torch

from coil.sdk import Kernel, Load, loads

from . import autotune, indexing
from .codegen import KernelSource, KernelWriter, Scope, node_indices
from .configs import Config
from .indexing import IndexWriter, Level
from .optable import POINTER

log = logging.getLogger(__name__)

#: Template configurations built and timed per kernel (the template's best guesses first):
#: each is one more build on a cold cache, and a big tile's build takes seconds.
MEASURED_CONFIGS = 3

#: Milliseconds of device work before the first timed sample (clocks up from idle).
WARM_MS = 50.0

#: The configuration that stands for "the library's GEMM, then the epilogue kernel" in the
#: autotune cache (no template has a zero-row block).
LIBRARY = Config(0)


class TemplateWriter(KernelWriter):
    """Triton source of a kernel that starts with a template's product."""

    def __init__(self, kernel: Kernel, interpret: bool = False, bounds_check: bool = False) -> None:
        super().__init__(kernel, interpret, bounds_check)
        call = kernel.template
        assert call is not None
        self.call = call
        xs, ranges = kernel.x_vars, kernel.x_ranges
        self.shape, self.reduction = "template", True
        self.levels = {"x": Level("x", xs[:-1], ranges[:-1], "xindex"),
                       "r": Level("r", xs[-1:], ranges[-1:], "rindex")}
        self.ix = IndexWriter(list(self.levels.values()))
        self.xnumel, self.rnumel = sympy.Mul(*ranges[:-1]), ranges[-1]
        self.xnumel_text, self.rnumel_text = indexing.text(self.xnumel), indexing.text(self.rnumel)
        self.configs = [Config(c.block_m, c.block_n, c.num_warps, c.num_stages, kblock=c.block_k,
                               group_m=c.group_m)
                        for c in call.template.configs(call.problem)[:MEASURED_CONFIGS]]
        # masks only where some candidate's tiles overhang the product
        _, m, n, _ = call.problem.static_sizes()
        self.xmask = m == 0 or any(m % c.xblock for c in self.configs)
        self.rmask = n == 0 or any(n % c.rblock for c in self.configs)

    def generate(self) -> list[KernelSource]:
        return [self._template()]

    def _template(self) -> KernelSource:
        k, call, w = self.k, self.call, self.w
        problem = call.problem
        params = [f"p_{b}" for b in k.inputs + k.outputs] + [s.name for s in k.size_args]
        types = [POINTER[k.dtypes[b]] for b in k.inputs + k.outputs] + ["i64"] * len(k.size_args)  # type: ignore[index]
        constexprs = ["XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "KBLOCK: tl.constexpr",
                      "GROUP_M: tl.constexpr"]
        w.line("@jit")
        with w.block(f"def {k.name}({', '.join(params + constexprs)}):"):
            for line in call.template.render(problem, self._names(), None).splitlines():
                if line.strip():
                    w.line(line.rstrip())
            m, n = indexing.text(problem.m), indexing.text(problem.n)
            w.line(f"xindex = pid_b * {m} + offs_m[:, None]")
            w.line("rindex = offs_n[None, :]")
            if self.xmask:
                w.line(f"xmask = offs_m[:, None] < {m}")
            if self.rmask:
                w.line(f"rmask = rindex < {n}")
            self._define_runs()
            scope = Scope(mask=self.mask("r"))
            self._product(scope)
            self.emit(k.nodes, "r", scope)
        b, m_, n_ = (int(v) for v in problem.static_sizes()[:3])
        return KernelSource(k.name, w.text(), params, types, "template", self.xnumel, self.rnumel,
                            self.configs, False, k.inputs + k.outputs, xmask=self.xmask,
                            rmask=self.rmask, grid_dims=(b, m_, n_))

    def _load(self, v: Load, scope: Scope) -> str:
        """A load whose index walks only rows (or only columns) of the tile is masked by
        that level's mask alone, so it stays a row (column) vector: a bias read once per
        column, not once per element of the tile."""
        if v.indirect or scope.mask != self.mask("r"):
            return super()._load(v, scope)
        rows, cols = self.ix.mentions(v.index, "x"), self.ix.mentions(v.index, "r")
        if rows and cols:
            return super()._load(v, scope)
        mask = ("xmask" if self.xmask else None) if rows else ("rmask" if self.rmask else None) if cols else None
        inner = Scope(scope)
        inner.mask = mask  # None too (a Scope built with mask=None takes its parent's)
        return super()._load(v, inner)

    def _names(self) -> dict[str, str]:
        problem = self.call.problem
        names = {"a": f"p_{problem.a.name}", "b": f"p_{problem.b.name}",
                 "B": indexing.text(problem.batch), "M": indexing.text(problem.m),
                 "N": indexing.text(problem.n), "K": indexing.text(problem.k)}
        for key, op in (("a", problem.a), ("b", problem.b)):
            for i, s in enumerate(op.stride):
                names[f"{key}_stride{i}"] = indexing.text(s)
            names[f"{key}_offset"] = indexing.text(op.offset)
        return names

    def _define_runs(self) -> None:
        exprs = [self.call.store_index] + ([self._bias_index()] if self.call.bias is not None else [])
        for kn in self.k.nodes:
            exprs += node_indices(kn)
        runs = set()
        for e in exprs:
            runs |= self.ix.split(e)[1]
        for run in sorted(runs, key=lambda r: (r.prefix, r.lo, r.hi)):
            self.w.line(self.levels[run.prefix].definition(run))

    def _bias_index(self) -> sympy.Expr:
        bias = self.call.bias
        return bias.offset + sum((v * s for v, s in zip(self.k.x_vars, bias.stride)), sympy.Integer(0))

    def _product(self, scope: Scope) -> None:
        """The product's value in registers (and in memory if read outside the kernel)."""
        call = self.call
        value = "acc" if call.alpha == 1 else f"acc * {float(call.alpha)!r}"
        if call.bias is not None:
            bias = self.value(Load(call.bias.dtype, buffer=call.bias.name, index=self._bias_index()), scope)
            value = f"{value} + {bias}" if call.beta == 1 else f"{value} + {bias} * {float(call.beta)!r}"
        dtype = call.problem.out_dtype
        self._store(call.output, call.output, call.store_index, value, dtype, "r")


class TemplateLauncher:
    """Runs a template kernel: the template, or the library's GEMM and the epilogue kernel,
    whichever the first launch measured faster (``measure``); the template otherwise."""

    def __init__(self, kernel: Kernel, fused: Any, unfused: Any, *, measure: bool, interpret: bool,
                 tune_in_interpreter: bool, tune_key: Any, mutated: Sequence[int],
                 rebind: Any = None) -> None:
        call = kernel.template
        assert call is not None
        self.fused, self.unfused = fused, unfused
        self.measure = measure and (not interpret or tune_in_interpreter)
        self.interpret = interpret
        self.cache = autotune.TuneCache()
        self._key = tune_key
        self.mutated = tuple(mutated)
        self.tuned = 0
        self._run: Any = None
        #: Called with the chosen side once decided, so the wrapper's later launches call it
        #: directly (``setattr`` of the module's attribute), without this object in between.
        self._rebind = rebind
        names = kernel.args
        self._index = {name: i for i, name in enumerate(names)}
        self._unfused_args = list(call.unfused.args) if call.unfused is not None else []
        self._call = call
        layout = call.node.layout
        self._product = (tuple(int(s) for s in layout.size), tuple(int(s) for s in layout.stride),
                         layout.dtype)
        self._host = product_host(call, self._index)
        self.choice = ""

    def describe(self) -> str:
        """The choice, once made: "template (its configuration)" or "library"."""
        if self.choice == "template":
            winner = self.fused.winner()
            return f"template ({winner})" if winner is not None else "template"
        return self.choice

    def __call__(self, stream: Any, *args: Any) -> None:
        run = self._run
        if run is None:
            run = self._run = self._choose(stream, args)
            if self._rebind is not None:
                self._rebind(run)
        run(stream, *args)

    def _choose(self, stream: Any, args: Sequence[Any]) -> Any:
        if not self.measure:
            self.choice = "template"
            return self.fused
        key = self._key(None)
        cached = self.cache.get(key)
        library = self._library_bound(len(args))
        if cached is None:
            candidates = list(self.fused.candidates(()))
            if self.unfused is not None or self._call.unfused is None:  # the library side is whole
                candidates.append(LIBRARY)
            # each sample: calls queued behind a spin (cuda_bench), so they time the device
            # alone: the library side's host work (ATen's GEMM and the epilogue launch, from
            # Python) is longer than a raw launch, and charging its idle GPU time to it made
            # small templates win measurements they lose in a model
            bench = (autotune.wall_bench if self.interpret else
                     (lambda call: autotune.cuda_bench(call, reps=3, hold=True)))

            with autotune.trial_args(args, self.mutated) as trial:
                def run(cfg: Config) -> Any:
                    if cfg == LIBRARY:
                        return lambda: library(stream, *trial)
                    return lambda: self.fused.launch(cfg, stream, trial)
                cached, timings = autotune.select_interleaved(
                    candidates, run, bench, warm_ms=0.0 if self.interpret else WARM_MS)
            self.tuned += len(timings)
            log.debug("coil: template %s: %s", self.fused.src.name, timings)
            self.cache.put(key, cached, timings, self.fused.src.name)
        if cached == LIBRARY:
            self.choice = "library"
            return library
        self.choice = "template"
        self.fused.pin(cached)
        return self.fused

    def _library_bound(self, n_args: int) -> Any:
        """The library side for launches of ``n_args`` arguments: ATen's GEMM into the product
        buffer (or a scratch one), then the epilogue kernel, with every size, stride, offset
        and argument position worked out once (the wrapper calls it directly once the library
        is chosen: 30 calls in a training step of ViT-tiny)."""
        call = self._call
        problem = call.problem
        index = self._index

        def spec(op: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
            return (index[op.name], tuple(int(s) for s in op.size), tuple(int(s) for s in op.stride),
                    int(op.offset))
        (ai, asize, astride, aoff), (bi, bsize, bstride, boff) = spec(problem.a), spec(problem.b)
        size, stride, dtype = self._product
        out_at = index.get(call.output)
        bmm = problem.op == "bmm"
        bias = None
        if call.bias is not None:
            op = call.bias
            if not bmm and int(op.stride[0]) == 0:  # a linear layer's row vector stays 1-D: ATen adds it
                # in its own epilogue (seen 2-D, it is first copied into the output)
                bias = (index[op.name], (int(op.size[1]),), (int(op.stride[1]),), int(op.offset))
            else:
                bias = spec(op)
        gemm = (torch.baddbmm if bmm else torch.addmm) if bias is not None else (torch.bmm if bmm else torch.mm)
        beta, alpha = call.beta, call.alpha
        unfused = self.unfused
        # each argument of the epilogue: the product, an argument's position, or a literal (a 1-tuple)
        product_slot = object()
        slots = [product_slot if n == call.output else index[n] if n in index and index[n] < n_args else (n,)
                 for n in self._unfused_args]
        hosting = self._hosting

        def library(stream: Any, *args: Any) -> None:
            a, b = args[ai], args[bi]
            a = a.as_strided(asize, astride, a.storage_offset() + aoff)
            b = b.as_strided(bsize, bstride, b.storage_offset() + boff)
            out = args[out_at] if out_at is not None else hosting(args)
            product = out.as_strided(size, stride, out.storage_offset()) if out is not None else \
                torch.empty_strided(size, stride, dtype=dtype, device=a.device)
            if bias is not None:
                t = args[bias[0]]
                gemm(t.as_strided(bias[1], bias[2], t.storage_offset() + bias[3]), a, b,
                     beta=beta, alpha=alpha, out=product)
            else:
                gemm(a, b, out=product)
                if alpha != 1:
                    product.mul_(alpha)
            if unfused is not None:
                unfused(stream, *[product if m is product_slot else args[m] if isinstance(m, int) else m[0]
                                  for m in slots])
        return library

    def _hosting(self, args: Sequence[Any]) -> torch.Tensor | None:
        """The epilogue's output buffer, to hold the product it is computed from (the kernel
        then works in place), where that is safe for this call: the buffer has the product's
        sizes, strides and dtype and shares no memory with another argument. Otherwise None
        (a scratch buffer: ViT-tiny's GELU backward held one of 18.5 MiB beside its output at
        the training step's peak)."""
        if self._host is None:
            return None
        at = self._index[self._host]
        host = args[at]
        size, stride, dtype = self._product
        if tuple(host.shape) != size or tuple(host.stride()) != stride or host.dtype != dtype:
            return None
        where = host.untyped_storage().data_ptr()
        if any(isinstance(a, torch.Tensor) and i != at and a.untyped_storage().data_ptr() == where
               for i, a in enumerate(args)):
            return None
        return host


def product_host(call: Any, index: dict[str, int]) -> str | None:
    """The epilogue's output that may hold the product on the library side: the unfused
    epilogue kernel's only output, of the product's dtype, whose every node reads the product
    only at the point it stores (so each element is read before it is written, by the same
    program). A module imported from the graph cache carries the answer
    (``artifacts.TemplateSpec``), its IR gone."""
    if hasattr(call, "product_host"):
        return call.product_host
    unfused = call.unfused
    if unfused is None or call.output in index or len(unfused.outputs) != 1:
        return None
    host = unfused.outputs[0]
    if host not in index or unfused.dtypes.get(host) != call.node.layout.dtype:
        return None
    for kn in unfused.nodes:
        if any(ld.buffer == call.output and (ld.indirect or sympy.expand(ld.index - kn.store_index) != 0)
               for ld in loads(kn.body)):
            return None
    return host


__all__ = ["TemplateWriter", "TemplateLauncher", "LIBRARY"]
