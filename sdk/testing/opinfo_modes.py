"""What the OpInfo runner compares, per mode: a :class:`~.opinfo_case.Case` is one program
built from one OpInfo sample (the function to compile, its call arguments, the context around
both runs, the tolerance, Dynamo settings, and the graph breaks that belong to the mode itself).

* ``forward`` — the op on the sample, as it is (outputs and mutated inputs).
* ``grad`` — outputs and ``torch.autograd.grad`` of a random projection of them with respect
  to every differentiable input (:mod:`.opinfo_grad`); the compiled function graph-breaks at
  ``autograd.grad``, so Coil compiles a forward and a backward graph, as in training.
* ``grad-joint`` — the same program with Dynamo tracing ``autograd.grad`` into the graph
  (``trace_autograd_ops``): forward and backward ops lowered together in one graph.
* ``autocast`` — the float32 sample inside ``torch.autocast(bfloat16)`` for eager and
  compiled; bfloat16 tolerances, every output dtype must equal eager's.
* ``layout`` — the sample again with its tensors re-strided, same values
  (:mod:`.opinfo_layout`): one case per layout variant. When none of the first samples has a
  4-D or 5-D tensor, the first later one that has (within :data:`CHANNELS_LAST_SCAN`) adds a
  channels-last case: most ops' first samples are small, and channels-last is where kernels
  meet fallbacks with other layouts (batch norm, padding, interpolation, attention...).
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ContextManager

import torch

from .compare import Tolerance, clone_call_args
from .opinfo_case import Case, CaseFactory
from .opinfo_db import DEVICE, DTYPE, iter_samples
from .opinfo_grad import grad_case
from .opinfo_layout import channels_last, layout_variants, restrided

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput


class Mode(str, enum.Enum):
    """Which program the runner builds from each sample."""

    FORWARD = "forward"
    GRAD = "grad"
    GRAD_JOINT = "grad-joint"
    AUTOCAST = "autocast"
    LAYOUT = "layout"

    @property
    def requires_grad(self) -> bool:
        """Whether samples are generated with ``requires_grad=True`` (OpInfo then marks which
        inputs are differentiable)."""
        return self in (Mode.GRAD, Mode.GRAD_JOINT)


#: Autocast's low-precision type on the CPU.
AUTOCAST_DTYPE = torch.bfloat16
#: Tolerance under autocast. bfloat16 has an 8-bit significand: one rounding is up to 2^-9
#: relative, and a compiled program that fuses two ops skips the rounding eager does between
#: them. rtol 1.6e-2 is ``torch.testing``'s bfloat16 default (~4 ulps); atol 1e-2 covers
#: results near zero, whose error is relative to the larger operands they cancel out of.
#: Float32 outputs get the same: an op under autocast may compute a float32 result from
#: bfloat16 intermediates (a composite op whose inner matmul autocast downcasts). Values
#: outside it are then judged against a float64 reference (:attr:`Case.fp64_reference`).
AUTOCAST_TOLERANCE = Tolerance(low=(1e-2, 1.6e-2), low_for_all_floats=True)


#: OpInfos the autocast mode leaves out, with the reason: differences every ``torch.compile``
#: backend shows (aot_eager and inductor too), which Coil's kernels cannot cause or cure.
AUTOCAST_SKIPPED_OPS: dict[str, str] = {
    name: "upstream: AOTAutograd keeps aten.linalg_pinv whole and runs compiled graphs with "
          "autocast off, so the matmul inside it runs in float32 (eager's, under autocast, in "
          "bfloat16): the result is float32 where eager's is bfloat16, with every backend"
    for name in ("linalg.pinv", "linalg.pinv.hermitian")
}


def mode_skip_reason(mode: Mode, op: OpInfo) -> str | None:
    """Why ``op`` (already eligible for the forward mode) is not run in ``mode``, or None."""
    if mode is Mode.AUTOCAST and op.full_name in AUTOCAST_SKIPPED_OPS:
        return AUTOCAST_SKIPPED_OPS[op.full_name]
    if mode.requires_grad:
        if not op.supports_autograd:
            return "OpInfo.supports_autograd is False"
        if DTYPE not in op.supported_backward_dtypes(DEVICE):
            return f"no {DTYPE} backward on {DEVICE}"
    return None


def op_fn(op: OpInfo) -> Callable[..., Any]:
    """``op`` behind a plain function named after it (what Dynamo compiles)."""
    def fn(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    fn.__name__ = "opinfo_" + op.full_name.replace(".", "_")
    return fn


def _autocast(device: torch.device | None) -> ContextManager[Any]:
    # The compiled run uses the device under test's autocast (its own op lists).
    return torch.autocast(device.type if device is not None else DEVICE, dtype=AUTOCAST_DTYPE)


def case_factories(mode: Mode, op: OpInfo, sample: SampleInput) -> list[tuple[str, CaseFactory]]:
    """``(variant, factory)`` pairs for one sample; the variant is ``""`` when a mode has one
    case per sample. Cheap: factories do the work."""
    fn = op_fn(op)
    if mode is Mode.FORWARD:
        return [("", lambda: Case(fn, sample))]
    if mode is Mode.AUTOCAST:
        return [("", lambda: Case(fn, sample, context=_autocast, tolerance=AUTOCAST_TOLERANCE,
                                  fp64_reference=lambda: fp64_run(fn, sample)))]
    if mode.requires_grad:
        return [("", lambda: grad_case(op, sample, joint=mode is Mode.GRAD_JOINT))]
    if mode is Mode.LAYOUT:
        return [(name, (lambda s=variant_sample: Case(fn, s)))
                for name, variant_sample in layout_variants(sample)]
    raise ValueError(f"unknown OpInfo mode {mode!r}; known: {', '.join(m.value for m in Mode)}")


#: How many samples the layout mode looks through for one to run channels-last.
CHANNELS_LAST_SCAN = 24

#: ``(sample index, sample, [(variant, factory), ...])`` for each sample a mode runs.
SelectedCases = list[tuple[int, "SampleInput", list[tuple[str, CaseFactory]]]]


def select_cases(mode: Mode, op: OpInfo, num_samples: int) -> SelectedCases:
    """The samples ``mode`` runs for ``op`` (the first ``num_samples`` deterministic ones, and
    for the layout mode perhaps one later channels-last sample) with their case factories.
    Samples are materialized here: generating them draws from the seeded RNG, which running
    earlier samples must not perturb."""
    samples = list(iter_samples(op, num_samples, requires_grad=mode.requires_grad))
    selected = [(index, sample, case_factories(mode, op, sample)) for index, sample in samples]
    if mode is Mode.LAYOUT and not any(v == "channels_last" for _, _, fs in selected for v, _ in fs):
        extra = _first_channels_last_case(op, op_fn(op), {index for index, _ in samples})
        if extra is not None:
            selected.append(extra)
    return selected


def _first_channels_last_case(op: OpInfo, fn: Callable[..., Any], taken: set[int]
                              ) -> tuple[int, SampleInput, list[tuple[str, CaseFactory]]] | None:
    for index, sample in iter_samples(op, CHANNELS_LAST_SCAN):
        if index in taken:
            continue
        variant = restrided(sample, channels_last)
        if variant is not None:
            return index, sample, [("channels_last", lambda: Case(fn, variant))]
    return None


def fp64_run(fn: Callable[..., Any], sample: SampleInput) -> Any:
    """``fn`` on float64 copies of the sample's float32 tensors, outside autocast (which
    leaves float64 alone): the float64 reference for a low-precision comparison."""
    args, kwargs = clone_call_args(sample)
    widen = _widen_float32
    with torch.autocast(DEVICE, enabled=False):
        return fn(*widen(args), **widen(kwargs))


def _widen_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().double() if value.dtype == torch.float32 else value
    if isinstance(value, list):
        return [_widen_float32(v) for v in value]
    if type(value) is tuple:
        return tuple(_widen_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _widen_float32(v) for k, v in value.items()}
    return value
