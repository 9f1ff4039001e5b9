"""The Triton device backend: a graph's kernels become one module of ``@triton.jit``
functions, built in parallel, launched from the wrapper on the current CUDA stream.

``TritonBackend(interpret=True)`` runs the same kernels under Triton's interpreter on CPU
tensors; CI routes the ``cpu`` device to it with ``coil.register_backend_for_device``."""
from __future__ import annotations

import functools
import json
import logging
import pickle
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import torch

import coil.sdk as sdk
from coil.sdk.backend import BoxedGraph, KernelRef

from . import artifacts, autotune, build_budget, compile_pool, dedup, launch, loader, raw_launch
from .artifacts import EXPORT_FORMAT, KernelPlan, TemplateSpec
from .codegen import KernelSource, KernelWriter
from .graphs import GraphReplay
from .launch import Launcher
from .special import special_kernel
from .split import SplitLauncher
from .template import TemplateLauncher, TemplateWriter

log = logging.getLogger(__name__)


@dataclass
class CompiledModule:
    """What the wrapper calls: one launcher per kernel, as attributes."""

    source: str
    sources: dict[str, str]
    launchers: dict[str, Launcher] = field(default_factory=dict)
    #: How each kernel launches (what ``export_module`` saves).
    plans: list[KernelPlan] = field(default_factory=list)

    @staticmethod
    def enter(index: int) -> int:
        """Make device ``index`` current (kernels launch on the current device, the one
        their binaries were loaded on) and return its current raw stream for launches."""
        if torch.cuda.current_device() != index:
            torch.cuda.set_device(index)
        return torch._C._cuda_getCurrentRawStream(index)

    def add(self, kernel_name: str, launcher: Any) -> None:
        """Register a kernel's launcher, as a plain attribute too: the wrapper's
        ``mod.kN(...)`` is then an ordinary attribute lookup on every launch."""
        self.launchers[kernel_name] = launcher
        setattr(self, kernel_name, launcher)


class Chain:
    """Launches several Triton functions in order for one Coil kernel (a scatter's base copy,
    then its sources)."""

    def __init__(self, launchers: list[Launcher]) -> None:
        self.launchers = launchers

    def __call__(self, stream: Any, *args: Any) -> None:
        for launcher in self.launchers:
            launcher(stream, *args)


class TritonScheduling(sdk.Scheduling):
    max_fusion_size = 64


@dataclass(frozen=True)
class TritonOptions:
    #: Check every index read from memory against its dim on the device, as eager's CUDA
    #: kernels and Inductor do: ``tl.device_assert`` in the kernels that read one, built in
    #: Triton's debug mode (its integer-overflow asserts off). An index out of range stops with
    #: a device-side assert instead of reading or writing memory it does not index. Off: no
    #: check (a negative index wraps once, a larger one reads wherever it points).
    bounds_check: bool = True
    #: Which kernels a graph's first call tunes: "auto", its largest within a build budget
    #: (the others launch their shape's usual winner; :mod:`.build_budget`), or "all".
    tuning: Literal["auto", "all"] = "auto"


