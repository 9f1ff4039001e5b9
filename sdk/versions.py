"""The history of the ``coil.sdk`` API and the policy that decides which plugins it serves.

A plugin declares, through the ``coil_api_version`` hook, the API version it was written for
(``coil.sdk.API_VERSION`` when it was written, or the oldest version whose features it uses).
Versions are ``MAJOR.MINOR.PATCH`` and follow semantic versioning:

* same major, declared minor at most Coil's: compatible (minor releases only add);
* same major, declared minor newer than Coil's: refused. The plugin may rely on something
  this Coil lacks, and the failure would otherwise surface deep in a compile; upgrade Coil;
* an older major: refused when a release in between records a breaking change (the message
  lists them); served when none does. 1.0.0 records none (it pins 0.19's contract as the
  first stable one), so a plugin written for any 0.x keeps loading on 1.x;
* a newer major: refused, as a newer minor;
* the patch number is ignored (a patch release changes no API);
* a missing or malformed version: refused, saying what form is expected.

Every refusal names both versions and what changed between them (from :data:`HISTORY`). A
breaking change always comes with a new major version: from 1.0 on, anything in the surface
snapshot (``tests/golden/sdk_surface.json``) is removed or changed incompatibly only in 2.0."""
from __future__ import annotations

import re
from dataclasses import dataclass

_GUIDE = "docs/plugin-guide.md, section 'Versioning'"


@dataclass(frozen=True)
class Change:
    """One change of the API; ``breaking`` when a plugin written before it may stop working."""

    text: str
    breaking: bool = False


@dataclass(frozen=True)
class Release:
    version: str
    changes: tuple[Change, ...]


