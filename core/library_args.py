"""What ATen's library kernels ask of their arguments beyond the strides eager gives them.

A fallback's tensor arguments are realized in the layout of the FX node's meta value: the
op then sees what it would in eager. The attention kernels need more of an attention bias.
Eager's composite ``scaled_dot_product_attention`` pads a bias whose rows do not start at
multiples of 8 elements and passes a slice of the padded tensor, so the meta value of that
argument is such a slice; but Coil's lowering sees through the pad and the slice (the slice
reads nothing the pad wrote) and would realize the bias densely, and the memory-efficient
kernel then refuses it ("attn_bias is not correctly aligned"). Every library op with an
``attn_bias`` argument (the memory-efficient and cuDNN kernels, forward and backward) gets
that argument in a layout whose rows start at multiples of :data:`ALIGN` elements: kept as
it is where it already does, else copied into a padded buffer and passed as a view."""
from __future__ import annotations

from typing import Any

import sympy
import torch

from . import ir
from .ir import Expr, Layout
from .symbolic import FloorDiv

#: Elements a row of an attention bias starts at a multiple of (ATen's ``preprocess_mask``).
ALIGN = 8
#: Argument names whose rows must be aligned.
ALIGNED_ARGS = ("attn_bias",)


def aligned_positions(op: Any) -> dict[str, int]:
    """The arguments of ``op`` (by name, with their positions) that need aligned rows."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return {}
    return {a.name: i for i, a in enumerate(schema.arguments) if a.name in ALIGNED_ARGS}


def _multiple(e: Expr, k: int) -> bool:
    """Whether ``e`` is provably a multiple of ``k``."""
    return sympy.Mod(sympy.sympify(e), k) == 0


def rows_aligned(layout: Layout) -> bool:
    """Whether ``layout``'s last dim is dense and every other dim (and the offset) steps by a
    multiple of :data:`ALIGN` elements. Size-1 dims never step, so their strides do not count."""
    size, stride = layout.size, layout.stride
    if not size:
        return True
    if size[-1] != 1 and sympy.expand(stride[-1] - 1) != 0:
        return False
    return _multiple(layout.offset, ALIGN) and all(
        n == 1 or _multiple(s, ALIGN) for n, s in zip(size[:-1], stride[:-1]))


def padded_layout(layout: Layout) -> Layout:
    """A row-major layout of ``layout``'s size whose rows are padded to :data:`ALIGN` elements."""
    size = tuple(layout.size)
    pitch = ALIGN * FloorDiv(size[-1] + ALIGN - 1, ALIGN)
    strides = ir.contiguous_strides((*size[:-1], pitch))
    return Layout(layout.dtype, layout.device, size, strides, sympy.Integer(0))


def expanded_dims(meta: Any) -> tuple[int, ...]:
    """The dims along which eager passes a broadcast (stride 0, more than one element): an
    argument ``expand``ed there reads one value per position of the other dims. Coil writes
    that one value, not the broadcast (Swin's relative-position bias reached the
    memory-efficient attention kernel written out for each of 4096 windows, 67 MB a layer
    and 0.4 ms on the H200, where eager passes a 33 KB tensor with stride 0)."""
    if not isinstance(meta, torch.Tensor):
        return ()
    return tuple(d for d, (n, st) in enumerate(zip(meta.size(), meta.stride()))
                 if isinstance(st, int) and st == 0 and not (isinstance(n, int) and n == 1))
