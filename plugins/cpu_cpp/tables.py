"""Small tables of what a pointwise kernel's body computes from a few of its loop variables,
the innermost among them: a channels-last batch norm's per-channel ``1 / sqrt(var + eps)``
(the channel being the innermost dim), a squeeze-and-excitation gate's ``sigmoid`` per image
and channel. Each is computed once per kernel call into an array, before the loop nest, and
read from it in the inner loop. Hoisting (:mod:`.hoist`) moves what stays the same along the
inner loop; this covers what changes along it but not along the loops outside it.

Computed per element, EfficientNet-B0's gated activations took a ``sigmoid`` of the gate at
every point of a 64x32x112x112 channels-last tensor, and its batch norms a ``sqrt`` and a
division. Taken: the largest subtrees, outside masked bodies, of memory the kernel does not
write, that use the innermost variable, leave out some other loop variable, and do some
arithmetic (a bare load is already one load, unless the vector loop would gather it: a
depthwise convolution's weights); their table of at most :data:`MAX_TABLE`
entries, each read at least :data:`MIN_READS` times, over loops of known lengths."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable

import sympy

from coil.sdk import Cast, IndexValue, Indirect, Load, Masked, Op, Value, walk
from coil.sdk.codegen import ValueScope

from .hoist import invariance
from .optable import CTYPES

if TYPE_CHECKING:
    from .codegen import KernelWriter

#: Most entries of one table (a stack array).
MAX_TABLE = 8192
#: Fewest points of the loop nest per entry: below it a table saves too little to pay for it.
MIN_READS = 8


def table_scope(kw: KernelWriter, bodies: list[Value], loops: dict[sympy.Symbol, sympy.Expr],
                gathers_only: bool = False) -> ValueScope[str]:
    """Emit, before the loop nest over ``loops`` (variable -> length, outermost first), the
    tables of ``bodies``' values that use the innermost variable and not every other one, and
    return a scope in which each such value stands for its table's entry: the parent of the
    rows' scope (whose own invariants never use the innermost variable). The tables are filled
    only where the loop nest has points (an empty kernel reads nothing). ``gathers_only``:
    only loads the vector loop would gather (a reduction kernel's tables, see
    :mod:`.reduction_loops`)."""
    scope: ValueScope[str] = ValueScope()
    points = sympy.Mul(*loops.values())
    if len(loops) < 2 or points == 0:
        return scope
    computable = invariance(kw, set(), gathers=True)  # fixed memory, no integer division
    groups: dict[tuple[sympy.Symbol, ...], list[Value]] = {}
    for body in bodies:
        _pick(body, loops, points, computable, groups, gathers_only)
    if not groups:
        return scope
    tables = [_Table(f"tab{i}", dims, values, loops) for i, (dims, values) in enumerate(groups.items())]
    for table in tables:
        table.declare(kw)
    with contextlib.ExitStack() as stack:
        if not points.is_number:
            stack.enter_context(kw.w.block(f"if ({kw.idx(points)} > 0) {{", "}"))
        for table in tables:
            table.fill(kw)
    for table in tables:
        for array, v in zip(table.arrays, table.values):
            scope[v] = f"{array}[{kw.idx(table.entry)}]"
    return scope


class _Table:
    """The arrays ``<name>_<k>`` of ``values`` over the loop variables ``dims``, row-major."""

    def __init__(self, name: str, dims: tuple[sympy.Symbol, ...], values: list[Value],
                 loops: dict[sympy.Symbol, sympy.Expr]) -> None:
        self.dims, self.values = dims, values
        self.lengths = [int(loops[d]) for d in dims]
        self.entry: sympy.Expr = sympy.Integer(0)
        for d, n in zip(dims, self.lengths):
            self.entry = self.entry * n + d
        self.arrays = [f"{name}_{k}" for k in range(len(values))]

    def declare(self, kw: KernelWriter) -> None:
        size = 1
        for n in self.lengths:
            size *= n
        for array, v in zip(self.arrays, self.values):
            kw.w.line(f"alignas(64) {CTYPES[v.dtype]} {array}[{size}];")

    def fill(self, kw: KernelWriter) -> None:
        """A loop nest of its own over the table's variables, the innermost vectorised."""
        with contextlib.ExitStack() as stack:
            for d, n in zip(self.dims, self.lengths):
                if d == self.dims[-1]:
                    kw.w.line("#pragma omp simd")
                stack.enter_context(kw.w.block(f"for (int64_t {d.name} = 0; {d.name} < {n}; {d.name}++) {{", "}"))
            inner: ValueScope[str] = ValueScope()
            for array, v in zip(self.arrays, self.values):
                kw.w.line(f"{array}[{kw.idx(self.entry)}] = {kw.value(v, inner)};")


def _pick(v: Value, loops: dict[sympy.Symbol, sympy.Expr], points: sympy.Expr,
          computable: Callable[[Value], bool], groups: dict[tuple[sympy.Symbol, ...], list[Value]],
          gathers_only: bool) -> None:
    if isinstance(v, Masked):  # its body may run under the mask only
        return
    # an index read from memory is spelled by its symbol inside the load's index, so it is
    # never a table's value itself (the load through it may be, and so may what computes it)
    dims = None if isinstance(v, Indirect) else _table_dims(v, loops, points)
    if dims is not None and computable(v) and (not gathers_only or _gathered(v, loops)):
        if v not in groups.setdefault(dims, []):
            groups[dims].append(v)
        return
    for c in v.children():
        if c is not None:
            _pick(c, loops, points, computable, groups, gathers_only)


def _gathered(v: Value, loops: dict[sympy.Symbol, sympy.Expr]) -> bool:
    """Whether ``v`` is a load (or a cast of one) that the vector loop would gather, where a
    table reads a row: one through an index read from memory (Swin's relative-position bias,
    ``table[index[i, j], head]``, the same for every window), or one whose index steps by more
    than one element along the innermost loop (a depthwise convolution's weight
    ``w[c, 0, i, j]`` along the channels, 9 apart for 3x3)."""
    load = v.x if isinstance(v, Cast) else v
    if not isinstance(load, Load):
        return False
    if load.indirect:
        return True
    step = sympy.sympify(load.index).diff(list(loops)[-1])
    return bool(step.is_number and step not in (0, 1, -1))


def _table_dims(v: Value, loops: dict[sympy.Symbol, sympy.Expr], points: sympy.Expr
                ) -> tuple[sympy.Symbol, ...] | None:
    """The loop variables ``v`` would be tabled over (in loop order), or None."""
    if not isinstance(v, Op) and not any(isinstance(c, Op) for c in walk(v)) and not _gathered(v, loops):
        return None
    used: set[sympy.Symbol] = set()
    for x in walk(v):
        if isinstance(x, Load):
            used |= sympy.sympify(x.index).free_symbols
        elif isinstance(x, IndexValue):
            used |= sympy.sympify(x.expr).free_symbols
    innermost = list(loops)[-1]
    dims = tuple(d for d in loops if d in used)  # size symbols aside
    if innermost not in used or len(dims) == len(loops):
        return None
    if not all(loops[d].is_number for d in dims):
        return None
    size = int(sympy.Mul(*(loops[d] for d in dims)))
    if size > MAX_TABLE or not (points.is_number and size * MIN_READS <= int(points)
                                or not points.is_number and len(dims) == 1):
        return None
    return dims

