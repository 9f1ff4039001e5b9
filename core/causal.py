"""Proving from a Dynamo graph that an attention mask is causal.

``scaled_dot_product_attention(..., is_causal=True)`` lets the attention kernel skip the
upper triangle instead of reading a mask, but it is only equivalent where the mask is exactly
``tril(ones(L, S))`` (top-left aligned: query ``i`` sees keys ``j <= i``) for every batch
and head. :func:`causal_polarity` decides that from the ops that build the mask inside the
graph, never from tensor values: a registered buffer holding a triangle can be changed by
the user without a recompile, so a mask read from a graph input is never proven.

What it proves, as an abstract value per node:

* a *triangle*: nonzero exactly where ``j <= i`` (``keep``) or exactly where ``j > i``
  (not ``keep``) over the last two dims, the same for every leading index. Sources:
  ``tril(ones(...))``, ``triu(ones(...), 1)``, ``arange`` comparisons
  (``arange(S)[None, :] <= arange(L)[:, None]``). Kept by casts, ``== 0``/``!= 0``/``== 1``
  (flip or keep), logical negation, reshapes that keep the last two dims, and slices of the
  last two dims that start at 0 (a top-left corner of a triangle is a triangle);
* an *index*: ``arange(n)`` seen as a row index (varies along dim -2) or a column index
  (dim -1), from which comparisons build triangles."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Union

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .dynamo_ops import Call, canonical, constant, value, written


@dataclass(frozen=True)
class _Triangle:
    keep: bool  # True: nonzero where j <= i; False: nonzero where j > i


@dataclass(frozen=True)
class _Index:
    axis: Literal["row", "col"]


_Fact = Union[_Triangle, _Index, None]

#: ``a OP b`` between a column index (left) and a row index (right) -> the triangle it is.
_COL_VS_ROW = {"le": True, "gt": False}
#: The same comparisons with the operands swapped.
_SWAPPED = {"ge": "le", "lt": "gt", "le": "ge", "gt": "lt"}


def causal_polarity(node: Any, rows: Any, cols: Any) -> bool | None:
    """True when ``node`` is provably nonzero exactly where ``j <= i`` over dims (-2, -1),
    of sizes ``rows`` x ``cols``; False when exactly where ``j > i``; None when unproven."""
    fact = _fact(node, depth=0)
    if fact is not None and written(node.graph, _cone(node)):
        return None  # the mask, or what it is made of, is written in place (a prefix-LM's ``keep[:, :3] = True``)
    fake = value(node)
    if not isinstance(fact, _Triangle) or not isinstance(fake, torch.Tensor) or fake.dim() < 2:
        return None
    if not (_same(fake.shape[-2], rows) and _same(fake.shape[-1], cols)):
        return None
    return fact.keep


def _cone(node: torch.fx.Node) -> set[torch.fx.Node]:
    """``node`` and every node it is computed from."""
    seen: set[torch.fx.Node] = set()
    pending = [node]
    while pending:
        n = pending.pop()
        if n not in seen:
            seen.add(n)
            pending.extend(n.all_input_nodes)
    return seen


def _same(a: Any, b: Any) -> bool:
    return bool(statically_known_true(a == b))


def _fact(node: Any, depth: int) -> _Fact:
    call = canonical(node)
    if call is None or depth > 16:
        return None
    if call.op in ("tril", "triu"):
        return _triangle_of_ones(call)
    if call.op == "arange":
        return _arange(call)
    if call.op in ("le", "gt", "ge", "lt"):
        return _compare(call, depth)
    if call.op in ("eq", "ne"):
        return _compare_with_constant(call, depth)
    inner = _fact(call["input"], depth + 1)
    if inner is None:
        return None
    if call.op == "logical_not" or (call.op == "bitwise_not" and _is_bool(call["input"])):
        return _Triangle(not inner.keep) if isinstance(inner, _Triangle) else None
    if call.op == "cast":
        return inner if isinstance(inner, _Triangle) else None
    if call.op in ("reshape", "getitem"):
        return _through_view(call, inner)
    return None


def _is_bool(node: Any) -> bool:
    fake = value(node)
    return isinstance(fake, torch.Tensor) and fake.dtype == torch.bool


def _triangle_of_ones(call: Call) -> _Fact:
    source = canonical(call["input"])
    ones = source is not None and (source.op == "ones" or (
        source.op == "full" and constant(source["fill_value"]) == 1.0))
    fake = value(call.node)
    if not ones or not isinstance(fake, torch.Tensor) or fake.dim() < 2:
        return None
    if call.op == "tril" and call["diagonal"] == 0:
        return _Triangle(keep=True)
    if call.op == "triu" and call["diagonal"] == 1:
        return _Triangle(keep=False)
    return None


def _arange(call: Call) -> _Fact:
    bounds = call["range"]
    start = bounds[0] if len(bounds) >= 2 else call["start"] or 0
    step = bounds[2] if len(bounds) == 3 else call["step"] or 1
    fake = value(call.node)
    if start != 0 or step != 1 or not isinstance(fake, torch.Tensor) or fake.dim() != 1:
        return None
    if fake.is_floating_point() and not statically_known_true(
            fake.shape[0] <= round(2 / torch.finfo(fake.dtype).eps)):
        return None  # positions a float type rounds (257 is 256 in bfloat16) compare equal
    return _Index("col") if _varying_axis(fake) == -1 else None


def _varying_axis(fake: torch.Tensor) -> int | None:
    """The one dim of ``fake`` that is not of size 1, counted from the end; None if there is
    not exactly one, or it is not provably larger than 1."""
    varying = [d - fake.dim() for d in range(fake.dim()) if not _same(fake.shape[d], 1)]
    if len(varying) != 1 or not statically_known_true(fake.shape[varying[0]] > 1):
        return None
    return varying[0]


def _compare(call: Call, depth: int) -> _Fact:
    left, right = _fact(call["input"], depth + 1), _fact(call["other"], depth + 1)
    if not (isinstance(left, _Index) and isinstance(right, _Index)) or left.axis == right.axis:
        return None
    op = call.op if left.axis == "col" else _SWAPPED[call.op]
    keep = _COL_VS_ROW.get(op)
    return None if keep is None else _Triangle(keep)


def _compare_with_constant(call: Call, depth: int) -> _Fact:
    """``tri == 0``, ``tri != 0``, ``tri == 1``...: a triangle of zeros and ones compared with
    0 or 1 is the same triangle or its complement."""
    inner = _fact(call["input"], depth + 1)
    other = call["other"]
    if isinstance(other, bool):
        other = float(other)
    c = None if isinstance(other, torch.fx.Node) else constant(other)
    if not isinstance(inner, _Triangle) or c not in (0.0, 1.0):
        return None
    same = (call.op == "eq") == (c == 1.0)
    return _Triangle(inner.keep if same else not inner.keep)


def _through_view(call: Call, inner: _Fact) -> _Fact:
    before, after = value(call["input"]), value(call.node)
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return None
    if isinstance(inner, _Index):
        if call.op == "getitem" and not _slices_from_zero(call["index"]):
            return None
        axis = _varying_axis(after)
        return None if axis not in (-1, -2) else _Index("col" if axis == -1 else "row")
    if after.dim() < 2 or before.dim() < 2:
        return None
    if call.op == "reshape":
        # the last two dims unchanged: each leading index still holds the same triangle
        same = _same(after.shape[-1], before.shape[-1]) and _same(after.shape[-2], before.shape[-2])
        return inner if same else None
    return inner if _keeps_last_two(call["index"], before.dim()) else None


def _slices_from_zero(index: Any) -> bool:
    entries = index if isinstance(index, tuple) else (index,)
    for e in entries:
        if isinstance(e, slice):
            if e.start not in (None, 0) or e.step not in (None, 1):
                return False
        elif e is not None and e is not Ellipsis:
            return False
    return True


def _keeps_last_two(index: Any, ndim: int) -> bool:
    """Whether indexing with ``index`` maps the result's last two dims onto the input's last
    two, each sliced from 0 (integers allowed on leading dims only)."""
    entries = list(index) if isinstance(index, tuple) else [index]
    if not _slices_from_zero(tuple(e for e in entries if not isinstance(e, int))):
        return False
    consumed = sum(1 for e in entries if e is not None and e is not Ellipsis)
    if consumed > ndim or sum(e is Ellipsis for e in entries) > 1:
        return False
    # expand the Ellipsis (or trailing implicit full slices) into slices
    if Ellipsis in entries:
        at = entries.index(Ellipsis)
        entries[at:at + 1] = [slice(None)] * (ndim - consumed)
    else:
        entries += [slice(None)] * (ndim - consumed)
    # (input dim or None for a new dim) for each result dim
    sources: list[int | None] = []
    dim = 0
    for e in entries:
        if e is None:
            sources.append(None)
        elif isinstance(e, int):
            if dim >= ndim - 2:
                return False
            dim += 1
        else:
            sources.append(dim)
            dim += 1
    return len(sources) >= 2 and sources[-2:] == [ndim - 2, ndim - 1]
