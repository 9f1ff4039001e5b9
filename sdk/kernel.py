"""What a device plugin receives to generate code: a ``Kernel`` (fused nodes over one
iteration space, re-indexed into the kernel's loop variables) and its ``Loop``s.

Loop variables are ``x0..`` over ``x_ranges`` (the kept, parallel dims) and ``r0..`` over
``r_ranges`` (the reduced dims; empty for a pointwise kernel). Every node sits at level
``"x"`` (once per x point) or ``"r"`` (once per (x, r) point). Buffers named in
``internal`` never reach memory: a plugin keeps them in registers or locals."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import sympy
import torch

from . import ir
from .ir import Expr

if TYPE_CHECKING:  # annotations only: the templates' module is not needed to build a kernel
    from .templates import GemmProblem, Operand, Template

#: A kernel's two levels: ``"x"``, the kept dims every node runs over, and ``"r"``, the
#: reduced dims inside them.
Level = Literal["x", "r"]


@dataclass(frozen=True)
class KernelNode:
    node: ir.Node
    level: Level
    body: ir.Value
    #: Where the (first) output goes, in kernel variables.
    store_index: Expr
    #: Buffer each output is stored into (a mutated input's name for input mutation).
    stores: tuple[str, ...]

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.node, ir.ReductionNode)


@dataclass(frozen=True)
class Loop:
    """Consecutive kernel nodes that share one pass over their level's iteration space."""

    level: Level
    nodes: list[KernelNode]


@dataclass(frozen=True)
class TemplateCall:
    """The matrix product a template kernel starts with (``Kernel.template``).

    The kernel computes ``problem`` with ``template`` (:mod:`coil.sdk.templates`), then, per
    output element, ``alpha * product + beta * bias`` in float32 when ``bias`` is set (an
    ``addmm``: one rounding, as the GEMM library's own epilogue does), rounded to
    ``problem.out_dtype``: that is the value of buffer ``output``. The kernel's nodes (the
    epilogue, all at level ``"x"`` over ``x_ranges`` = the product's (batch?, M, N)) read it
    at ``store_index``; it is stored there unless ``output`` is in ``Kernel.internal``.
    Operands and bias name kernel input buffers; their sizes, strides and offsets are in
    elements of those buffers."""

    template: Template
    problem: GemmProblem
    output: str
    store_index: Expr
    #: Sized like the output (broadcast dims with stride 0), or None.
    bias: Operand | None = None
    alpha: float = 1.0
    beta: float = 1.0
    #: Whether the backend should measure the template against its library (``unfused``)
    #: on the first launch and keep the faster (else the template runs).
    measure: bool = False
    #: The :class:`coil.sdk.ir.TemplateNode` the call comes from (reports, self-check).
    node: ir.TemplateNode | None = None
    #: The same epilogue as a kernel of its own, reading ``output`` from memory: with the
    #: library's product it is what the template competes against (None: no epilogue).
    unfused: "Kernel | None" = None


@dataclass(frozen=True)
class Kernel:
    """One fused group of work, as a plugin compiles it. Frozen: a pass that changes a kernel
    (the core's renaming after scheduling, the memory planner's ``inplace``) makes a copy
    with :func:`dataclasses.replace`."""

    name: str
    x_ranges: tuple[Expr, ...]
    r_ranges: tuple[Expr, ...]
    nodes: list[KernelNode]
    loops: list[Loop]
    #: Buffers read from memory, in argument order.
    inputs: list[str]
    #: Buffers written to memory, in argument order.
    outputs: list[str]
    #: Buffers that stay inside the kernel.
    internal: set[str]
    #: Size symbols the kernel takes as integer arguments, in argument order.
    size_args: list[sympy.Symbol]
    #: dtype of every buffer the kernel touches (inputs, outputs, internal).
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    origins: tuple[str, ...] = ()
    #: For single-node kernels of special kinds (scan, scatter): the node itself.
    special: ir.Node | None = None
    #: Outputs stored over the memory of an input (output -> input), set by the memory
    #: planner: the input dies in this kernel and every read of it is at the index the output
    #: is written, by the writing node or a node before it (:mod:`coil.inplace`). The launch
    #: passes the same memory for both; generated code must not assume they differ (no
    #: ``__restrict__``, no reordering of a store before an earlier load of the other buffer).
    inplace: dict[str, str] = field(default_factory=dict)
    #: The matrix product the kernel starts with (a template kernel), else None.
    template: TemplateCall | None = None

    @property
    def first_node(self) -> ir.Node:
        """A node of the kernel (its device is the kernel's): the special node, else the
        template's node, else the first of ``nodes``; ``ValueError`` for a kernel with none."""
        if self.special is not None:
            return self.special
        if self.template is not None and self.template.node is not None:
            return self.template.node
        if not self.nodes:
            raise ValueError(f"kernel {self.name} has no node")
        return self.nodes[0].node

    @property
    def x_vars(self) -> list[sympy.Symbol]:
        return [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(len(self.x_ranges))]

    @property
    def r_vars(self) -> list[sympy.Symbol]:
        return [sympy.Symbol(f"r{i}", integer=True, nonnegative=True) for i in range(len(self.r_ranges))]

    @property
    def args(self) -> list[str]:
        """Argument order: input buffers, output buffers, then size symbols."""
        return [*self.inputs, *self.outputs, *(s.name for s in self.size_args)]