#: Every release of the API, oldest first. Add a release here whenever ``coil.sdk`` changes.
HISTORY: tuple[Release, ...] = (
    Release("0.1.0", (
        Change("first contract: hooks coil_api_version, coil_device_backends, coil_lowerings, "
               "coil_graph_passes; DeviceBackend (compile, call_line, kernel_source, "
               "synchronize, doctor), Capabilities, Scheduling, the kernel IR types"),
    )),
    Release("0.2.0", (
        Change("DeviceBackend.prologue(module_var, device): wrapper lines run once per call"),
        Change("DeviceBackend.capture(fn, example_inputs): whole-graph capture and replay"),
        Change("Capabilities: reduction_strategies, memory_transaction_bytes, graph_capture, "
               "autotune, templates, dynamic_shapes, backward, and cache_key()"),
        Change("DeviceBackend.Options, .options and .options_key(): namespaced plugin options "
               "(COIL_<NAME>_<FIELD>, torch.compile options={'<name>.<field>': value})"),
        Change("coil.sdk.reference: a reference kernel executor in torch ops (ReferenceBackend)"),
        Change("coil.sdk.testing: the conformance kit; `coil new-plugin`: plugin scaffolding"),
    )),
    Release("0.3.0", (
        Change("Check.skip(name, reason), Check.skipped and Check.status: a doctor check that "
               "cannot run on this machine is reported as skipped, neither ok nor failed"),
        Change("coil.sdk.DiskCache: a checked, size-capped on-disk cache (atomic writes, "
               "checksums validated before use, bad entries quarantined, LRU eviction) that "
               "`coil cache stats|clear` manages"),
    )),
    Release("0.4.0", (
        Change("Capabilities.gemm_alignment_bytes: the core pads large 16-bit matmuls whose "
               "inner or output width is not a multiple of it (0, the default: never)"),
        Change("Capabilities.conv_channels_last: the core lays out inference graphs' 2-D "
               "convolutions (and the kernels between them) channels-last (default False)"),
        Change("coil.sdk.canonical: Renamer, canonical_text and digest_name, for code writers "
               "that build each distinct kernel once (kernels differing only in names)"),
    )),
    Release("0.5.0", (
        Change("coil.sdk.progress.build_progress(): report(done, total) for DeviceBackend.compile "
               "to say how many of a graph's kernels are built (the progress line of long "
               "compiles); optional"),
    )),
    Release("0.6.0", (
        Change("ops rand(seed, counter) and randn(seed, counter) in the pointwise catalogue: "
               "counter-based Philox4x32-10 uniform and normal float32 numbers (coil.ops, "
               "coil.sdk.reference)"),
        Change("Capabilities.random: the core generates rand, randn, bernoulli and dropout in "
               "kernels only for backends that declare it (default False: ATen draws them)"),
    )),
    Release("0.7.0", (
        Change("Kernel.inplace (output -> input): the memory planner stores an output over a "
               "dying input that the kernel reads only at the written index; the launch passes "
               "the same memory for both, so generated code must not assume the pointers differ "
               "(no __restrict__). Pointwise kernels do it for every backend whose plugin declares "
               "0.7.0 or later; an older plugin never gets aliased pointers"),
        Change("Capabilities.inplace_reductions: a backend whose reduction schedule finishes a "
               "kept point's reads before a later loop's stores over them opts kernels with "
               "reduced dims in (default False)"),
    )),
    Release("0.8.0", (
        Change("DeviceBackend.warm_up(): called once per process when the first graph with a "
               "tensor on the device arrives, before AOTAutograd; start compile workers there"),
    )),
    Release("0.9.0", (
        Change("hook coil_templates() and coil.sdk.templates (Template, GemmProblem, Operand, "
               "TemplateConfig): matrix-product templates in a dialect ('triton', 'cpp') that "
               "backends embed with the fused epilogue"),
        Change("DeviceBackend.kernel_choice(compiled, kernel): what the backend chose at run "
               "time for a kernel (template or library), shown by coil.explain"),
        Change("Capabilities.template_dialects: the template dialects a backend embeds "
               "(default none); Kernel.template: the product a kernel starts with"),
    )),
    Release("0.10.0", (
        Change("DeviceBackend.export_module(compiled) -> bytes | None and "
               "import_module(data, graph_name): a compiled module saved in Coil's graph cache "
               "and portable artifacts, loaded without codegen (default None: not cached)"),
        Change("DeviceBackend.target_key(): the hardware and toolchain compiled code is for, in "
               "graph-cache keys and compared when artifacts are loaded (default '')"),
    )),
    Release("0.11.0", (
        Change("DeviceBackend.collective(op): the callable Coil calls for a functional "
               "collective of torch.distributed (all_reduce, all_gather_into_tensor, "
               "reduce_scatter_tensor...) or its wait_tensor on the device; the default is "
               "torch's op (a backend with its own collective library returns its own)"),
    )),
    Release("0.12.0", (
        Change("coil.sdk.cachestats: hit and miss counts per cache layer (graph, kernel, "
               "autotune) for coil.explain and `coil cache stats`; count() for a plugin whose "
               "cache is not a DiskCache"),
        Change("DiskCache(layer=...): the layer its lookups count under; lookup/read(remote=, "
               "count=) and write(remote=): skip the remote cache or the count (optional, "
               "keyword-only)"),
    )),
    Release("0.13.0", (
        Change("DeviceBackend.capture(fn, example_inputs, *, static_inputs, measure): the "
               "indices of inputs with fixed addresses (record in place, re-record when one "
               "moves) and whether to keep the recording only where its replay measures faster "
               "(the graph_capture knob's new default, auto); older plugins keep the two-argument "
               "call and are recorded only under mode='reduce-overhead'"),
    )),
    Release("0.14.0", (
        Change("the kernel IR is the SDK's own: coil.sdk.ir (values, nodes, layouts), "
               "coil.sdk.kernel (Kernel, KernelNode, Loop, TemplateCall), coil.sdk.ops (the op "
               "catalogue), coil.sdk.symbolic (index expressions) and coil.sdk.errors, with "
               "the names coil.sdk exported unchanged"),
        Change("closed sets typed: ReductionType, ScanCombine and ExternKind (coil.sdk.ir), "
               "Level (coil.sdk.kernel) as Literal types"),
    )),
    Release("0.15.0", (
        Change("the SDK imports nothing of the core: the knobs are the SDK's own, "
               "coil.sdk.config (what coil.config was; coil.config re-exports it) over "
               "coil.sdk.knobs (the knobs and the configuration in force, beneath the "
               "registry), and so is the plugin registry, coil.sdk.registry (what "
               "coil.plugins was: registry(), reset(), Registry, PluginInfo)"),
        Change("coil.sdk.host: the compiler's operations the conformance kit and "
               "`coil cache export|import` call (Host: compile_fx, recording, export_cache, "
               "load_artifacts; the report protocols CompileReport, GraphInfo, KernelInfo, "
               "FallbackInfo), registered by the compiler when coil is imported"),
        Change("coil.sdk.diskcache.cache_dir (what coil.sdk.cache_dir is); coil.sdk.ops.SEED_LOW "
               "and SEED_HIGH, the bounds of the seed a graph's rand/randn ops draw"),
    )),
    Release("0.16.0", (
        Change("Config.training_channels_last: Capabilities.conv_channels_last applies to "
               "training graphs too (saved activations channels-last, their strides reported "
               "to AOTAutograd); off by default"),
    )),
    Release("0.17.0", (
        Change("coil.sdk.codegen: the pieces every code writer needs, which the shipped plugins, "
               "the example plugin and the reference executor share: ValueScope (values already "
               "emitted in a block, common-subexpression elimination), ValueVisitor (dispatch on "
               "the value node types), IndexPrinter and IndexSpelling (index expressions with a "
               "target's floor division, modulo, min/max and wide-integer spellings), "
               "INTEGER_IDENTITY_OPS, is_integer_identity, reduction_identity, lowest, highest"),
    )),
    Release("0.18.0", (
        Change("Config.profile_kernels: each generated kernel's launch inside a torch.profiler "
               "range named coil:<kernel>"),
    )),
    Release("0.19.0", (
        Change("typed DeviceBackend and Scheduling: DeviceBackend is generic in its compiled "
               "module (DeviceBackend[ModuleT]: compile returns it, kernel_source, kernel_choice, "
               "export_module get it, import_module returns it); compile takes Sequence[Kernel], "
               "call_line a Kernel, kernel_choice a KernelRef (only a name on a graph-cache hit), "
               "capture a BoxedGraph, collective a torch OpOverload; Scheduling.can_fuse gets "
               "(tuple[Expr, ...], tuple[Expr, ...], Sequence[ir.Node]). Annotations only: "
               "unparameterized subclasses keep working"),
        Change("DeviceBackend.tuning_count (None: the backend does not count), declared for the "
               "conformance kit's autotune_cache tier, which now asks for a non-None value"),
        Change("closed sets typed: ScatterAccumulate (ScatterNode.accumulate), "
               "TemplateNode.op as GemmOp, Capabilities.reductions as ReductionType and "
               "reduction_strategies as ReductionStrategy; TemplateCall's template, problem, "
               "bias and node and Kernel.dtypes (torch.dtype) typed"),
        Change("Kernel, KernelNode, Loop and TemplateCall are frozen dataclasses: the core "
               "renames kernels and sets Kernel.inplace on copies (dataclasses.replace); a "
               "plugin never had to change one, and now cannot"),
    )),
    Release("1.0.0", (
        Change("the first stable contract: 0.19's, pinned. Every name of coil.sdk's surface "
               "(coil.sdk.__all__ and the public names of its modules), every public signature "
               "and every dataclass field, as tests/golden/sdk_surface.json records them, "
               "changes incompatibly only with 2.0; the kernel IR (coil.sdk.ir, coil.sdk.kernel, "
               "coil.sdk.ops, coil.sdk.symbolic) is the SDK's own, typed and frozen. Nothing "
               "breaks: a plugin written for any 0.x loads unchanged (older majors are served "
               "when no release in between records a breaking change)"),
        Change("honest types where 0.19 had Any: Const.value and Masked.other are "
               "bool | int | float (the Python scalar of the node's dtype), ExternNode.op is "
               "Callable[..., Any] (an ATen OpOverload as a rule); Kernel.first_node returns a "
               "node or raises ValueError for a kernel without one (never None)"),
    )),
    Release("1.1.0", (
        Change("DeviceBackend.prefers_channels_last(convolutions, *, training): the backend "
               "decides per graph, from its 2-D convolutions (coil.sdk.backend.ConvolutionInfo: "
               "shapes, stride, padding, dilation, groups, dtype; depthwise, kernel_size, macs), "
               "whether the core lays the graph out channels-last; the default answers "
               "Capabilities.conv_channels_last as before"),
    )),
    Release("1.2.0", (
        Change("coil.sdk.ir.rewrite(value, index=, load=, op=): ops passed through op after their "
               "arguments; coil.sdk.symbolic.upper_bound(expr, ranges): the largest value of a sum "
               "of non-negative terms, FloorDiv and ModIdx of such sums included"),
    )),
    Release("1.3.0", (
        Change("DeviceBackend.Options fields typed Literal[...] are a closed set of words: a value "
               "outside it raises ConfigValueError naming the words (case ignored)"),
        Change("DeviceBackend.kernel_choice is asked of every kernel for coil.explain (a launch "
               "configuration, tuned or not), not only of template kernels"),
    )),
    Release("1.4.0", (
        Change("Capabilities.depthwise_conv: the core generates 2-D depthwise convolutions (up "
               "to 25 window taps) as kernels for the device, fused with the ops around them, "
               "instead of calling the library (default False)"),
    )),
    Release("1.5.0", (
        Change("the freezing knob: DeviceBackend.frozen_convolution(info, weight, bias) and "
               "DeviceBackend.frozen_linear(rows, weight, bias) may replace a 2-D convolution or "
               "a linear layer's matrix product of a frozen inference graph by the backend's own "
               "callable (a pre-packed weight); ConvolutionInfo.frozen tells "
               "prefers_channels_last which convolutions' weights are frozen (default False)"),
    )),
    Release("1.6.0", (
        Change("DeviceBackend.convolution_as_matmul(info): the core computes a 1x1 convolution "
               "of an inference or training forward graph over a channels-last input as aten.mm of the pixels by "
               "the transposed weight where the backend says yes (default False); "
               "ConvolutionInfo.pointwise"),
    )),
    Release("1.7.0", (
        Change("DeviceBackend.convolution_as_matmul(info) is asked about a training backward "
               "graph's convolution_backward of a 1x1 convolution too (its output gradient and "
               "input channels-last; info describes the forward convolution): a yes computes "
               "the input's and the weight's gradients as aten.mm over the pixels and the "
               "bias's as a column sum; plugins declaring an earlier version are asked about "
               "inference and forward graphs only"),
        Change("Capabilities.depthwise_conv covers the backward of a depthwise convolution "
               "(one channel per group, no dilation) too: its convolution_backward is generated "
               "as kernels (a gather for the input's gradient, a reduction for the weight's) "
               "for plugins declaring 1.7.0 or later"),
    )),
    Release("1.8.0", (
        Change("Capabilities.gemm_bias_epilogue (default True): False makes the core compute "
               "a float32 or float64 addmm with a 1-D bias as aten.mm plus a pointwise add of "
               "the bias, which fuses into the kernel that reads the product"),
    )),
    Release("1.9.0", (
        Change("Capabilities.float32_scans_in_float64 (default False): True makes the core "
               "carry a float32 cumsum's or cumprod's running value in float64, as eager's "
               "CPU kernels do"),
        Change("Indirect.wrap (default True): False where a negative index is out of range, as "
               "eager has it for gather, scatter, index_select and embedding; an index outside "
               "[0, size) after wrapping is an error a backend must not read or write through, "
               "and should report (the C++ plugin raises IndexError after the kernel)"),
    )),
    Release("1.10.0", (
        Change("Capabilities.float32_variance_in_float64 (default False): True makes the core "
               "keep the Welford state of a float32 var, std or var_mean called as such (not "
               "of a norm's statistics) in float64, as eager's CPU kernels do"),
    )),
    Release("1.11.0", (
        Change("Capabilities.half_add_scalars_rounded (default False): True makes the core "
               "round a Python number added to or subtracted from a float16 or bfloat16 tensor, "
               "and alpha, to the half type first, as eager's CPU kernels do"),
    )),
    Release("1.12.0", (
        Change("Host programs (coil.sdk.programs): a backend declaring "
               "Capabilities.host_programs (default False) is passed runs of at least two "
               "consecutive launches with static sizes as compile(kernels, graph_name, "
               "programs=...) and writes each run's wrapper line in "
               "DeviceBackend.host_call_line(module_var, compiled, program) (default None: "
               "the launches one by one), so the wrapper crosses into the module once per run "
               "and the run's short-lived buffers are the host function's scratch memory"),
    )),
    Release("1.13.0", (
        Change("GraphInfo.programs: the host programs a graph's wrapper calls; the conformance "
               "kit's host_programs tier (run for backends declaring Capabilities.host_programs)"),
    )),
    Release("1.14.0", (
        Change("Capabilities.zero_dim_operands_cast (default False): a backend whose eager "
               "counterpart casts a 0-d tensor operand to a float16 or bfloat16 result's type "
               "before computing (CUDA's kernels) declares True, and the core casts such operands "
               "of arithmetic ops first (the Triton plugin)"),
    )),
    Release("1.15.0", (
        Change("Capabilities.half_conv_bias_in_kernel (default False): a backend whose eager "
               "convolution adds a float16 or bfloat16 bias inside its kernel, rounding once "
               "(ATen's CPU path), declares True, and the core leaves such a convolution's bias in "
               "the call instead of adding it as a pointwise op (the C++ plugin)"),
    )),
    Release("1.16.0", (
        Change("errors.OutputMismatchError: raised by a compiled graph whose first call returned "
               "an output of another dtype, rank or static size than Dynamo traced (AOTAutograd "
               "put a wrong tensor in its place), and by every later call of that graph"),
    )),
)

