"""Sums of a one-hot selection, computed without a loop over the reduced dim.

Cross-entropy's backward sums, per row, ``where(r == target, -1.0, 0.0) * scale`` over every
position ``r`` of a vocabulary (50257 for GPT-2): a loop of pure compute whose result is the
one selected term. :func:`sum_of_one_hot` recognises such a body when a ``sum`` is lowered
and gives the sum as a pointwise value over the kept dims, so no kernel loops over ``r``.

The rule. The body, a tree over the kept loop variables and one reduction variable ``r``
(range ``[0, R)``, ``R`` an integer of at least 2 or a symbolic size, which Dynamo never lets
be 0 or 1), is a chain of
``mul`` (either operand), ``neg``, ``truediv`` (float numerator only) and ``Cast`` (any cast
that maps zero to zero and keeps NaN: not float to integer) whose siblings do not depend on
``r``, ending at a *one-hot*:

* ``r == e`` (a bool; ``e == r`` alike),
* ``where(r == e, a, 0)`` or ``where(r != e, 0, a)``,
* ``Masked(r == e, a, other=0)``,

where ``r`` is the reduction variable as data (``IndexValue``, possibly cast to an integer
type that holds ``R - 1``), ``e`` is integral (not bool) and neither ``e`` nor ``a`` depends on
``r``; a zero is a constant equal to 0, of either sign. A load on the chain of a buffer this
graph wrote from a known lazy value, at the same element, is read through to that value
(``look_through``): the one-hot is often stored because two users read it.

The value. Let ``T`` be the body with the one-hot's condition replaced by ``0 <= e < R`` (so a
``Masked`` still reads ``a`` only where the original mask could hold) and ``Z`` the body with
the one-hot replaced by its zero. Off the selected position every term of the loop is ``Z``,
which is ``±0`` or NaN (zero times an inf or NaN factor, or over a zero divisor); at it, the term is ``T``. A float
sum that starts at +0.0 and adds one term and zeros is exact, so the loop's sum is
``(T + Z) + 0.0``: NaN when a factor is not finite (as in eager, where ``0 * inf`` poisons
the row), ``T`` otherwise, with ``-0.0`` turned into ``+0.0`` as the loop's accumulator does;
out of range ``T`` equals ``Z`` and the sum is +0.0 or NaN. ``Z`` is left out when every sibling
is a finite constant (a nonzero one for a divisor: then ``Z`` is a zero), and an integer sum
is ``T`` alone (``Z`` is 0; an op that turns a float into an integer stops the chain).
Not recognised: float comparisons with ``r`` (``arange(R).float() == t``), several reduced
dims, a one-hot under ``add`` or any other op, a factor that depends on ``r`` (a gather)."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import sympy
import torch

from .. import ir
from ..ir import Expr, Value
from .values import cast

#: A load on the body's chain -> the value it holds at that element, or None.
LookThrough = Callable[[ir.Load], "Value | None"]


@dataclasses.dataclass(frozen=True)
class _Split:
    """A body (or a part of the chain) two ways: ``selected`` with the one-hot's condition
    made ``0 <= e < R``, ``off`` with the one-hot replaced by its zero."""

    selected: Value
    off: Value
    #: Whether ``off`` is certainly a zero (every sibling on the chain a finite constant).
    off_is_zero: bool


def sum_of_one_hot(body: Value, r: sympy.Symbol, size: Expr, look_through: LookThrough) -> Value | None:
    """The sum of ``body`` over ``r`` in ``[0, size)`` as a value free of ``r``, when the body
    is a scaled one-hot (the module's rule); None otherwise."""
    if size.is_Integer and int(size) < 2:  # the formula counts on an off-target term
        return None
    split = _split(body, _Context(r, size, look_through))
    if split is None:
        return None
    out = split.selected
    if body.dtype.is_floating_point:
        if not split.off_is_zero:
            out = ir.Op(body.dtype, name="add", args=(out, split.off))
        out = ir.Op(body.dtype, name="add", args=(out, ir.Const(body.dtype, value=0.0)))
    if _depends_on(out, r):  # the rule guarantees otherwise
        return None
    return out


@dataclasses.dataclass(frozen=True)
class _Context:
    r: sympy.Symbol
    size: Expr
    look_through: LookThrough


def _split(v: Value, cx: _Context) -> _Split | None:
    found = _one_hot(v, cx)
    if found is not None:
        return found
    if isinstance(v, ir.Load):
        source = cx.look_through(v)
        return _split(cast(source, v.dtype), cx) if source is not None else None
    if isinstance(v, ir.Cast):
        if not _keeps_zero_and_nan(v.x.dtype, v.dtype):
            return None
        inner = _split(v.x, cx)
        if inner is None:
            return None
        return _Split(dataclasses.replace(v, x=inner.selected), cast(inner.off, v.dtype), inner.off_is_zero)
    if isinstance(v, ir.Op):
        return _split_op(v, cx)
    return None


def _split_op(v: ir.Op, cx: _Context) -> _Split | None:
    """The chain through ``mul`` (either operand), ``neg`` and a float ``truediv``'s numerator."""
    if v.name == "neg" and len(v.args) == 1:
        positions: tuple[int, ...] = (0,)
    elif v.name == "mul" and len(v.args) == 2:
        positions = (0, 1)
    elif v.name == "truediv" and len(v.args) == 2 and v.dtype.is_floating_point:
        positions = (0,)
    else:
        return None
    if not v.dtype.is_floating_point and any(a.dtype.is_floating_point for a in v.args):
        return None  # a NaN off the target would become an integer
    for i in positions:
        siblings = [a for j, a in enumerate(v.args) if j != i]
        if any(_depends_on(s, cx.r) for s in siblings):
            continue
        inner = _split(v.args[i], cx)
        if inner is None:
            continue
        # 0 * c is a zero for a finite c; 0 / c needs c nonzero too
        known = inner.off_is_zero and all(_finite_const(s) and (v.name != "truediv" or s.value != 0)
                                          for s in siblings)
        return _Split(_with_arg(v, i, inner.selected), _with_arg(v, i, inner.off), known)
    return None


def _with_arg(v: ir.Op, i: int, arg: Value) -> ir.Op:
    return dataclasses.replace(v, args=tuple(arg if j == i else a for j, a in enumerate(v.args)))


def _one_hot(v: Value, cx: _Context) -> _Split | None:
    """``v`` split, if it is a one-hot itself."""
    if isinstance(v, ir.Op) and v.name == "eq":
        e = _compared_with_index(v, "eq", cx)
        return None if e is None else _Split(_in_range(e, cx.size), ir.Const(torch.bool, value=False), True)
    if isinstance(v, ir.Op) and v.name == "where" and len(v.args) == 3:
        cond, x, y = v.args
        e = _compared_with_index(cond, "eq", cx)
        if e is not None and _is_zero(y) and not _depends_on(x, cx.r):
            return _Split(_with_arg(v, 0, _in_range(e, cx.size)), _zero_like(y, v.dtype), True)
        e = _compared_with_index(cond, "ne", cx)
        if e is not None and _is_zero(x) and not _depends_on(y, cx.r):
            selected = dataclasses.replace(v, args=(_in_range(e, cx.size), y, x))
            return _Split(selected, _zero_like(x, v.dtype), True)
        return None
    if isinstance(v, ir.Masked) and v.other == 0 and not _depends_on(v.body, cx.r):
        e = _compared_with_index(v.mask, "eq", cx)
        if e is not None:
            zero = ir.Const(v.dtype, value=_scalar_zero(v.other, v.dtype))
            return _Split(dataclasses.replace(v, mask=_in_range(e, cx.size)), zero, True)
    return None


def _compared_with_index(cond: Value | None, name: str, cx: _Context) -> Value | None:
    """``e`` when ``cond`` is ``r <name> e`` or ``e <name> r`` with ``e`` integral and free of
    ``r``; else None."""
    if not (isinstance(cond, ir.Op) and cond.name == name and len(cond.args) == 2):
        return None
    for u, e in (cond.args, reversed(cond.args)):
        if _is_index(u, cx) and _integral(e.dtype) and not _depends_on(e, cx.r):
            return e
    return None


def _is_index(u: Value, cx: _Context) -> bool:
    """Whether ``u`` is ``r`` as data, exactly (every integer type on the way holds ``R - 1``)."""
    while isinstance(u, ir.Cast):
        if not _holds(u.dtype, cx.size):
            return False
        u = u.x
    return isinstance(u, ir.IndexValue) and u.expr == cx.r and _holds(u.dtype, cx.size)


def _holds(dtype: torch.dtype, size: Expr) -> bool:
    if not _integral(dtype):
        return False
    if dtype == torch.int64:
        return True
    return bool(size.is_Integer) and int(size) - 1 <= torch.iinfo(dtype).max


def _integral(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _in_range(e: Value, size: Expr) -> Value:
    """``0 <= e < size``, compared in int64."""
    e64 = cast(e, torch.int64)
    bound: Value = (ir.Const(torch.int64, value=int(size)) if size.is_Integer
                    else ir.IndexValue(torch.int64, expr=size))
    low = ir.Op(torch.bool, name="ge", args=(e64, ir.Const(torch.int64, value=0)))
    high = ir.Op(torch.bool, name="lt", args=(e64, bound))
    return ir.Op(torch.bool, name="logical_and", args=(low, high))


def _keeps_zero_and_nan(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether a cast maps every zero to a zero and NaN to NaN (not float to integer)."""
    return dst.is_floating_point or not src.is_floating_point


def _is_zero(v: Value) -> bool:
    return isinstance(v, ir.Const) and v.value == 0  # False too; never NaN


def _zero_like(z: Value, dtype: torch.dtype) -> Value:
    """The constant zero ``z`` as the one-hot's ``dtype`` (its sign kept)."""
    assert isinstance(z, ir.Const)
    return ir.Const(dtype, value=_scalar_zero(z.value, dtype))


def _scalar_zero(value: bool | int | float, dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return False
    if dtype.is_floating_point:
        return math.copysign(0.0, value) if isinstance(value, float) else 0.0
    return 0


def _finite_const(v: Value) -> bool:
    return isinstance(v, ir.Const) and (not isinstance(v.value, float) or math.isfinite(v.value))


def _depends_on(value: Value, r: sympy.Symbol) -> bool:
    """Whether ``r`` appears in any index expression of ``value``."""
    for v in ir.walk(value):
        if isinstance(v, ir.Load):
            exprs: tuple[Expr, ...] = (v.index,)
        elif isinstance(v, ir.IndexValue):
            exprs = (v.expr,)
        elif isinstance(v, ir.Indirect):
            exprs = (v.size,)
        else:
            continue
        if any(isinstance(x, sympy.Basic) and r in x.free_symbols for x in exprs):
            return True
    return False


__all__ = ["sum_of_one_hot", "LookThrough"]
