"""The pieces every code writer of the kernel IR needs, whatever language it writes.

* :class:`ValueScope` — the values already emitted in one block of generated code and the name
  (or, in an interpreter, the result) each got: common-subexpression elimination. A nested
  block (a masked body, a loop) gets a child scope; what is bound inside it stays inside.
* :class:`ValueVisitor` — dispatch on the value node types of :mod:`coil.sdk.ir`: ``visit(v,
  ctx)`` calls ``visit_load(v, ctx)``, ``visit_op(v, ctx)``... A writer defines the rules of
  the node types it handles; any other type raises an error naming the writer and the type.
* :class:`IndexPrinter` — index expressions (sympy, see :mod:`coil.sdk.symbolic`) as source
  text in a target language, from an :class:`IndexSpelling` of the operations the languages
  spell differently: floor division, modulo, min/max, wide integer literals.
* Identity tables: :data:`INTEGER_IDENTITY_OPS` (ops that return an integer operand as it is)
  and :func:`reduction_identity` (the neutral element of a reduction in a dtype, for masked
  lanes and initial states), with :func:`lowest` and :func:`highest`.

The reference executor (:mod:`coil.sdk.reference`) and the shipped plugins are written on
these; a vendor's writer uses them the same way::

    class Writer(ValueVisitor[ValueScope[str], str]):
        def value(self, v: Value, scope: ValueScope[str]) -> str:
            name = scope.get(v)
            if name is None:
                name = scope[v] = self.local(self.visit(v, scope))
            return name

        def visit_op(self, v: Op, scope: ValueScope[str]) -> str:
            return OPS[v.name]([self.value(a, scope) for a in v.args])
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Generic, Hashable, Sequence, TypeVar

import sympy
import torch

from .ir import Cast, Const, IndexValue, Indirect, Load, Masked, Op, ReductionType, Value
from .symbolic import ExprPrinter

T = TypeVar("T")
C = TypeVar("C")
R = TypeVar("R")

# ----------------------------------------------------------------------------- the value scope


class ValueScope(Generic[T]):
    """Values already emitted in one block of generated code, each with what stands for it
    (the name of the local holding it, an interpreter's tensor), and the enclosing block's
    scope. Equal values are one value: a tree emitted twice, or two equal subtrees, get one
    local (common-subexpression elimination).

    A child scope (:meth:`child`, or the constructor with a parent) sees its parents' values
    and keeps its own from them: code under a mask or inside a loop body must not be reused
    after it. Subclasses add what else a block carries (a load mask) and may key values
    differently (:meth:`key`)."""

    def __init__(self, parent: ValueScope[T] | None = None) -> None:
        self.parent = parent
        #: This block's own values: key (see :meth:`key`) -> what stands for the value.
        self.memo: dict[Hashable, T] = {}

    def key(self, value: Value) -> Hashable:
        """What identifies ``value`` in the scope: the value itself (IR values are frozen and
        hashable), so equal trees share one name. An executor that must evaluate a tree exactly
        as built (``Const(0.0)`` and ``Const(-0.0)`` are equal values) keys by ``id``."""
        return value

    def get(self, value: Value) -> T | None:
        """What stands for ``value`` in this block or an enclosing one; None if not emitted."""
        key = self.key(value)
        scope: ValueScope[T] | None = self
        while scope is not None:
            if key in scope.memo:
                return scope.memo[key]
            scope = scope.parent
        return None

    def __contains__(self, value: Value) -> bool:
        return self.get(value) is not None

    def __getitem__(self, value: Value) -> T:
        got = self.get(value)
        if got is None:
            raise KeyError(value)
        return got

    def __setitem__(self, value: Value, name: T) -> None:
        """Bind ``value`` to ``name`` in this block (not in the enclosing ones)."""
        self.memo[self.key(value)] = name

    def child(self) -> ValueScope[T]:
        """A scope for a block nested in this one (``type(self)(self)``: a subclass whose
        constructor takes the parent first inherits this)."""
        return type(self)(self)


# ----------------------------------------------------------------------------- the visitor

#: Node type -> the visitor method that handles it.
_METHODS: dict[type, str] = {
    Const: "visit_const", IndexValue: "visit_index_value", Load: "visit_load", Op: "visit_op",
    Cast: "visit_cast", Masked: "visit_masked", Indirect: "visit_indirect",
}


@functools.cache
def _method(cls: type) -> str | None:
    return next((_METHODS[k] for k in cls.__mro__ if k in _METHODS), None)


class ValueVisitor(Generic[C, R]):
    """Dispatch on the node types of a value tree: :meth:`visit` calls the ``visit_<type>``
    method of the value's type (a subclass of a node type is handled as that type) with a
    context of type ``C`` (a writer's scope), returning an ``R`` (source text, a tensor).

    The methods are per node type, not recursive: a rule calls back into the writer's own
    entry point (usually a memoising ``value(v, scope)``) for the operands it needs, in the
    order their code must be emitted. A method a subclass leaves out raises
    ``NotImplementedError`` naming the visitor and the node type."""

    def visit(self, value: Value, ctx: C) -> R:
        name = _method(type(value))
        if name is None:
            return self.unhandled(value)
        return getattr(self, name)(value, ctx)

    def unhandled(self, value: Value) -> R:
        """Called for a node type the visitor has no rule for; raises."""
        raise NotImplementedError(f"{type(self).__module__}.{type(self).__qualname__} has no rule "
                                  f"for {type(value).__name__} values")

    def visit_const(self, value: Const, ctx: C) -> R:
        return self.unhandled(value)

    def visit_index_value(self, value: IndexValue, ctx: C) -> R:
        return self.unhandled(value)

    def visit_load(self, value: Load, ctx: C) -> R:
        return self.unhandled(value)

    def visit_op(self, value: Op, ctx: C) -> R:
        return self.unhandled(value)

    def visit_cast(self, value: Cast, ctx: C) -> R:
        return self.unhandled(value)

    def visit_masked(self, value: Masked, ctx: C) -> R:
        return self.unhandled(value)

    def visit_indirect(self, value: Indirect, ctx: C) -> R:
        return self.unhandled(value)


# ----------------------------------------------------------------------------- index printers

#: Largest integer literal every target takes without a 64-bit spelling.
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class IndexSpelling:
    """How a target language writes the integer operations of index expressions, each a format
    over its operands ``{0}`` and ``{1}``. The defaults are Python's.

    Division and modulo get each operand as one operand (a name or a number as it is, anything
    else parenthesised, :meth:`ExprPrinter.group`); the dividend is never negative, so C's
    truncating ``/`` is floor division. Min and max are binary and folded left over more
    operands (``min(min(a, b), c)``)."""

    floordiv: str = "({0} // {1})"
    mod: str = "({0} % {1})"
    minimum: str = "min({0}, {1})"
    maximum: str = "max({0}, {1})"
    #: An integer literal beyond :data:`INT32_MAX` in magnitude (C: ``INT64_C({0})``).
    wide_integer: str = "{0}"


class IndexPrinter(ExprPrinter):
    """Prints index expressions in the language an :class:`IndexSpelling` describes:
    ``IndexPrinter(IndexSpelling(floordiv="({0} / {1})")).print(x0 // 4)`` is ``(x0 / 4)``."""

    def __init__(self, spelling: IndexSpelling = IndexSpelling()) -> None:
        self.spelling = spelling

    def floordiv(self, a: str, b: str) -> str:
        return self.spelling.floordiv.format(self.group(a), self.group(b))

    def mod(self, a: str, b: str) -> str:
        return self.spelling.mod.format(self.group(a), self.group(b))

    def integer(self, value: int) -> str:
        return self.spelling.wide_integer.format(value) if abs(value) > INT32_MAX else str(value)

    def minimum(self, args: list[str]) -> str:
        return _fold(self.spelling.minimum, args)

    def maximum(self, args: list[str]) -> str:
        return _fold(self.spelling.maximum, args)

    def __call__(self, e: sympy.Expr | int) -> str:
        """``print(e)``: the printer as a function of index expressions."""
        return self.print(e)


def _fold(spelling: str, args: Sequence[str]) -> str:
    out = args[0]
    for a in args[1:]:
        out = spelling.format(out, a)
    return out


# ----------------------------------------------------------------------------- identity tables

#: Ops that return an integer (or bool) operand as it is: rounding an integer changes nothing.
#: A writer emits the operand itself, not a call the target may lack for integers.
INTEGER_IDENTITY_OPS: frozenset[str] = frozenset({"floor", "ceil", "round", "trunc"})


def is_integer_identity(op: Op) -> bool:
    """Whether ``op`` returns its integer operand as it is (see :data:`INTEGER_IDENTITY_OPS`)."""
    return op.name in INTEGER_IDENTITY_OPS and not op.dtype.is_floating_point


def lowest(dtype: torch.dtype) -> float | int | bool:
    """The least value of ``dtype``: -inf for floats, the minimum integer, False for bool."""
    if dtype == torch.bool:
        return False
    return -float("inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def highest(dtype: torch.dtype) -> float | int | bool:
    """The greatest value of ``dtype``: inf for floats, the maximum integer, True for bool."""
    if dtype == torch.bool:
        return True
    return float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max


def reduction_identity(kind: ReductionType, dtype: torch.dtype) -> float | int | bool:
    """The neutral element of a ``kind`` reduction over values of ``dtype``: what masked lanes
    hold and states start from (0 for sum, any and welford's fields, 1 for prod and all, the
    dtype's lowest value for max and argmax, its highest for min and argmin)."""
    if kind in ("sum", "any", "welford"):
        return 0
    if kind in ("prod", "all"):
        return 1
    return lowest(dtype) if kind in ("max", "argmax") else highest(dtype)


__all__ = ["ValueScope", "ValueVisitor", "IndexSpelling", "IndexPrinter", "INT32_MAX",
           "INTEGER_IDENTITY_OPS", "is_integer_identity", "lowest", "highest", "reduction_identity"]