class TritonBackend(sdk.DeviceBackend[CompiledModule]):
    device_type = "cuda"
    name = "cuda_triton"
    scheduling = TritonScheduling()
    Options = TritonOptions

    def __init__(self, interpret: bool = False, bounds_check: bool | None = None,
                 tune_in_interpreter: bool = False) -> None:
        self.interpret = interpret
        #: Under the interpreter, tune like the GPU does (tests of the tuner and its cache).
        self.tune_in_interpreter = tune_in_interpreter
        #: Overrides the ``bounds_check`` option when set (tests use it).
        self._bounds_check = bounds_check
        self.capabilities = sdk.Capabilities(
            vector_width=32, reductions=frozenset(sdk.REDUCTION_TYPES),
            reduction_strategies=frozenset({"persistent", "looped"}), memory_transaction_bytes=128,
            graph_capture=not interpret, autotune=True, compiler="triton", gemm_alignment_bytes=16,
            # cuDNN runs NHWC convolutions without transposes; kernels iterate in memory order
            conv_channels_last=True, random=True,
            # eager's CUDA kernels cast a 0-d GPU tensor operand to a half result's type first
            # (the interpreter's CPU tensors are checked against eager's CPU kernels, which do not)
            zero_dim_operands_cast=not interpret,
            # one program owns a kept point's row and runs its loops in order, with a barrier
            # before a loop that stores over what earlier loops read; split reductions (two
            # launches) only ever store reductions, which never go in place
            inplace_reductions=True,
            # matrix-product templates whose epilogue the Triton code writer adds (.template)
            template_dialects=frozenset({"triton"}),
            compiler_version=_triton_version())
        #: Canonical function name -> the loaded function; (name, mutated args) -> its launcher.
        self._functions: dict[str, Any] = {}
        self._shared: dict[tuple[str, tuple[int, ...]], Launcher] = {}
        #: Every kernel generated so far (CI compiles each ahead of time for Hopper).
        self.generated: list[tuple[KernelSource, Any]] = []
        #: Launchers of template kernels (each measures template against library once).
        self._templates: list[TemplateLauncher] = []

    # -- codegen and build

    def generate(self, kernel: sdk.Kernel) -> list[KernelSource]:
        """The Triton functions of one kernel, launched in order (one, except for scatters)."""
        if kernel.special is not None:
            return special_kernel(kernel, self.interpret)
        if kernel.template is not None:
            sources = TemplateWriter(kernel, self.interpret, self.bounds_check).generate()
            unfused = kernel.template.unfused
            if kernel.template.measure and unfused is not None:  # the library's side
                sources += KernelWriter(unfused, self.interpret, self.bounds_check).generate()
            return sources
        return KernelWriter(kernel, self.interpret, self.bounds_check).generate()

    @property
    def tuning_count(self) -> int:
        """Configurations benchmarked in this process (the conformance kit's autotune tier
        checks that a second process with the same cache benchmarks none)."""
        return sum(la.tuned for la in self._shared.values()) + sum(t.tuned for t in self._templates)

    @property
    def bounds_check(self) -> bool:
        if self._bounds_check is not None:
            return self._bounds_check
        options = self.options
        return bool(options.bounds_check) if options is not None else TritonOptions.bounds_check

    def compile(self, kernels: Sequence[sdk.Kernel], graph_name: str) -> CompiledModule:
        """Generate, load and build ``kernels``. Kernels that differ only in names (a model's
        repeated layers) share one canonical function and launcher (:mod:`.dedup`), built and
        tuned once per process."""
        parts = [self.generate(k) for k in kernels]
        readable = {k.name: "\n".join(s.source for s in srcs) for k, srcs in zip(kernels, parts)}
        plans = [KernelPlan(k.name, tuple(dedup.canonical(s) for s in srcs), tuple(_mutated_args(k)),
                            len(k.inputs) + len(k.outputs), TemplateSpec.of(k) if k.template is not None else None,
                            tuple(_mutated_args(k.template.unfused))
                            if k.template is not None and k.template.unfused is not None else ())
                 for k, srcs in zip(kernels, parts)]
        compiled = self._assemble(plans, readable, graph_name, list(kernels))
        if self.interpret:
            self._record_gpu_twin(kernels, graph_name)
        return compiled

    def export_module(self, compiled: CompiledModule) -> bytes | None:
        """The kernels' canonical sources and launch plans, and the binaries their launchers
        hold (:class:`~.artifacts.Binary`): an import installs those into Triton's cache and
        builds the rest from source, which Triton's disk cache and Coil's autotune cache
        then hit."""
        return pickle.dumps({"format": EXPORT_FORMAT, "plans": compiled.plans, "sources": compiled.sources,
                             "interpret": self.interpret, "bounds_check": self.bounds_check,
                             "binaries": self.binaries(compiled.plans)})

    def binaries(self, plans: Sequence[KernelPlan]) -> list[artifacts.Binary]:
        """Every build the launchers of ``plans`` hold, as bytes."""
        out: dict[str, artifacts.Binary] = {}
        for plan in plans:
            for j, src in enumerate(plan.sources):
                launcher = self._shared.get((src.name, plan.mutated_of(j)))
                for built in (launcher.built() if launcher is not None else []):
                    binary = artifacts.Binary.of(built)
                    if binary is not None:
                        out.setdefault(binary.hash, binary)
        return list(out.values())

    def import_module(self, data: bytes, graph_name: str) -> CompiledModule | None:
        entry = pickle.loads(data)
        if entry.get("format") != EXPORT_FORMAT or (entry["interpret"], entry["bounds_check"]) != \
                (self.interpret, self.bounds_check):
            return None
        if entry["binaries"]:
            artifacts.install_all(entry["binaries"], graph_name, artifacts.current_target(),
                                  artifacts.triton_version())
        return self._assemble(entry["plans"], entry["sources"], graph_name)

    def target_key(self) -> str:
        """The GPU and its architecture (kernels are built for it)."""
        if self.interpret:
            return "triton interpreter"
        if not torch.cuda.is_available():
            return "no GPU"
        major, minor = torch.cuda.get_device_capability()
        return f"{torch.cuda.get_device_name()} sm_{major}{minor}"

    def _assemble(self, plans: list[KernelPlan], readable: dict[str, str], graph_name: str,
                  kernels: list[sdk.Kernel] | None = None) -> CompiledModule:
        """Load the functions of ``plans`` this process lacks and build the launchers (a
        template launcher reads ``kernels``, else the plan's stand-in for its kernel)."""
        new: dict[str, KernelSource] = {}
        for plan in plans:
            for src in plan.sources:
                if src.name not in self._functions:
                    new.setdefault(src.name, src)
        header = "# Coil Triton kernels of " + graph_name + "\n"
        text = header + "\n\n".join(s.source for s in new.values())
        if new:
            module = loader.load(text, self.interpret)
            for name, src in new.items():
                self._functions[name] = getattr(module, name)
                self.generated.append((src, self._functions[name]))
        compiled = CompiledModule(text, readable, plans=plans)
        device = self._device_name()
        fresh: list[Launcher] = []
        for i, plan in enumerate(plans):
            srcs = plan.sources
            launchers = []
            for j, src in enumerate(srcs):
                key = (src.name, plan.mutated_of(j))
                if key not in self._shared:
                    self._shared[key] = Launcher(
                        src, self._functions[src.name], interpret=self.interpret, mutated=key[1],
                        debug=self.bounds_check and "tl.device_assert" in src.source, tune_key=_key_fn(src.source, device, self.options_text()),
                        tune_in_interpreter=self.tune_in_interpreter)
                    fresh.append(self._shared[key])
                launchers.append(self._shared[key])
            if plan.template is not None:
                launcher = TemplateLauncher(
                    kernels[i] if kernels is not None else plan.template.kernel(),
                    launchers[0], launchers[1] if len(launchers) > 1 else None,
                    measure=plan.template.measure, interpret=self.interpret,
                    tune_in_interpreter=self.tune_in_interpreter, mutated=list(plan.mutated),
                    tune_key=_key_fn(srcs[0].source + "\n# template or library", device, self.options_text()),
                    rebind=functools.partial(setattr, compiled, plan.name))
                self._templates.append(launcher)
                compiled.add(plan.name, launcher)
            elif srcs[0].workspaces:
                compiled.add(plan.name, SplitLauncher(launchers[0], launchers[1], plan.n_buffers, srcs[0].workspaces))
            else:
                compiled.add(plan.name, launchers[0] if len(launchers) == 1 else Chain(launchers))
        self._precompile(fresh, loader.source_path(text), set(new))
        return compiled

    def _record_gpu_twin(self, kernels: Sequence[sdk.Kernel], graph_name: str) -> None:
        """Under the interpreter, write the same kernels as the GPU would get them (libdevice
        math, native bf16 rounding) with a manifest of their configurations, so CI can build
        every one for Hopper afterwards (``python -m coil_cuda_triton.aot``)."""
        gpu = TritonBackend(interpret=False, bounds_check=self.bounds_check)
        sources = [s for k in kernels for s in gpu.generate(k)]
        text = "# Coil Triton kernels of " + graph_name + " (GPU spelling)\n" + \
            "\n\n".join(s.source for s in sources)
        _record_manifest(loader.write(text), sources)

    def _precompile(self, launchers: list[Launcher], path: str, in_file: set[str]) -> None:
        """Start building what the first launches need: queued for the compile workers when
        there are any (the functions ``in_file``, which the module at ``path`` defines), and
        taken by each launcher at its first launch, so the builds overlap the first run
        (:mod:`.compile_pool`); without workers, built here and now."""
        if self.interpret or not launchers:
            return
        count = compile_pool.BuildCount(len(launchers))  # for the progress line of long compiles
        self._apply_budget(launchers)
        # what the build index already holds loads here, in a fraction of a millisecond each;
        # only the rest goes to the workers
        builds = {id(la): [cfg for cfg in la.to_build() if not la.load_indexed(cfg)] for la in launchers}
        major, minor = torch.cuda.get_device_capability()
        compile_pool.start(major * 10 + minor)  # in the background: for later compiles if not this one
        payloads, local, done, queued = [], [], [], []
        settings = compile_pool.triton_settings()
        for la in launchers:
            if la.src.name not in in_file:
                continue
            fields = {"name": la.src.name, "params": la.src.params, "types": la.src.types,
                      "shape": la.src.shape, "buffers": la.src.buffers}
            for cfg in builds[id(la)]:
                payloads.append([path, fields, cfg.__dict__, True, la.debug, major * 10 + minor, settings])
                local.append(functools.partial(la.build_queued, cfg))
                done.append(functools.partial(count.job_done, la))
                queued.append((la, cfg))
                count.add_job(la)
        jobs = compile_pool.submit(payloads, local, done) if len(payloads) > 1 else None
        if jobs is not None:
            for (la, cfg), job in zip(queued, jobs):
                la.queue(cfg, job)
        pooled = {id(owner) for owner, _ in queued} if jobs is not None else set()
        for la in launchers:
            if id(la) not in pooled:
                la.precompile()
                count.built(la)

    def _apply_budget(self, launchers: list[Launcher]) -> None:
        """Leave untuned the kernels the graph's build budget does not reach."""
        options = self.options
        mode = options.tuning if options is not None else "auto"
        tuned = {id(la) for la in build_budget.tuned(launchers, compile_pool.count() + 1, mode)}
        skipped = [la for la in launchers if len(la.to_build()) > 1 and id(la) not in tuned]
        for la in skipped:
            la.skip_tuning()
        if skipped:
            log.info("coil: %d of %d kernels launch their shape's usual configuration untuned "
                     "(build budget; tuning=all tunes every kernel)", len(skipped), len(launchers))

    def warm_up(self) -> None:
        """Start the compile workers now, while AOTAutograd traces the first graph, so the
        first graph's kernels build in parallel (they take seconds to import Triton)."""
        if self.interpret or not torch.cuda.is_available():
            return
        major, minor = torch.cuda.get_device_capability()
        compile_pool.start(major * 10 + minor)
        raw_launch.warm_up()

    def options_text(self) -> str:
        return f"bounds_check={self.bounds_check};{self.capabilities.cache_key()}"

    def _device_name(self) -> str:
        if self.interpret:
            return "triton-interpreter"
        return torch.cuda.get_device_name()

    # -- wrapper

    def prologue(self, module_var: str, device: torch.device) -> list[str]:
        if self.interpret:
            return [f"stream_{module_var} = None"]
        index = device.index if device.index is not None else 0
        return [f"stream_{module_var} = {module_var}.enter({index})"]

    def call_line(self, module_var: str, kernel: sdk.Kernel, args: Sequence[str]) -> str:
        return f"{module_var}.{kernel.name}(stream_{module_var}, {', '.join(args)})"

    def kernel_choice(self, compiled: CompiledModule, kernel: KernelRef) -> str:
        launcher = compiled.launchers.get(kernel.name)
        if isinstance(launcher, SplitLauncher):
            parts = [launcher.partial.describe(), launcher.combine.describe()]
        elif isinstance(launcher, Chain):
            parts = [la.describe() for la in launcher.launchers]
        else:
            parts = [launcher.describe()] if launcher is not None else []
        return "; ".join(p for p in parts if p)

    def kernel_source(self, compiled: CompiledModule, kernel: sdk.Kernel) -> str:
        return compiled.sources.get(kernel.name, "")

    def synchronize(self) -> None:
        if not self.interpret and torch.cuda.is_available():
            torch.cuda.synchronize()

    def capture(self, fn: BoxedGraph, example_inputs: Sequence[Any], *,
                static_inputs: frozenset[int] = frozenset(), measure: bool = False) -> BoxedGraph | None:
        if self.interpret:
            return None
        return GraphReplay(fn, static_inputs, measure)

    def doctor(self) -> list[sdk.Check]:
        checks = []
        version = _triton_version()
        checks.append(sdk.Check("triton", bool(version), version or "pip install triton==3.6.0"))
        if not self.interpret:
            # no GPU is a fact about the machine, not a broken plugin: the check is skipped
            # and says that cuda tensors cannot be made here
            if torch.cuda.is_available():
                checks.append(sdk.Check("CUDA device", True, torch.cuda.get_device_name()))
                checks.append(raw_launch.check())
            else:
                checks.append(sdk.Check.skip(
                    "CUDA device", "none visible to torch (cuda tensors cannot be used on this machine)"))
        return checks


