"""Unbacked symbols as dependencies between IR nodes.

A library call can define a size the graph only knows at run time: ``item()``'s scalar
(``u0``), a size of ``nonzero``'s result. The wrapper binds the symbol when the call
returns, and every later use reads that name, not a buffer. The scheduler orders steps by
the buffers they read, so a use of the symbol alone gave no order: ``x + (x > 0).nonzero()
.shape[0]`` fused the ``add`` with the ``gt`` that ``nonzero`` reads, and the kernel ran
before ``u0`` was bound (``UnboundLocalError``; a hunt, session 39). :func:`symbol_edges`
makes each use depend on the call that defines the symbol."""
from __future__ import annotations

import dataclasses
from typing import Any

import sympy
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from . import ir


def defined_symbols(node: ir.Node) -> set[str]:
    """The unbacked symbols a library call's results define: a scalar result's name, and the
    unbacked sizes of its tensor results."""
    if not isinstance(node, ir.ExternNode):
        return set()
    new = {name for name, layout in zip(node.output_names, node.output_layouts) if layout is None}
    new |= {n.name for layout in node.output_layouts if layout is not None for n in layout.size
            if isinstance(n, sympy.Symbol) and free_unbacked_symbols(n)}
    return new


def symbol_definers(nodes: list[ir.Node]) -> set[int]:
    """The library calls (by ``id``) that first define an unbacked symbol: kept even where no
    buffer of theirs is read (later steps read the symbol from the wrapper's names)."""
    defined: set[str] = set()
    definers: set[int] = set()
    for node in nodes:
        new = defined_symbols(node)
        if new - defined:
            definers.add(id(node))
            defined |= new
    return definers


def symbol_edges(nodes: list[ir.Node]) -> list[tuple[int, int]]:
    """(definer, user) index pairs: each node that uses an unbacked symbol after the node
    that first defines it, anywhere in its ranges, indices, body or arguments."""
    first: dict[str, int] = {}
    edges: list[tuple[int, int]] = []
    for i, node in enumerate(nodes):
        if first:
            for name in _unbacked_names(node, {}) & first.keys():
                edges.append((first[name], i))
        for name in defined_symbols(node):
            first.setdefault(name, i)
    return edges


def _unbacked_names(obj: Any, seen: dict[int, set[str]]) -> set[str]:
    """Names of the unbacked symbols in ``obj``: a sympy expression, or anything holding
    some (IR nodes and values, sequences, mappings); shared subtrees are walked once."""
    if isinstance(obj, sympy.Basic):
        return {s.name for s in obj.free_symbols if free_unbacked_symbols(s)}
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return set()
    key = id(obj)
    if key in seen:
        return seen[key]
    seen[key] = set()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        parts: Any = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, dict):
        parts = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        parts = list(obj)
    else:
        return set()
    found: set[str] = set()
    for part in parts:
        found |= _unbacked_names(part, seen)
    seen[key] = found
    return found
