"""What a code-writing strategy sees of the Triton kernel writer.

A strategy writes one part of a kernel its own way when its pattern matches: a reduction
split over many programs (:mod:`.split`), a max and a sum of exponentials fused into one
pass (:mod:`.online_softmax`). The writer (:class:`.codegen.KernelWriter`) decides when to
call one; the strategy then drives the writer through :class:`Writer` alone: it reads the
kernel and the writer's decisions (sizes, masks), writes lines into the current
:class:`~coil.sdk.CodeWriter`, and leaves values, index variables, stores and the writer's
state to the methods below. Nothing but the writer and its subclass (:mod:`.template`) calls
a private member of the writer (``tests/test_code_rules.py`` checks it), so the writer may
change how it keeps its registers and temporaries without breaking a strategy.

:class:`Scope` is the values computed in one straight-line region of a kernel and the mask
its loads take; strategies make their own for the regions they open."""
from __future__ import annotations

from typing import ContextManager, Protocol, Sequence

import sympy

from coil.sdk import CodeWriter, Kernel, KernelNode, Value
from coil.sdk.codegen import ValueScope


class Scope(ValueScope[str]):
    """Values already computed in the current straight-line region, and the load mask (a
    scope built without one takes its parent's)."""

    def __init__(self, parent: Scope | None = None, mask: str | None = None) -> None:
        super().__init__(parent)
        self.mask = mask if mask is not None or parent is None else parent.mask


class Writer(Protocol):
    """The kernel writer's interface to strategies (implemented by
    :class:`.codegen.KernelWriter`)."""

    #: The kernel being written.
    k: Kernel
    #: Where lines go: the function being written (see :meth:`begin_kernel`).
    w: CodeWriter
    #: Whether the source runs under Triton's interpreter (math spelled without libdevice).
    interpret: bool
    #: Kept points and reduced elements per kept point, as expressions and as kernel text.
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    rnumel_text: str
    #: Whether accesses are contiguous along the kept dims (a column reduction).
    x_contiguous: bool
    #: Whether the reduced extent needs a mask (``rmask``) in this kernel.
    rmask: bool

    def mask(self, level: str) -> str | None:
        """The mask of loads and stores at ``level`` (``"x"``: once per kept point, ``"r"``:
        per reduced element too), such as ``"xmask & rmask"``, or None."""

    def define_x(self) -> None:
        """Write the kept dims' index variables that the kernel's accesses use (after
        ``xindex`` is defined)."""

    def define_r(self, nodes: Sequence[KernelNode]) -> None:
        """Write the reduced dims' index variables that ``nodes`` use (after ``rindex``)."""

    def value(self, v: Value, scope: Scope) -> str:
        """The name of a variable holding ``v``, writing what computes it if ``scope`` (or
        a register) does not hold it yet."""

    def emit(self, nodes: Sequence[KernelNode], level: str, scope: Scope) -> None:
        """Compute and store each of ``nodes`` (not reductions over a loop) at ``level``."""

    def store_results(self, kn: KernelNode, results: Sequence[str]) -> None:
        """Store reduction ``kn``'s finished results (one variable per output, at the kept
        points), or keep them in registers where its outputs are internal."""

    def loop_values(self) -> ContextManager[None]:
        """A region whose values do not outlive it: what is stored inside (an r-level loop's
        pointwise values) is no longer in a register afterwards."""

    def mask_everything(self) -> None:
        """Mask every later store by ``xmask`` (and ``rmask`` at level r): for kernels
        whose blocks may overhang both extents and that define both masks."""

    def begin_kernel(self) -> CodeWriter:
        """Write another function of the same kernel from now on, into a new code writer
        (returned); values of the previous function are no longer in registers."""
