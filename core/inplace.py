"""When a kernel may write an output over the memory of one of its own inputs.

The memory planner (:mod:`coil.memory`) asks this for every kernel: of the inputs that die in
it, which may lend their memory to which of its fresh outputs. The answer comes from the
kernel's IR alone, and is conservative: an output ``O`` may take input ``D``'s memory when

* both have the same device, dtype and storage size;
* ``O`` is written by one pointwise node of the kernel (not a reduction, scan or scatter),
  whose store index is a dense map of its loop variables (each element written once);
* every load of ``D`` in the kernel is at exactly that index, in kernel variables (so each
  element of ``D`` is read only by the loop point that then writes the same element of
  ``O``), with no data-dependent index and not under a mask;
* ``D`` is read by no node after the writing node (later in its loop, or in a later loop):
  every read of an element comes before the write over it, in the order of the kernel's
  nodes; and, in a kernel with several loops or reduced dims, the writing node reads ``D``
  itself. In a pointwise kernel of one loop, ``D`` may be read only by earlier nodes: a
  fused batch norm and activation reads the convolution's output in the normalising node
  and writes in the activation (EfficientNet-B0's 64x96x112x112 one allocated a fresh
  buffer of 73 MiB per call on the CPU, with its page faults, and took 437 ms in the model
  against 140 ms alone).

A pointwise kernel (no reduced dims) meeting these rules is safe on any backend that runs a
kernel's nodes in order and reads a node's inputs before it stores its output, point by
point: the same program (or thread) reads ``D[i]`` and then writes ``O[i]``. A kernel with
reduced dims runs several loops per kept point, which a backend may spread over threads
(or over several launches); it writes in place only where the device's backend declares
``Capabilities.inplace_reductions``, its promise that a later loop's stores come after every
read of the earlier loops at the same kept point."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, Sequence

import sympy

from . import ir
from .kernel import Kernel


@dataclass(frozen=True)
class InplacePolicy:
    """Which kernels may write over their dying inputs: a pointwise kernel when
    ``pointwise(kernel)`` says its backend takes aliased pointers (its plugin declares SDK
    0.7.0 or later), and a kernel with reduced dims when ``reductions(kernel)`` says so (its
    device backend's ``Capabilities.inplace_reductions`` too)."""

    reductions: Callable[[Kernel], bool] = lambda kernel: False
    #: Whether the kernel's backend takes aliased input and output pointers at all.
    pointwise: Callable[[Kernel], bool] = lambda kernel: True

    def allows(self, kernel: Kernel) -> bool:
        if kernel.special is not None or kernel.template is not None or not self.pointwise(kernel):
            return False
        return not kernel.r_ranges or self.reductions(kernel)


def inplace_pairs(kernel: Kernel, outputs: Sequence[str], donors: Sequence[str],
                  size_class: Callable[[str], Hashable]) -> dict[str, str]:
    """Output -> donor for the ``outputs`` of ``kernel`` (fresh buffers it writes) that may
    take the memory of one of ``donors`` (inputs that die in it); each donor lends once.
    ``size_class``: a buffer's (device, dtype, storage size)."""
    pairs: dict[str, str] = {}
    free = list(donors)
    for out in outputs:
        for donor in free:
            if size_class(donor) == size_class(out) and writes_over(kernel, donor, out):
                pairs[out] = donor
                free.remove(donor)
                break
    return pairs


def writes_over(kernel: Kernel, donor: str, out: str) -> bool:
    """Whether ``kernel`` may store ``out`` over ``donor``'s memory (the rules above)."""
    if kernel.special is not None:
        return False
    placed = [(li, pi, kn) for li, loop in enumerate(kernel.loops)
              for pi, kn in enumerate(loop.nodes) if out in kn.stores]
    if len(placed) != 1:
        return False
    li, pi, writer = placed[0]
    if writer.is_reduction or tuple(writer.stores) != (out,) or writer.node.outputs() != (out,):
        return False
    index = sympy.expand(sympy.sympify(writer.store_index))
    variables = list(kernel.x_vars) + (list(kernel.r_vars) if writer.level == "r" else [])
    ranges = list(kernel.x_ranges) + (list(kernel.r_ranges) if writer.level == "r" else [])
    if not dense(index, variables, ranges):
        return False
    read_by_writer = False
    for lj, loop in enumerate(kernel.loops):
        for pj, kn in enumerate(loop.nodes):
            loads = list(_loads_of(kn.body, donor))
            if not loads:
                continue
            if (lj, pj) > (li, pi):
                return False  # read after the store over it
            for load, masked in loads:
                if masked or load.indirect or sympy.expand(load.index - index) != 0:
                    return False
            read_by_writer |= kn is writer
    return read_by_writer or (len(kernel.loops) == 1 and not kernel.r_ranges)


def dense(index: sympy.Expr, variables: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr]) -> bool:
    """Whether ``index`` maps the points of ``ranges`` one-to-one onto consecutive elements:
    affine, with strides that are a permutation of contiguous ones (1, then each stride the
    previous one times its extent). Proved symbolically; anything else answers False."""
    unit = {v: sympy.Integer(0) for v, n in zip(variables, ranges) if n == 1}
    index = sympy.expand(index.xreplace(unit))
    active = [(v, sympy.sympify(n)) for v, n in zip(variables, ranges) if v not in unit]
    strides: dict[sympy.Symbol, sympy.Expr] = {}
    rest = index
    for v, _ in active:
        c = index.coeff(v)
        if c == 0 or c.free_symbols & set(variables):
            return False
        strides[v] = c
        rest = sympy.expand(rest - c * v)
    if rest.free_symbols & set(variables):
        return False  # not affine (a div/mod of a loop variable, a product of two)
    extent = dict(active)
    expected: sympy.Expr = sympy.Integer(1)
    while strides:
        v = next((v for v, c in strides.items() if sympy.expand(c - expected) == 0), None)
        if v is None:
            return False
        expected = expected * extent[v]
        del strides[v]
    return True


def _loads_of(value: ir.Value, buffer: str) -> Iterator[tuple[ir.Load, bool]]:
    """Every load of ``buffer`` in ``value``, with whether it sits under a mask."""
    seen: set[tuple[int, bool]] = set()
    stack: list[tuple[ir.Value, bool]] = [(value, False)]
    while stack:
        v, masked = stack.pop()
        if v is None or (id(v), masked) in seen:
            continue
        seen.add((id(v), masked))
        if isinstance(v, ir.Load) and v.buffer == buffer:
            yield v, masked
        if isinstance(v, ir.Masked):
            stack.append((v.mask, masked))
            stack.append((v.body, True))
        else:
            stack.extend((c, masked) for c in v.children())


__all__ = ["InplacePolicy", "inplace_pairs", "writes_over", "dense"]
