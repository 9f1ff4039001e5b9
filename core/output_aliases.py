"""Graph outputs that eager returns as views of one storage.

Eager's ``y = x * 2; return y, y[1:]`` returns two tensors over one storage: a later
``y.add_(1)`` shows through the slice. ``x.mean(0, keepdim=True).expand_as(x)`` returns a
tensor with a zero stride, which an in-place op refuses to write. Coil writes each output into
a buffer of its own unless told otherwise, which loses both: the slice stops following ``y``,
and the expanded output becomes a dense copy that accepts the write (and costs the memory of
its full size). This module finds such outputs from the traced values (fake tensors of one
storage share it, with their offsets and strides), so the lowering can write their base once
and return each of them as a view of it, with eager's sizes, strides and offset.

Outputs over a graph input's storage are left out of those groups, as are outputs whose
layout the compiler chooses (a training graph's saved values) and views that change the
dtype. Outputs that are views of a graph input are returned as views of its buffer
(:func:`input_views`): AOTAutograd rebuilds them from the input with the strides and offset
it gets back where it cannot replay the views (symbolic ones), and a compact copy pointed at
the input's first rows (found by a hunt against eager, session 31)."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx

from .errors import LoweringError
from .ir import Expr, Layout
from .lowering.context import layout_from_meta
from .lowering.values import to_sympy

aten = torch.ops.aten


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
        bases = {view_base(outputs[i]) for i in members}
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


def view_base(node: torch.fx.Node) -> torch.fx.Node:
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


def input_views(graph: torch.fx.Graph, outputs: Sequence[Any], names: dict[torch.fx.Node, str],
                skip: set[int] | frozenset[int]) -> dict[int, tuple[str, Layout]]:
    """Position -> (input buffer name, layout) for outputs eager returns as views of a graph
    input (``names``: placeholder -> its buffer): a view of the input itself, or a view of the
    value the graph writes back into a mutated input (``x.add_(1); return x[n:]`` traces as
    a slice of ``add`` and ``copy_(x, add)``), with the traced sizes, strides and offset."""
    written: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph.find_nodes(op="call_function", target=aten.copy_.default):
        dst, src = node.args[0], node.args[1]
        if isinstance(dst, torch.fx.Node) and dst in names and isinstance(src, torch.fx.Node):
            written.setdefault(src, dst)
    by_storage: dict[int, torch.fx.Node] = {}
    for node in names:
        if (meta := _meta(node)) is not None:
            by_storage.setdefault(_storage(meta), node)
    views: dict[int, tuple[str, Layout]] = {}
    for i, node in enumerate(outputs):
        meta = _meta(node)
        if meta is None or i in skip:
            continue
        # the wrapper views a buffer at an offset from the buffer's own start
        placeholder = by_storage.get(_storage(meta))
        if placeholder is not None:
            offset = to_sympy(meta.storage_offset()) - to_sympy(_meta(placeholder).storage_offset())
        else:
            source = view_base(node)
            placeholder = written.get(source)
            if placeholder is None:
                continue
            into, traced = _meta(placeholder), _meta(source)
            if into is None or traced is None or _sizes(into.size()) != _sizes(traced.size()) or \
                    _sizes(into.stride()) != _sizes(traced.stride()) or traced.storage_offset() != 0:
                if _static(meta):
                    continue  # AOTAutograd replays a view of static sizes on the input itself
                raise LoweringError("output", "a view of a mutated input, in a layout other than the input's")
            offset = to_sympy(meta.storage_offset())
        if meta.dtype != _meta(placeholder).dtype:
            continue
        views[i] = (names[placeholder], Layout(meta.dtype, meta.device, _sizes(meta.size()), _sizes(meta.stride()),
                                               offset))
    return views


def _static(meta: torch.Tensor) -> bool:
    return all(isinstance(v, int) for v in (*meta.size(), *meta.stride(), meta.storage_offset()))


def _sizes(values: Any) -> tuple[Expr, ...]:
    return tuple(to_sympy(v) for v in values)
