"""Layout variants of an OpInfo sample: the same values in other strides, for the runner's
``layout`` mode. Each variant re-strides every strided tensor of the sample it applies to;
a variant that would change no tensor is left out.

* ``transposed`` — tensors of 2 or more dims stored column-major in their last two dims
  (``t.mT.contiguous().mT``).
* ``strided+offset`` — every tensor as a view with a step of 2 along its last dim, at a
  storage offset of 3 elements (odd: no vector alignment either). The gaps hold NaN (floats),
  the tensor's largest value (integers: still a valid index) or True (bools), so a kernel
  reading them by mistake produces a visible difference rather than a lucky zero.
* ``channels_last`` — 4-D tensors in ``torch.channels_last``, 5-D in ``channels_last_3d``.

Eager runs on the same re-strided tensors, so an op whose result depends on strides
(``as_strided``) is still compared with what eager gives for them. Tensors that alias in the
sample are re-strided one by one and stop aliasing."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import SampleInput

#: Step along the last dim and storage offset of the ``strided+offset`` variant.
STEP = 2
OFFSET = 3

Transform = Callable[[torch.Tensor], torch.Tensor | None]  # None: leave the tensor as it is


def _plain(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and type(t) is torch.Tensor and t.layout == torch.strided
            and not t.is_quantized and not t.is_nested and t.device.type != "meta")


def transposed(t: torch.Tensor) -> torch.Tensor | None:
    """Column-major in the last two dims, when both have more than one element."""
    if t.dim() < 2 or t.size(-1) < 2 or t.size(-2) < 2:
        return None
    return t.detach().mT.contiguous().mT


def _gap_value(t: torch.Tensor) -> Any:
    if t.dtype == torch.bool:
        return True
    if t.is_floating_point() or t.is_complex():
        return float("nan")
    return t.max().item() if t.numel() else 0


def strided_with_offset(t: torch.Tensor) -> torch.Tensor | None:
    """A step of :data:`STEP` along the last dim, at storage offset :data:`OFFSET`."""
    if t.numel() == 0:
        return None
    strides: list[int] = [0] * t.dim()
    stride = STEP
    for d in reversed(range(t.dim())):
        strides[d] = stride
        stride *= t.size(d)
    span = OFFSET + sum((n - 1) * s for n, s in zip(t.shape, strides)) + 1 + STEP
    base = torch.full((span,), _gap_value(t), dtype=t.dtype, device=t.device)
    view = base.as_strided(t.shape, strides, OFFSET)
    view.copy_(t.detach())
    return view


def channels_last(t: torch.Tensor) -> torch.Tensor | None:
    """``channels_last`` (4-D) or ``channels_last_3d`` (5-D), when that changes the strides."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    if t.dim() not in formats or t.size(1) < 2 or math.prod(t.shape[2:]) < 2:
        return None
    return t.detach().contiguous(memory_format=formats[t.dim()])


#: The variants, in the order they run.
VARIANTS: dict[str, Transform] = {
    "transposed": transposed,
    "strided+offset": strided_with_offset,
    "channels_last": channels_last,
}


def _apply(value: Any, transform: Transform, changed: list[bool]) -> Any:
    if _plain(value):
        new = transform(value)
        if new is None:
            return value
        changed.append(True)
        return new.requires_grad_(value.requires_grad) if value.requires_grad else new
    if isinstance(value, list):
        return [_apply(v, transform, changed) for v in value]
    if type(value) is tuple:
        return tuple(_apply(v, transform, changed) for v in value)
    if isinstance(value, dict):
        return {k: _apply(v, transform, changed) for k, v in value.items()}
    return value


def restrided(sample: SampleInput, transform: Transform) -> SampleInput | None:
    """``sample`` with ``transform`` applied to each of its tensors; None if none changed."""
    from torch.testing._internal.opinfo.core import SampleInput

    changed: list[bool] = []
    with torch.no_grad():
        new_input = _apply(sample.input, transform, changed)
        new_args = _apply(tuple(sample.args), transform, changed)
        new_kwargs = _apply(dict(sample.kwargs), transform, changed)
    if not changed:
        return None
    return SampleInput(new_input, args=new_args, kwargs=new_kwargs,
                       output_process_fn_grad=sample.output_process_fn_grad,
                       broadcasts_input=sample.broadcasts_input, name=sample.name)


def layout_variants(sample: SampleInput) -> list[tuple[str, SampleInput]]:
    """``(variant name, re-strided sample)`` for each variant that changes a tensor."""
    variants = []
    for name, transform in VARIANTS.items():
        new = restrided(sample, transform)
        if new is not None:
            variants.append((name, new))
    return variants
