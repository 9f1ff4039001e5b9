"""Graph outputs that eager returns as views of one storage.

Eager's ``y = x * 2; return y, y[1:]`` returns two tensors over one storage: a later
``y.add_(1)`` shows through the slice. ``x.mean(0, keepdim=True).expand_as(x)`` returns a
tensor with a zero stride, which an in-place op refuses to write. Coil writes each output into
a buffer of its own unless told otherwise, which loses both: the slice stops following ``y``,
and the expanded output becomes a dense copy that accepts the write (and costs the memory of
its full size). This module finds such outputs from the traced values (fake tensors of one
storage share it, with their offsets and strides), so the lowering can write their base once
and return each of them as a view of it, with eager's sizes, strides and offset.

Outputs over a graph input's storage are left out (AOTAutograd rebuilds those), as are
outputs whose layout the compiler chooses (a training graph's saved values) and views that
change the dtype."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx

from .lowering.context import layout_from_meta


@dataclass(frozen=True)
class AliasGroup:
    """Outputs (their positions) that are views of ``base``'s storage."""

    base: torch.fx.Node
    members: tuple[int, ...]


def groups(outputs: Sequence[Any], skip: frozenset[int] = frozenset()) -> list[AliasGroup]:
    """The groups of graph outputs (FX nodes, or constants) to return as views of their base:
    two or more outputs over one storage, or one output with a zero stride over a dim of more
    than one element; each group's members reach one base node through view ops, whose value
    is dense, starts its storage and has their dtype. ``skip``: positions to leave alone."""
    graph = next((n.graph for n in outputs if isinstance(n, torch.fx.Node)), None)
    inputs = {_storage(m) for n in (graph.find_nodes(op="placeholder") if graph is not None else ())
              if (m := _meta(n)) is not None}
    by_storage: dict[int, list[int]] = {}
    for i, node in enumerate(outputs):
        meta = _meta(node)
        if meta is not None and i not in skip and _storage(meta) not in inputs:
            by_storage.setdefault(_storage(meta), []).append(i)
    found = []
    for key, members in by_storage.items():
        if len(members) < 2 and not _expanded(_meta(outputs[members[0]])):
            continue
        bases = {_view_base(outputs[i]) for i in members}
        if len(bases) != 1:
            continue
        base = bases.pop()
        meta = _meta(base)
        if meta is None or base.op != "call_function" or _storage(meta) != key or \
                meta.storage_offset() != 0 or layout_from_meta(meta) is None:
            continue
        same = tuple(i for i in members if _meta(outputs[i]).dtype == meta.dtype)
        if len(same) >= 2 or any(_expanded(_meta(outputs[i])) for i in same):
            found.append(AliasGroup(base, same))
    return found


def _meta(node: Any) -> torch.Tensor | None:
    meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return meta if isinstance(meta, torch.Tensor) else None


def _storage(meta: torch.Tensor) -> int:
    return meta.untyped_storage()._cdata


def _expanded(meta: torch.Tensor) -> bool:
    return any(st == 0 and n != 1 for n, st in zip(meta.size(), meta.stride()))


def _is_view(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.is_view


def _view_base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose value ``node`` views, through view ops and the items of multi-output
    views (``unbind``, ``split``); ``node`` itself when it is no view."""
    while node.op == "call_function":
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
                and _is_view(node.args[0].target):
            node = node.args[0]
        if _is_view(node.target) and node.args and isinstance(node.args[0], torch.fx.Node):
            node = node.args[0]
            continue
        break
    return node
