"""A generated Triton kernel and what its launcher needs to know: :class:`KernelSource`,
which the kernel writer (:mod:`.codegen`) and its strategies (:mod:`.split`) produce and
the launcher, the caches and the ahead-of-time build read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import sympy

from . import configs

#: How the launcher grids and tunes a kernel: "pointwise" (1-D blocks of elements),
#: "persistent" (a reduced row in one block), "looped" (blocks of a row in a loop), "tile2d"
#: (tiles of a transpose's outer and inner dims; all four from :mod:`.codegen`), "split" and
#: "pointwise-2d" (a split reduction's two kernels, :mod:`.split`), "template" (a matrix
#: product, :mod:`.template`), "scan", "serial" (one program: an ordered scatter;
#: :mod:`.special`).
KernelShape = Literal["pointwise", "persistent", "looped", "tile2d", "split", "pointwise-2d",
                      "template", "scan", "serial"]


@dataclass
class KernelSource:
    """A generated kernel and what its launcher needs to know."""

    name: str
    source: str
    #: Parameters in launch order (pointers, then sizes), with signature types.
    params: list[str]
    types: list[str]
    #: How the launcher grids and tunes it (:data:`KernelShape`).
    shape: KernelShape
    xnumel: sympy.Expr
    rnumel: sympy.Expr = sympy.Integer(1)
    #: Launch configurations the autotuner chooses from (static sizes; symbolic ones get
    #: candidates per size bucket from :func:`configs.candidates`).
    configs: list[configs.Config] = field(default_factory=list)
    #: True when the reduction's accesses are contiguous along the kept dims (``x.sum(0)``).
    x_contiguous: bool = False
    #: Buffers whose pointer is a parameter (inputs then outputs) in ``params`` order.
    buffers: list[str] = field(default_factory=list)
    #: (elements, dtype) of scratch buffers the launcher allocates (split reductions).
    workspaces: list = field(default_factory=list)
    #: Whether the source masks the kept / reduced extents (else blocks must divide them).
    xmask: bool = True
    rmask: bool = True
    #: Template kernels: (batch, rows, columns) of the product, for the launch grid.
    grid_dims: tuple[int, int, int] | None = None
