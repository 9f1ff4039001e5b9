"""Templates: matrix-product kernel skeletons that a capability plugin adds to the devices
other plugins serve (SDK 0.9.0).

A :class:`Template` computes one matrix product, ``out[b, m, n] = sum_k a[b, m, k] *
b[b, k, n]`` (``mm`` has no batch dim, ``bmm`` has one), in the code of one *dialect*
(``"triton"``, ``"cpp"``). The core offers a product to a template when the device's backend
lists the template's dialect in ``Capabilities.template_dialects``; the backend embeds the
template's code in a kernel and writes the *epilogue* after it: the pointwise nodes the
scheduler fused onto the product (a bias, an activation, a residual, a cast), in its own
code writer. So a vendor's GEMM library can ship as a plugin of its own, and every backend
that speaks its dialect gets it.

The dialects' contracts (what ``render`` returns and what the backend supplies):

``"triton"``
    ``render(problem, names, None)`` returns the statements (unindented, one per line) that
    start the body of a ``@triton.jit`` function. ``names`` maps ``"a"`` and ``"b"`` to the
    operands' pointer parameters and ``"B"``, ``"M"``, ``"N"``, ``"K"``, ``"a_stride0"``...
    (one per dim of each operand) and ``"a_offset"``, ``"b_offset"`` to Triton expressions of
    the sizes, strides and offsets (elements). The block sizes are constexpr parameters:
    ``XBLOCK`` (rows of ``out``), ``RBLOCK`` (columns), ``KBLOCK`` (the inner dim) and
    ``GROUP_M`` (rows of tiles a group of programs walks, for cache reuse); the launch is a
    1-D grid of ``B * cdiv(M, XBLOCK) * cdiv(N, RBLOCK)`` programs. The statements must
    define ``pid_b`` (the batch index; 0 for ``mm``), ``offs_m`` (``[XBLOCK]`` row indices),
    ``offs_n`` (``[RBLOCK]`` column indices) and ``acc`` (``[XBLOCK, RBLOCK]`` float32, the
    product; rows and columns past ``M``/``N`` may hold anything). The backend stores it.
    ``configs(problem)`` lists the block sizes, warps and stages to try.

``"cpp"``
    ``render(problem, names, config)`` returns C++ statements for the body of a function
    (``config`` fixes the blocking: C++ has no launch-time constants). ``names`` has the
    same entries (C++ expressions; ``"a"``/``"b"`` are ``const T*`` already offset) plus
    ``"epilogue"``, a callable the statements call once per output tile as
    ``epilogue(b, m0, n0, mt, nt, acc, ldacc)``: batch index, first row and column of the
    tile, its rows and columns, and the float tile itself (row ``i``, column ``j`` at
    ``acc[i * ldacc + j]``). The backend's epilogue stores it. The statements may use OpenMP
    (``#pragma omp parallel for``) over tiles; each tile's ``epilogue`` call must come from
    one thread.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Mapping

import sympy
import torch

Expr = sympy.Expr

#: The products a template may implement.
GemmOp = Literal["mm", "bmm"]


@dataclass(frozen=True)
class Operand:
    """One input of a product: a buffer seen through sizes and strides (elements), with a
    leading batch dim for ``bmm``."""

    name: str
    dtype: torch.dtype
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr = sympy.Integer(0)

    def static_strides(self) -> tuple[int, ...] | None:
        """The strides as ints, or None when one is symbolic."""
        if all(sympy.sympify(s).is_number for s in self.stride):
            return tuple(int(s) for s in self.stride)
        return None


@dataclass(frozen=True)
class GemmProblem:
    """``out = a @ b`` (``op`` "mm": a is (M, K), b is (K, N); "bmm": a leading batch dim),
    accumulated in float32 and delivered in ``out_dtype``."""

    op: GemmOp
    a: Operand
    b: Operand
    out_dtype: torch.dtype
    device_type: str

    @property
    def batch(self) -> Expr:
        return self.a.size[0] if self.op == "bmm" else sympy.Integer(1)

    @property
    def m(self) -> Expr:
        return self.a.size[-2]

    @property
    def k(self) -> Expr:
        return self.a.size[-1]

    @property
    def n(self) -> Expr:
        return self.b.size[-1]

    def static_sizes(self) -> tuple[int, int, int, int] | None:
        """(batch, M, N, K) as ints, or None when a size is symbolic."""
        sizes = [sympy.sympify(s) for s in (self.batch, self.m, self.n, self.k)]
        if all(s.is_number for s in sizes):
            b, m, n, k = (int(s) for s in sizes)
            return b, m, n, k
        return None

    def flops(self) -> int | None:
        sizes = self.static_sizes()
        return None if sizes is None else 2 * sizes[0] * sizes[1] * sizes[2] * sizes[3]


@dataclass(frozen=True)
class TemplateConfig:
    """One blocking of a template: tile rows, columns and depth, the tile-group height, and
    (Triton) warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def __str__(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} group={self.group_m} "
                f"warps={self.num_warps} stages={self.num_stages}")

    def replace(self, **changes: int) -> "TemplateConfig":
        return dataclasses.replace(self, **changes)


class Template:
    """A matrix-product skeleton in one dialect. Subclass it and return instances from the
    ``coil_templates`` hook."""

    #: A short name for reports (``triton_gemm``).
    name: str = ""
    #: The code it renders: ``"triton"`` or ``"cpp"`` (module docstring); a backend takes
    #: templates whose dialect its ``Capabilities.template_dialects`` lists.
    dialect: str = ""
    #: The products it computes.
    ops: frozenset[str] = frozenset({"mm", "bmm"})

    def supports(self, problem: GemmProblem) -> str | None:
        """None when the template computes ``problem`` exactly (dtypes, sizes, strides); else
        why not, in a few words (shown in ``coil.explain``). Never called for ops outside
        :attr:`ops`."""
        return None

    def configs(self, problem: GemmProblem) -> list[TemplateConfig]:
        """Blockings worth trying for ``problem``, best guess first (the first is used when
        nothing is measured)."""
        raise NotImplementedError

    def prefer(self, problem: GemmProblem) -> bool:
        """Whether the template may beat the device's library for ``problem``: a heuristic
        from sizes and dtypes. Under the ``templates`` knob's default (``auto``) it decides
        which products get a template at all; where the backend tunes, those are then
        measured against the library on the first launch (each one is builds on a cold
        cache), elsewhere the answer stands. ``tune`` measures every supported product
        without asking. A wrong guess costs speed, never correctness."""
        return True

    def render(self, problem: GemmProblem, names: Mapping[str, str],
               config: TemplateConfig | None) -> str:
        """The code of the product in the template's dialect (module docstring)."""
        raise NotImplementedError


__all__ = ["GemmOp", "GemmProblem", "Operand", "Template", "TemplateConfig"]