#: The API version this Coil provides.
API_VERSION = HISTORY[-1].version

_FORM = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


def parse(version: object) -> tuple[int, int, int]:
    """``"1.2.3"`` (or ``"1.2"``) as a tuple; ``ValueError`` saying what is wrong otherwise."""
    match = _FORM.match(version.strip()) if isinstance(version, str) else None
    if match is None:
        raise ValueError(f"{version!r} is not a version of the form MAJOR.MINOR.PATCH (like "
                         f"{API_VERSION!r})")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def changes_between(old: str, new: str,
                    history: tuple[Release, ...] | None = None) -> list[tuple[str, Change]]:
    """Changes of the releases after ``old`` up to and including ``new``, oldest first."""
    lo, hi = parse(old), parse(new)
    return [(r.version, c) for r in (HISTORY if history is None else history)
            if lo < parse(r.version) <= hi for c in r.changes]


def _listing(changes: list[tuple[str, Change]]) -> str:
    return "; ".join(f"[{v}{', breaking' if c.breaking else ''}] {c.text}" for v, c in changes)


def compatibility(declared: str, provided: str | None = None,
                  history: tuple[Release, ...] | None = None) -> tuple[bool, str]:
    """Whether a plugin written for API ``declared`` may run on Coil's ``provided`` API
    (default: :data:`API_VERSION`), and a message naming both versions and what changed
    between them (empty when they match)."""
    provided = API_VERSION if provided is None else provided
    if not declared:
        return False, (f"declares no coil.sdk API version; implement the coil_api_version "
                       f"hook (Coil provides {provided})")
    try:
        want = parse(declared)
    except ValueError as exc:
        return False, (f"declares coil.sdk API version {exc}; return the value of "
                       f"coil.sdk.API_VERSION it was written for from coil_api_version")
    have = parse(provided)
    both = f"written for coil.sdk API {declared}, Coil provides {provided}"
    if want[:2] == have[:2]:
        return True, ""
    if want[0] == have[0] and want[1] < have[1]:
        added = _listing(changes_between(declared, provided, history))
        return True, f"{both}, which only adds to it: {added}"
    if want > have:
        return False, (f"{both}: the plugin is newer and may rely on what this Coil lacks. "
                       f"Upgrade Coil (pip install -U coil); if the plugin uses nothing newer "
                       f"than {provided}, let it declare {provided} ({_GUIDE})")
    changes = changes_between(declared, provided, history)
    breaking = [(v, c) for v, c in changes if c.breaking]
    if not breaking:  # an older major that nothing since has broken (0.x on 1.x)
        return True, (f"{both}; the major versions differ, but no release since breaks "
                      f"anything: {_listing(changes)}")
    return False, (f"{both}; the major versions differ, so the contract changed. Breaking "
                   f"changes since {declared}: {_listing(breaking) or '(none recorded)'}. "
                   f"Update the plugin for them and declare {provided} ({_GUIDE})")


__all__ = ["API_VERSION", "HISTORY", "Change", "Release", "compatibility", "changes_between", "parse"]
