"""The fuzzer's op families: each draws one program step (a line of Python) over the values a
`Scope` holds, reading their eager shapes, and the scope's dry run drops what eager rejects.

Families, chosen to meet at the boundaries where Coil's bugs live:

* ``pointwise`` — ops Coil lowers to fused kernels (unary, binary with broadcasting,
  ``where``, casts between float32, bfloat16, float16 and float64);
* ``reduction`` / ``normalize`` / ``scan`` — sum, amax, mean, var, ... over random dims,
  softmax, layer/RMS/group/batch norm, cumsum (all lowered);
* ``fallback`` — ops with no Coil lowering that run through ATen between kernels (pooling,
  sort, topk, cummax, logcumsumexp, median, vector norm, unfold, digamma, grid_sample);
* ``library`` — matmul, bmm, addmm, linear, conv1d/conv2d, scaled_dot_product_attention;
* ``view`` — permute, transpose, stepped slices, narrow, select, (un)squeeze, expand,
  reshape/view, movedim, diagonal, chunk, channels_last ``contiguous``;
* ``misc`` — cat, stack, pad, flip, roll, repeat, tril, index_select, index_add;
* ``inplace`` — add_/mul_/copy_/clamp_/setitem into slices of intermediates and inputs,
  ``index_put_``, ``masked_fill_``."""
from __future__ import annotations

import random
from typing import Callable

from .choices import DrawFn
from .ops_compute import fallback, library, normalize, pointwise, reduction, scan
from .ops_data import inplace, misc, view
from .programs import Scope, Step


FAMILIES: dict[str, tuple[int, Callable[[DrawFn, Scope], Step | None]]] = {
    "pointwise": (6, pointwise),
    "reduction": (2, reduction),
    "normalize": (2, normalize),
    "scan": (1, scan),
    "fallback": (4, fallback),
    "library": (4, library),
    "view": (4, view),
    "misc": (2, misc),
    "inplace": (3, inplace),
}


def choose_family(rng: random.Random, families: tuple[str, ...] | None = None) -> str:
    """A family by weight (among ``families`` if given)."""
    names = [n for n in FAMILIES if families is None or n in families]
    return rng.choices(names, weights=[FAMILIES[n][0] for n in names])[0]


def draw_step(draw: DrawFn, scope: Scope, family: str) -> Step | None:
    """One step of ``family``."""
    return FAMILIES[family][1](draw, scope)
