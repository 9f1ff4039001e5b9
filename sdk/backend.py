"""Base classes a device plugin implements: ``Capabilities`` (a declarative descriptor),
``Scheduling`` (fusion legality and limits) and ``DeviceBackend`` (codegen, compile, load,
launch).

``DeviceBackend`` is generic in the type of what its ``compile`` returns (``ModuleT``): a
plugin writes ``class MyBackend(sdk.DeviceBackend[MyModule])`` and every method that gets the
compiled module back is typed with it. The core never looks inside that object; it binds it
in the wrapper as ``mod_<device_type>`` and hands it back to the backend."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Literal, Protocol, Sequence, TypeVar

import torch

from . import knobs

if TYPE_CHECKING:  # annotations only: the IR modules import sympy, which a backend need not load
    from .ir import Expr, Node, ReductionType
    from .kernel import Kernel
    from .programs import HostProgram

#: How a backend schedules reductions (``Capabilities.reduction_strategies``): the row in
#: registers, blocks of the row in a loop, or the row split across programs.
ReductionStrategy = Literal["persistent", "looped", "split"]
#: What a backend's ``compile`` returns and every later call gets back (its compiled module).
ModuleT = TypeVar("ModuleT")
#: A compiled graph's callable in the boxed convention: it takes the list of graph inputs
#: (tensors, ints, SymInts) and returns the graph's outputs.
BoxedGraph = Callable[[list[Any]], Any]


class KernelRef(Protocol):
    """A kernel by its name: what :meth:`DeviceBackend.kernel_choice` gets on a graph-cache
    hit, where no :class:`~coil.sdk.kernel.Kernel` exists (a ``Kernel`` is one too)."""

    @property
    def name(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a device can do; the core reads it for heuristics and cache keys, and the
    conformance kit skips tiers the device lacks."""

    dtypes: frozenset[torch.dtype] = frozenset({
        torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16,
        torch.int32, torch.int64, torch.uint8, torch.bool})
    #: Elements one vector instruction (or one warp) handles.
    vector_width: int = 1
    reductions: frozenset[ReductionType] = frozenset(
        {"sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford"})
    scans: bool = True
    scatter: bool = True
    #: How the backend schedules reductions ("persistent": the row in registers, "looped":
    #: blocks of the row in a loop, "split": across programs); informational for reports.
    reduction_strategies: frozenset[ReductionStrategy] = frozenset({"looped"})
    #: Bytes a memory transaction moves (a cache line, or a coalesced warp access).
    memory_transaction_bytes: int = 64
    #: Whether ``DeviceBackend.capture`` records whole graphs for replay (CUDA graphs, say).
    graph_capture: bool = False
    #: Whether the backend tunes kernels at run time (the conformance kit tests its cache).
    autotune: bool = False
    #: ATen ops (``"mm"``, ``"addmm"``, ``"bmm"``) the backend generates from templates.
    templates: frozenset[str] = frozenset()
    #: Whether kernels take symbolic sizes (one compile serves every size).
    dynamic_shapes: bool = True
    #: Whether backward graphs (training) compile for this device.
    backward: bool = True
    #: Bytes the device's GEMM library wants every matrix row aligned to for its fast kernels
    #: (tensor cores: 16); the core pads large 16-bit matmuls up to it. 0: never pad.
    gemm_alignment_bytes: int = 0
    #: Whether the device's convolution library runs 2-D convolutions fastest channels-last
    #: (cuDNN on tensor cores); the core then lays inference graphs' conv nets out so. It is
    #: the answer of the default :meth:`DeviceBackend.prefers_channels_last`: a backend whose
    #: library wins on some convolutions and loses on others overrides that method instead
    #: (SDK 1.1.0). Lowerings read it too: channels-last pooling windows are generated only
    #: for a backend that declares it (elsewhere they stay ATen calls).
    conv_channels_last: bool = False
    #: Whether the core generates 2-D depthwise convolutions (``groups`` equal to the input's
    #: channels, at most 25 window taps) as kernels for the device, the ops around them fused
    #: in, instead of calling the library (SDK 1.4.0): for a device whose library pays more
    #: per call than such a window costs; for a plugin declaring SDK 1.7.0 or later, their
    #: backward too (one channel per group, no dilation). Default False.
    depthwise_conv: bool = False
    #: Whether the op table spells the catalogue's counter-based ``rand`` and ``randn``
    #: (Philox4x32-10, :mod:`coil.sdk.ops`); only then does the core generate random ops (rand,
    #: randn, bernoulli, dropout, uniform_, normal_) in kernels for the device, else ATen runs them.
    random: bool = False
    #: Whether a kernel with reduced dims may store an output over the memory of an input that
    #: dies in it (a softmax over its logits). The core only asks where every read of the input
    #: is at the index the output is written, by the writing node or one before it
    #: (``Kernel.inplace``, :mod:`coil.inplace`); declaring it promises that the backend's
    #: schedule finishes, for each kept point, every read of that input in the kernel's earlier
    #: loops before any store of a later loop over it (one program or thread per kept point
    #: running its loops in order, or a barrier between them; not split across launches that
    #: store first). Pointwise kernels write in place on every backend. Default False.
    inplace_reductions: bool = False
    #: Whether the device's GEMM library adds a linear layer's 1-D bias in its epilogue, at
    #: no pass of its own (cuBLASLt). False: the core computes a float32 or float64
    #: ``addmm(bias, a, b)`` as ``mm(a, b)`` plus the bias as a pointwise add, which fuses
    #: into the kernel that reads the product (a GELU, a residual, a norm); ATen's CPU
    #: ``addmm`` copies the bias over its output before the product, a pass of its own (SDK
    #: 1.8.0). Default True.
    gemm_bias_epilogue: bool = True
    #: Whether a float32 cumulative sum or product (``cumsum``, ``cumprod``) carries its running
    #: value in float64, as eager's CPU kernels do (their accumulator is a double: a float32
    #: running sum of ones stops at 2**24, and over rows of 3000 drifts 27x further from the
    #: exact sums than eager's). False: in float32, as eager's CUDA kernels (SDK 1.9.0).
    #: Default False.
    float32_scans_in_float64: bool = False
    #: Whether a float32 ``var``, ``std`` or ``var_mean`` called as such keeps its Welford state
    #: in float64, as eager's CPU kernels do (in float32 the running mean rounds by a step of
    #: the mean's size: data of mean 1e4 and spread 1e-2 gave variances 2-4% off, eager's
    #: 3e-8). The statistics of layer, batch and group norms stay float32, as in eager's CPU
    #: norm kernels. False: float32 throughout, as eager's CUDA kernels (SDK 1.10.0).
    float32_variance_in_float64: bool = False
    #: Whether a Python number (or a 0-d tensor of a wider float type) added to or subtracted
    #: from a float16 or bfloat16 tensor, and ``alpha``, are first rounded to the half type, as
    #: eager's CPU kernels do (``x_fp16 + 1000.7`` adds 1000.5). False: used in float32, as
    #: eager's CUDA kernels (SDK 1.11.0). ``remainder``, ``fmod``, ``pow`` and ``atan2`` round
    #: such a number on every device, ``mul`` and ``div`` on none. Default False.
    half_add_scalars_rounded: bool = False
    #: Whether eager's kernels on this device cast a 0-d tensor operand on the device to a
    #: float16 or bfloat16 result's type before computing, as eager's CUDA kernels do
    #: (``h_fp16 + z`` with a 0-d float32 ``z`` on the GPU adds ``z`` rounded to float16): the
    #: core then casts such operands of arithmetic ops first (:mod:`coil.zero_dim_operands`).
    #: False: such an operand is read as a Python number is, as eager's CPU kernels read a 0-d
    #: CPU tensor (SDK 1.14.0). Default False.
    zero_dim_operands_cast: bool = False
    #: Whether eager's convolution on this device adds a float16 or bfloat16 bias inside its
    #: kernel, rounding once (ATen's CPU path through oneDNN): the core then leaves such a
    #: convolution's bias in the call. False: the core adds it as a pointwise op that fuses
    #: with the convolution's consumer, rounding the convolution's result first, as ATen's CUDA
    #: path adds it after cuDNN's kernel (:mod:`coil.conv_bias`; SDK 1.15.0). Default False.
    half_conv_bias_in_kernel: bool = False
    #: Template dialects (``"triton"``, ``"cpp"``) the backend embeds in kernels, writing the
    #: fused epilogue after the template's code (:mod:`coil.sdk.templates`); the core offers
    #: matrix products to the templates of those dialects (SDK 0.9.0). Default: none.
    template_dialects: frozenset[str] = frozenset()
    #: Whether the backend compiles runs of consecutive launches into host functions of its
    #: module (:mod:`coil.sdk.programs`): the core then passes such runs to ``compile`` as
    #: ``programs=`` and asks :meth:`DeviceBackend.host_call_line` for each run's wrapper line
    #: (SDK 1.12.0). Default False.
    host_programs: bool = False
    compiler: str = ""
    compiler_version: str = ""

    def cache_key(self) -> str:
        """Everything above in one stable string, for on-disk cache keys."""
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            parts.append(f"{f.name}={sorted(map(str, v)) if isinstance(v, frozenset) else v}")
        return ";".join(parts)