def _record_manifest(path: str, sources: list[KernelSource]) -> None:
    """Note each kernel of a module file and its configurations next to it (``.json``)."""
    entry = {"source_path": path, "kernels": [
        {"name": s.name, "params": s.params, "types": s.types, "shape": s.shape,
         "buffers": s.buffers, "configs": [c.__dict__ for c in s.configs]} for s in sources]}
    with open(path[:-3] + ".json", "w") as f:
        json.dump(entry, f)


def _triton_version() -> str:
    try:
        import triton  # optional: `coil doctor` reports it missing
        return triton.__version__
    except ImportError:
        return ""


def _key_fn(source: str, device: str, options: str) -> Any:
    versions = f"torch={torch.__version__} triton={_triton_version()}"
    return lambda bucket: autotune.cache_key(source, device, versions, bucket, options)


def _mutated_args(k: sdk.Kernel) -> list[int]:
    """Argument positions of buffers the kernel writes and also reads, and of both buffers of
    each in-place pair (one memory): tuning runs on clones of them, never changing an input."""
    args = k.args[:len(k.inputs) + len(k.outputs)]
    written = set(k.outputs)
    read = set(k.inputs)
    for kn in k.nodes:
        read |= {ld.buffer for ld in sdk.loads(kn.body)}
    shared = set(k.inplace) | set(k.inplace.values())
    return [i for i, a in enumerate(args) if (a in written and a in read) or a in shared]
