"""Coil's loop-level IR.

Two layers:

* **Values** — a small expression language for one element of a loop body: ``Load`` from a
  buffer at a sympy index, ``Const``, ``IndexValue`` (an index expression used as data),
  ``Op`` (a named pointwise operation), ``Cast``, ``Masked`` (evaluate only where a mask
  holds) and ``Indirect`` (a data-dependent index variable, for gather/index/embedding).
  Values are frozen, hashable trees; plugins walk them with per-op tables.
* **Nodes** — what the scheduler orders and fuses: each writes one or more buffers over an
  iteration space. ``PointwiseNode``, ``ReductionNode``, ``ScanNode``, ``ScatterNode`` and
  ``ExternNode`` (a call into ATen). Bodies are Values written over the node's own loop
  variables: ``x0..`` for the kept ranges and ``r0..`` for reduction ranges.

Buffers carry a ``Layout`` (dtype, device, sizes, strides, offset in elements).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, Sequence, get_args

import sympy
import torch

from .symbolic import loop_vars, substitute

if TYPE_CHECKING:  # annotations only: the templates' module is not needed to build the IR
    from .templates import GemmOp, Template

Expr = sympy.Expr


# ----------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Value:
    """One element of a loop body."""

    dtype: torch.dtype

    def children(self) -> tuple["Value", ...]:
        return ()


@dataclass(frozen=True, eq=False)
class Const(Value):
    """A constant. Two float constants are equal when their ``repr``s are: ``0.0`` and
    ``-0.0`` differ (``x + -0.0`` keeps a negative zero, ``x + 0.0`` does not, so a code
    writer's common-subexpression elimination must not merge them), and every NaN equals
    every other."""

    #: A Python scalar matching ``dtype``: ``bool`` for torch.bool, ``float`` for floating
    #: dtypes (``inf``, ``nan`` included), ``int`` otherwise (an infinite or NaN operand of an
    #: integer op stays a ``float``).
    value: bool | int | float = 0

    def _key(self) -> tuple[Any, ...]:
        v = self.value
        return (self.dtype, repr(v)) if isinstance(v, float) else (self.dtype, type(v) is bool, v)

    def __eq__(self, other: object) -> bool:
        return type(other) is Const and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


@dataclass(frozen=True)
class IndexValue(Value):
    """An integer index expression used as data (``arange``, masks of ``pad``/``cat``)."""

    expr: Expr = sympy.Integer(0)


@dataclass(frozen=True)
class Indirect(Value):
    """A data-dependent index: ``value`` (an integer Value), a negative one counted from the
    end the way Python's indexing does where ``wrap`` (``x[idx]``, ``index_put``, ``take``);
    where not (``gather``, ``scatter``, ``index_select``, ``embedding``), a negative value is
    out of range, as eager has it. Appears as ``symbol`` inside index expressions. An index
    outside ``[0, size)`` (after wrapping) is an error eager raises: a backend must not read
    or write through it, and should report it (the C++ plugin raises ``IndexError`` after
    the kernel; SDK 1.9.0)."""

    symbol: sympy.Symbol = sympy.Symbol("ind")
    value: Value | None = None
    size: Expr = sympy.Integer(1)
    wrap: bool = True

    def children(self) -> tuple[Value, ...]:
        return (self.value,) if self.value is not None else ()


@dataclass(frozen=True)
class Load(Value):
    buffer: str = ""
    index: Expr = sympy.Integer(0)
    #: Indirect index variables used inside ``index``.
    indirect: tuple[Indirect, ...] = ()

    def children(self) -> tuple[Value, ...]:
        return self.indirect


@dataclass(frozen=True)
class Op(Value):
    """A named pointwise operation; the name is a key of every plugin's op table."""

    name: str = ""
    args: tuple[Value, ...] = ()

    def children(self) -> tuple[Value, ...]:
        return self.args


@dataclass(frozen=True)
class Cast(Value):
    x: Value | None = None

    def children(self) -> tuple[Value, ...]:
        return (self.x,)


@dataclass(frozen=True)
class Masked(Value):
    """``body`` where ``mask`` holds, else ``other``; loads inside ``body`` happen only under
    the mask (out-of-range addresses stay unread)."""

    mask: Value | None = None
    body: Value | None = None
    #: The value where ``mask`` is false, a Python scalar as :attr:`Const.value`.
    other: bool | int | float = 0

    def children(self) -> tuple[Value, ...]:
        return (self.mask, self.body)


def walk(value: Value) -> Iterator[Value]:
    """Every value of a tree once, children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Value, bool]] = [(value, False)]
    while stack:
        v, expanded = stack.pop()
        if expanded:
            yield v
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        stack.append((v, True))
        for c in reversed(v.children()):
            stack.append((c, False))


def loads(value: Value) -> list[Load]:
    return [v for v in walk(value) if isinstance(v, Load)]


def op_count(value: Value) -> int:
    return sum(1 for v in walk(value) if isinstance(v, (Op, Cast, Masked)))


def rewrite(value: Value, index: Callable[[Expr], Expr] | None = None,
            load: Callable[[Load], Value | None] | None = None,
            op: Callable[[Op], Value | None] | None = None) -> Value:
    """A copy of a tree with every index expression passed through ``index``, every load
    (after its own indices) through ``load`` and every op (after its arguments) through
    ``op`` (each returns a replacement, or None to keep it). Shared subtrees stay shared."""
    memo: dict[int, Value] = {}
    fix = index or (lambda e: e)

    def visit(v: Value) -> Value:
        got = memo.get(id(v))
        if got is not None:
            return got
        if isinstance(v, Load):
            out: Value = dataclasses.replace(
                v, index=fix(v.index), indirect=tuple(visit(i) for i in v.indirect))
            if load is not None:
                out = load(out) or out  # type: ignore[arg-type]
        elif isinstance(v, IndexValue):
            out = dataclasses.replace(v, expr=fix(v.expr))
        elif isinstance(v, Indirect):
            out = dataclasses.replace(v, value=visit(v.value), size=fix(v.size))
        elif isinstance(v, Op):
            out = dataclasses.replace(v, args=tuple(visit(a) for a in v.args))
            if op is not None:
                out = op(out) or out  # type: ignore[arg-type]
        elif isinstance(v, Cast):
            out = dataclasses.replace(v, x=visit(v.x))
        elif isinstance(v, Masked):
            out = dataclasses.replace(v, mask=visit(v.mask), body=visit(v.body))
        else:
            out = v
        memo[id(v)] = out
        return out

    return visit(value)


def map_indices(value: Value, fn: Callable[[Expr], Expr]) -> Value:
    """Rewrite every index expression of a tree (used to re-index a body into a kernel's
    loop variables)."""
    return rewrite(value, index=fn)


def replace_loads(value: Value, fn: Callable[[Load], Value | None]) -> Value:
    """Replace loads for which ``fn`` returns a value (used to redirect or inline buffers)."""
    return rewrite(value, load=fn)


# ----------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    dtype: torch.dtype
    device: torch.device
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr = sympy.Integer(0)

    def index(self, idx: Sequence[Expr]) -> Expr:
        assert len(idx) == len(self.size), (idx, self.size)
        return self.offset + sum((i * s for i, s in zip(idx, self.stride)), sympy.Integer(0))

    @property
    def numel(self) -> Expr:
        return sympy_product(self.size)

    def storage_span(self) -> Expr:
        """Elements the layout touches from offset 0 (for allocation)."""
        if any(s == 0 for s in self.size):
            return sympy.Integer(0)
        return self.offset + 1 + sum(((n - 1) * s for n, s in zip(self.size, self.stride)), sympy.Integer(0))


def sympy_product(items: Sequence[Expr]) -> Expr:
    out: Expr = sympy.Integer(1)
    for i in items:
        out = out * i
    return out


def contiguous_strides(size: Sequence[Expr]) -> tuple[Expr, ...]:
    strides: list[Expr] = []
    acc: Expr = sympy.Integer(1)
    for n in reversed(size):
        strides.append(acc)
        acc = acc * n
    return tuple(reversed(strides))


# ----------------------------------------------------------------------------- nodes


@dataclass
class Node:
    """A unit of scheduled work that writes buffers. ``origins`` names the ATen ops it came
    from (for kernel names and reports)."""

    name: str
    origins: tuple[str, ...] = field(default=(), kw_only=True)

    def outputs(self) -> tuple[str, ...]:
        return (self.name,)

    def reads(self) -> set[str]:
        return set()

    @property
    def device(self) -> torch.device:
        raise NotImplementedError


@dataclass
class Buffer:
    """A named piece of device memory with a layout. ``storage`` names the buffer whose
    memory this one uses when it writes into another (input mutation)."""

    name: str
    layout: Layout
    storage: str | None = None
    #: Elements between the start of the underlying storage and this buffer's data pointer
    #: (non-zero for inputs that are views); ``as_strided`` offsets count from the storage.
    storage_offset: Expr = sympy.Integer(0)


@dataclass
class PointwiseNode(Node):
    """``out[store_index(x)] = body(x)`` for every ``x`` in ``ranges``."""

    layout: Layout
    ranges: tuple[Expr, ...]
    body: Value
    store_index: Expr
    #: When set, the node writes into this existing buffer (an input being mutated).
    mutates: str | None = None

    def reads(self) -> set[str]:
        return {ld.buffer for ld in loads(self.body)}

    @property
    def device(self) -> torch.device:
        return self.layout.device

    @property
    def numel(self) -> Expr:
        return sympy_product(self.ranges)


#: Reduction types every plugin implements.
ReductionType = Literal["sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford"]
REDUCTION_TYPES: tuple[ReductionType, ...] = get_args(ReductionType)
#: How a scan combines (``ScanNode.combine``).
ScanCombine = Literal["sum", "prod"]
#: How a scatter's write combines with the value there (``ScatterNode.accumulate``; None
#: overwrites).
ScatterAccumulate = Literal["add", "mul", "amax", "amin"]
#: Why an ATen call is in the graph (``ExternNode.kind``): a library kernel by design
#: (matmul, convolution), or an op Coil has no lowering for.
ExternKind = Literal["library", "fallback"]


@dataclass
class ReductionNode(Node):
    """Reduces ``body(x, r)`` over ``r`` in ``reduction_ranges`` for every ``x`` in ``ranges``.

    ``welford`` computes (mean, m2) in one pass and writes two buffers: ``name`` (the mean)
    and ``extra_outputs[0]`` (the sum of squared deviations)."""

    layout: Layout
    ranges: tuple[Expr, ...]
    reduction_ranges: tuple[Expr, ...]
    reduction_type: ReductionType
    body: Value
    store_index: Expr
    #: dtype the accumulator uses (float32 for half types, int64 for integer sums).
    acc_dtype: torch.dtype
    extra_outputs: tuple[str, ...] = ()

    def outputs(self) -> tuple[str, ...]:
        return (self.name, *self.extra_outputs)

    def reads(self) -> set[str]:
        return {ld.buffer for ld in loads(self.body)}

    @property
    def device(self) -> torch.device:
        return self.layout.device


@dataclass
class ScanNode(Node):
    """Inclusive scan of ``body(x, r0)`` along ``r0`` (cumsum, cumprod): ``ranges`` are the
    other dims, ``scan_range`` the scanned one. ``body`` and ``store_index`` are written over
    ``x0..`` (one per entry of ``ranges``) and ``r0``."""

    layout: Layout
    ranges: tuple[Expr, ...]
    scan_range: Expr
    combine: ScanCombine
    body: Value
    store_index: Expr
    acc_dtype: torch.dtype

    def reads(self) -> set[str]:
        return {ld.buffer for ld in loads(self.body)}

    @property
    def device(self) -> torch.device:
        return self.layout.device


@dataclass
class ScatterNode(Node):
    """Copies ``base(x)`` over ``ranges``, then for every ``s`` in ``src_ranges`` writes
    ``value(s)`` at ``target_index(s)`` (which may hold ``Indirect`` symbols bound by
    ``target_indirect``), combining with ``accumulate`` ("add", "mul", "amax", "amin", or
    None to overwrite; overwrites run in order, the last write wins as in eager).
    ``base`` and ``store_index`` are written over ``x0..`` (one per entry of ``ranges``);
    ``value``, ``target_index`` and ``target_indirect`` over ``r0..`` (``src_ranges``)."""

    layout: Layout
    ranges: tuple[Expr, ...]
    base: Value
    store_index: Expr
    src_ranges: tuple[Expr, ...]
    value: Value
    target_index: Expr
    target_indirect: tuple[Indirect, ...]
    accumulate: ScatterAccumulate | None

    def reads(self) -> set[str]:
        out = {ld.buffer for ld in loads(self.base)} | {ld.buffer for ld in loads(self.value)}
        for ind in self.target_indirect:
            out |= {ld.buffer for ld in loads(ind)}
        return out

    @property
    def device(self) -> torch.device:
        return self.layout.device


@dataclass
class ExternNode(Node):
    """A call of an ATen op on realized buffers. ``args``/``kwargs`` hold ``BufferRef``s where
    tensors go; ``output_names``/``output_layouts`` describe each tensor the call returns
    (``output_paths`` says where in the returned structure each one sits)."""

    #: What the wrapper calls: an ATen ``OpOverload`` as a rule, or another callable the graph
    #: held (a higher-order op).
    op: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output_names: tuple[str, ...]
    output_layouts: tuple[Layout | None, ...]
    output_paths: tuple[tuple[int, ...], ...]
    #: "fallback" for ops Coil has no lowering for, "library" for matmul/conv by design.
    kind: ExternKind = "fallback"
    #: Input buffers whose storage the outputs may share (ATen view ops): they stay alive
    #: as long as the outputs do.
    aliases: tuple[str, ...] = ()

    def outputs(self) -> tuple[str, ...]:
        return self.output_names

    def reads(self) -> set[str]:
        out: set[str] = set()
        for a in _flatten(self.args) + _flatten(list(self.kwargs.values())):
            if isinstance(a, BufferRef):
                out.add(a.name)
        return out

    @property
    def device(self) -> torch.device:
        for lay in self.output_layouts:
            if lay is not None:
                return lay.device
        for a in _flatten(list(self.args) + list(self.kwargs.values())):
            if isinstance(a, BufferRef):
                return a.layout.device
        raise ValueError(f"extern call {self.name} touches no tensor, so it has no device")


@dataclass
class TemplateNode(Node):
    """A matrix product that a template (:mod:`coil.sdk.templates`) may compute with the
    pointwise nodes after it fused as its epilogue: ``out[b?, m, n] = alpha * sum_k a[b?, m, k]
    * b[b?, k, n] + beta * bias[b?, m, n]`` (float32, rounded once to the output dtype).
    ``library`` is the same product as an ATen call: the scheduler runs it instead when no
    epilogue fuses (a library GEMM alone is the faster kernel)."""

    layout: Layout
    #: The product's iteration space: (batch?, M, N); written at ``store_index`` over x0...
    ranges: tuple[Expr, ...]
    store_index: Expr
    op: GemmOp
    a: BufferRef
    b: BufferRef
    template: Template
    library: "ExternNode"
    #: Sized like the output (broadcast dims with stride 0), or None.
    bias: "BufferRef | None" = None
    alpha: float = 1.0
    beta: float = 1.0
    #: Whether the backend measures the template against the library on first launch.
    measure: bool = False
    #: Keep the template even with nothing fused (the ``templates="force"`` knob; tests).
    force: bool = False
    #: The graph's record of the library call (its kind becomes "template" when the
    #: template runs), for reports.
    record: Any = None

    def reads(self) -> set[str]:
        return {self.a.name, self.b.name} | ({self.bias.name} if self.bias is not None else set())

    @property
    def device(self) -> torch.device:
        return self.layout.device


@dataclass(frozen=True)
class BufferRef:
    """A tensor argument of an extern call: a realized buffer seen through ``layout`` (which
    may be a strided view of it)."""

    name: str
    layout: Layout


def _flatten(items: Any) -> list[Any]:
    out: list[Any] = []
    if isinstance(items, (list, tuple)):
        for i in items:
            out.extend(_flatten(i))
    else:
        out.append(items)
    return out


def node_ranges_vars(ranges: Sequence[Expr], prefix: str = "x") -> list[sympy.Symbol]:
    return loop_vars(prefix, len(ranges))


def reindex_value(value: Value, mapping: Mapping[sympy.Symbol, Expr]) -> Value:
    return map_indices(value, functools.partial(substitute, mapping=mapping))