@dataclasses.dataclass(frozen=True)
class ConvolutionInfo:
    """One 2-D convolution of a graph (``aten.convolution`` with 4-D operands and static
    sizes), as :meth:`DeviceBackend.prefers_channels_last` is told about it (SDK 1.1.0)."""

    #: (batch, channels in, height, width).
    input: tuple[int, int, int, int]
    #: (channels out, channels in / groups, kernel height, kernel width); for a transposed
    #: convolution ATen's (channels in, channels out / groups, kernel height, kernel width).
    weight: tuple[int, int, int, int]
    #: (batch, channels out, height, width).
    output: tuple[int, int, int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    transposed: bool
    dtype: torch.dtype
    #: Whether the weight and bias are frozen parameters (the ``freezing`` knob: an inference
    #: graph that treats parameters as constants), which the backend may pre-pack
    #: (:meth:`DeviceBackend.frozen_convolution`; SDK 1.5.0).
    frozen: bool = False

    @property
    def kernel_size(self) -> tuple[int, int]:
        """(kernel height, kernel width)."""
        return self.weight[2], self.weight[3]

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution that is a linear layer over each pixel's channels: unstrided,
        unpadded, one group, not transposed (SDK 1.6.0)."""
        return (not self.transposed and self.groups == 1 and self.kernel_size == (1, 1)
                and self.stride == (1, 1) and self.padding == (0, 0))

    @property
    def depthwise(self) -> bool:
        """One input channel per group, more than one group (MobileNet's, ConvNeXt's)."""
        return not self.transposed and self.groups > 1 and self.groups == self.input[1]

    @property
    def macs(self) -> int:
        """Multiply-accumulates: output elements times the taps each one sums."""
        n, c_out, h, w = self.output
        taps = self.weight[1] * self.weight[2] * self.weight[3]
        if self.transposed:  # ATen's weight is (in, out / groups, kh, kw): each input point
            n, c_in, h, w = self.input  # scatters to out / groups channels over the kernel
            return n * c_in * h * w * taps
        return n * c_out * h * w * taps


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of ``coil doctor``: what was checked, whether it is fine, and the detail (a
    version, or what to install). A check that cannot run on this machine (no device
    present, say) is neither fine nor failed: build it with :meth:`skip`, giving the reason."""

    name: str
    ok: bool
    detail: str = ""
    #: The check could not run here; ``detail`` says why. Not a failure (``ok`` stays True),
    #: and ``coil doctor`` shows it as "skipped", never as "ok".
    skipped: bool = False

    @classmethod
    def skip(cls, name: str, reason: str) -> Check:
        """A check that could not run here, and why (``Check.skip("CUDA device", "none visible")``)."""
        return cls(name, True, reason, skipped=True)

    @property
    def status(self) -> Literal["ok", "FAIL", "skipped"]:
        """``"ok"``, ``"FAIL"`` or ``"skipped"``, as ``coil doctor`` prints it."""
        return "skipped" if self.skipped else "ok" if self.ok else "FAIL"


class Scheduling:
    """Fusion decisions a device makes. The core proposes a fusion only when iteration spaces
    and data dependencies allow it; ``can_fuse`` may refuse more."""

    #: Most IR nodes one kernel may hold.
    max_fusion_size: int = 64

    def can_fuse(self, x_ranges: tuple[Expr, ...], r_ranges: tuple[Expr, ...],
                 nodes: Sequence[Node]) -> bool:
        """Whether ``nodes`` (IR nodes, in graph order) may become one kernel over the kept
        dims ``x_ranges`` and the reduced dims ``r_ranges`` (empty for pointwise work). Asked
        only after the core found the fusion legal; the default agrees."""
        return True


class DeviceBackend(Generic[ModuleT]):
    """A device's code generator and runtime. Subclass and implement the methods below.

    * ``compile(kernels, graph_name)`` turns a graph's kernels into something loadable and
      returns an object (of the backend's own type ``ModuleT``) handed back to ``call_line``;
      compile all of a graph's kernels at once (one translation unit, or in parallel). It may
      report how many are built through :mod:`coil.sdk.progress` (shown in the progress line
      of long compiles).
    * ``call_line(module_var, kernel, args)`` is the wrapper's Python line that launches one
      kernel with ``args`` (names of tensors and size ints, in ``kernel.args`` order).
    """

    #: ``torch.device(...).type`` this backend serves.
    device_type: str = ""
    #: A name for reports and ``coil doctor``; also the namespace of the backend's options.
    name: str = ""
    #: What the device can do: the core's graph passes and lowerings, cache keys and the
    #: conformance kit read it.
    capabilities: Capabilities = Capabilities()
    #: What may fuse on the device: the scheduler asks it about every fusion it proposes.
    scheduling: Scheduling = Scheduling()
    #: The backend's knobs: a (frozen) dataclass whose fields have defaults and doc comments.
    #: ``COIL_<NAME>_<FIELD>``, ``torch.compile(..., options={"<name>.<field>": v})`` and
    #: ``coil.config.override(**{"<name>.<field>": v})`` set them; read them as ``self.options``.
    Options: ClassVar[type | None] = None
    #: Tuning searches (or configurations benchmarked: any count that grows exactly when the
    #: tuning cache misses) run in this process. A backend declaring ``Capabilities.autotune``
    #: keeps it up to date (an attribute or a property); the conformance kit's
    #: ``autotune_cache`` tier reads it. None: the backend does not count.
    tuning_count: int | None = None

    @property
    def options(self) -> Any:
        """The ``Options`` instance in force for the compile in progress (None without
        ``Options``). Read it while compiling; an instance may change between compiles.
        Typed ``Any``: its class is the subclass's own ``Options`` dataclass."""
        return knobs.backend_options(self)

    def options_key(self) -> str:
        """``self.options`` as a stable string, for on-disk cache keys."""
        return knobs.options_key(self.options)

    def compile(self, kernels: Sequence[Kernel], graph_name: str) -> ModuleT:
        """Generate, build and load all the kernels of graph ``graph_name`` on this device.
        The result is bound in the wrapper as ``mod_<device_type>`` and handed back to the
        other methods; when it has a ``source`` attribute (text), ``COIL_DEBUG_DIR`` dumps it.

        A backend declaring ``Capabilities.host_programs`` is called as ``compile(kernels,
        graph_name, programs=...)`` when the graph has runs of launches to offer: a sequence
        of :class:`~coil.sdk.programs.HostProgram` over those kernels, which it may build
        into the module (SDK 1.12.0)."""
        raise NotImplementedError

    def host_call_line(self, module_var: str, compiled: ModuleT, program: HostProgram) -> str | None:
        """The wrapper's Python line running ``program`` (passed to :meth:`compile`) from the
        module bound as ``module_var``: it passes the tensors named by ``program.params``, in
        that order. None where the module has no such program (the core then writes its
        launches one by one with :meth:`call_line`). Asked of backends declaring
        ``Capabilities.host_programs`` only (SDK 1.12.0)."""
        return None

    def call_line(self, module_var: str, kernel: Kernel, args: Sequence[str]) -> str:
        """The wrapper's Python line launching ``kernel`` from the module bound as
        ``module_var``, with ``args`` (names of tensors, then size ints) in ``kernel.args``
        order."""
        raise NotImplementedError

    def kernel_source(self, compiled: ModuleT, kernel: Kernel) -> str:
        """Generated source of one kernel (for reports and ``COIL_DEBUG_DIR``)."""
        return ""

    def export_module(self, compiled: ModuleT) -> bytes | None:
        """``compiled`` (what :meth:`compile` returned) as bytes that :meth:`import_module`
        turns back into an equivalent object, in another process or on another machine
        whose :meth:`target_key` is the same; None when it cannot be exported (then the
        graph is not kept in Coil's graph cache). Keep what a second process needs to skip
        codegen and, where it can, the build: a shared library's bytes, or kernel source a
        build cache hits on. The default: None (SDK 0.10.0)."""
        return None

    def import_module(self, data: bytes, graph_name: str) -> ModuleT | None:
        """The compiled module that :meth:`export_module` exported as ``data``, loaded here
        (launches work as after :meth:`compile`; ``call_line`` and ``prologue`` lines written
        then call it). Called instead of ``compile`` on a graph-cache hit, so no ``Kernel``
        is at hand: ``kernel_choice`` then gets a :class:`KernelRef` (only a ``name``), and
        ``kernel_source`` is not called (the report keeps the source). Raise or return None
        when ``data`` is unusable (the graph then compiles as usual). The default: None
        (SDK 0.10.0)."""
        return None

    def target_key(self) -> str:
        """The machine and toolchain the compiled code is for (a CPU model and compiler
        version, a GPU and its architecture): it enters graph-cache keys, and artifacts from
        another machine whose backend gives a different one are refused with both values.
        The default: "" (SDK 0.10.0)."""
        return ""

    def kernel_choice(self, compiled: ModuleT, kernel: KernelRef) -> str:
        """What the backend chose for ``kernel`` at run time (a template kernel: the template
        with its configuration, or the library; any kernel: its launch configuration and
        whether it was tuned), for ``coil.explain``; "" when nothing was chosen yet or there
        is no run-time choice (SDK 0.9.0; asked of every kernel since 1.3.0, of template
        kernels only before)."""
        return ""

    def prologue(self, module_var: str, device: torch.device) -> list[str]:
        """Wrapper lines run once per call, before the first launch on ``device`` (bind the
        current stream, say). Names they define are visible to every ``call_line``."""
        return []

    def capture(self, fn: BoxedGraph, example_inputs: Sequence[Any], *,
                static_inputs: frozenset[int] = frozenset(), measure: bool = False) -> BoxedGraph | None:
        """Record ``fn`` (the compiled graph's callable, boxed: it takes the argument list)
        for replay and return the replaying callable, or None when the backend cannot.
        Called when the ``graph_capture`` knob asks for it (``torch.compile(...,
        mode="reduce-overhead")`` sets it), only for graphs whose every kernel runs on this
        backend with static sizes and no mutated input.

        From SDK 0.13.0 (plugins declaring an older SDK are called with the first two
        arguments only, and never in ``auto`` mode): ``static_inputs`` are the indices of
        inputs whose address stays fixed across calls (parameters, buffers): record them in
        place instead of copying them, and re-record if such an address changes. With
        ``measure`` (``graph_capture=auto``), time the replay against ``fn`` itself on an
        early call and keep the faster (the Triton plugin records and times on the second
        call, so that the first returns as soon as the graph has run). The callable may have a ``describe() -> str`` that
        ``coil.explain`` shows (recorded or not, and the times measured)."""
        return None

    def collective(self, op: torch._ops.OpOverload) -> Callable[..., Any]:
        """What Coil calls for the functional collective ``op`` on this device: ``op`` is an
        overload of ``torch.ops._c10d_functional`` (``all_reduce``, ``all_gather_into_tensor``,
        ``reduce_scatter_tensor``, ``all_to_all_single``, ``broadcast``, the ``_coalesced``
        forms) or its ``wait_tensor``. Return a callable with ``op``'s signature and meaning:
        a collective's call starts the communication and returns its outputs at once; they
        hold the result once the wait (what this method returns for ``wait_tensor``) has
        returned them. Coil neither frees, reuses nor writes a tensor the call took or
        returned until then. A backend with its own collective library returns its own start
        and wait (the wait must also finish collectives torch started: pass tensors it does
        not know to torch's ``wait_tensor``). The default: ``op`` itself, torch's, which runs
        on the process group's ``torch.distributed`` backend (SDK 0.11.0)."""
        return op

    def prefers_channels_last(self, convolutions: Sequence[ConvolutionInfo], *,
                              training: bool) -> bool:
        """Whether the core should lay a graph out channels-last, given the 2-D convolutions
        it runs on this device (at least one; graph order). Asked once per graph with static
        sizes, before lowering: for inference graphs, and with ``training`` for the forward
        graphs of training when the ``training_channels_last`` knob is on (their saved
        activations then reach the backward graph channels-last). A yes gives every one of
        those convolutions channels-last operands, and the layout then flows through the
        kernels between them; the answer is per graph because mixing layouts costs a
        transpose wherever they meet (ATen's convolutions return channels-last when either
        operand is). The default answers ``capabilities.conv_channels_last`` (SDK 1.1.0)."""
        return self.capabilities.conv_channels_last

    def frozen_convolution(self, info: ConvolutionInfo, weight: torch.Tensor,
                           bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A 2-D convolution of a frozen inference graph (the ``freezing`` knob), whose weight
        and bias are constants: return a callable ``f(input) -> output`` that computes
        ``aten.convolution(input, weight, bias, ...)`` as ``info`` describes it (stride,
        padding, dilation, groups; never transposed), with the weight packed once into the
        library's own layout, say; or None to leave the convolution to the core (its own
        kernels, else ATen). The output's strides may differ from ATen's (the core copies it
        into the strides its code expects). Asked once per convolution when the graph
        compiles; an exception is reported and leaves the convolution to the core. The
        default declines (SDK 1.5.0)."""
        return None

    def convolution_as_matmul(self, info: ConvolutionInfo) -> bool:
        """Whether the core should compute this 1x1 convolution (``info.pointwise``) of an
        inference graph or of a training forward graph, its input channels-last and its bias
        already split off as an add, as a matrix product of the input's pixels by the
        transposed weight, which reaches the backend as ``aten.mm`` instead of
        ``aten.convolution``. Asked once per such convolution when the graph compiles; a
        frozen convolution is asked after :meth:`frozen_convolution` and
        :meth:`frozen_linear` declined it. From SDK 1.7.0 it is asked about a training backward
        graph's ``convolution_backward`` of such a convolution too (``info`` describes the
        forward convolution; the output gradient and the input channels-last): a yes computes
        the input's and the weight's gradients as ``aten.mm`` over the pixels and the bias's
        as a column sum. The default declines (SDK 1.6.0)."""
        return False

    def frozen_linear(self, rows: int, weight: torch.Tensor,
                      bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A linear layer's matrix product in a frozen inference graph (the ``freezing``
        knob): ``input @ weight.T + bias`` for a 2-D input of ``rows`` rows, ``weight`` of
        shape (out features, in features) and ``bias`` (out features,) or None. Return a
        callable ``f(input) -> output`` computing it (the weight packed once, say), or None to
        leave the product to the core. Asked once per product when the graph compiles; an
        exception is reported and leaves it to the core. The default declines (SDK 1.5.0)."""
        return None

    def synchronize(self) -> None:
        """Wait for the device to finish queued work (benchmarks and tests call it)."""

    def warm_up(self) -> None:
        """Called once per process, when the first graph with a tensor on this device reaches
        Coil and before AOTAutograd traces it: start what the first ``compile`` will need
        (compile workers, a toolchain probe) in the background, so it is ready sooner. Must
        return at once and never raise; the default does nothing (SDK 0.8.0)."""

    def doctor(self) -> list[Check]:
        """Toolchain checks for ``coil doctor`` (compiler found, runtime present...)."""
        return []
