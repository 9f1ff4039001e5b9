"""Common subexpressions out of AOTAutograd's joint graph, before the min-cut partitioner.

The partitioner's own pass (``torch._functorch.compile_utils.fx_graph_cse``) imports
``torch._inductor.pattern_matcher`` for two small helpers, and with it most of Inductor (its
lowerings, kernel templates, flex attention): about a second of every process's first
training compile, for a compiler that uses none of it. Coil runs this pass instead and hands
the partitioner the graph with ``torch._functorch.config.cse`` off.

A node is replaced by an earlier one only when both call the same ``aten`` or ``prims``
operator with equal arguments and nothing between them can have changed what they read:

* the operator has no mutable argument, is not random (``nondeterministic_seeded``: dropout,
  ``rand``, ``bernoulli``) and is not an ``empty`` (whose contents are undefined);
* no mutating call, higher-order operator or operator of another namespace (a collective, a
  custom op) lies between the two: each one starts a new region, and nothing is merged across;
* neither defines a symbol (``item()``: an unbacked size) or aliases a graph output (two
  outputs that eager returns as separate tensors stay separate);
* and the graph writes only into its inputs (a functionalized graph's input mutations): a
  graph that writes into a value it computed is left as it is, since two merged values would
  then be written through one another's names.

Arguments compare by node identity (after earlier replacements), and constants by type and
value (``1`` and ``1.0`` differ, as do ``0.0`` and ``-0.0``; a symbolic constant is never
equal to anything)."""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_NAMESPACES = ("aten", "prims")
_PLAIN = (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Replace each repeated pure computation in ``gm`` by its first occurrence; returns how
    many nodes were removed."""
    graph = gm.graph
    if _writes_intermediates(graph):
        return 0  # merged values could be written through one another's names: leave it as is
    keep_apart = _aliases_of_outputs(graph)
    seen: dict[Any, torch.fx.Node] = {}
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        kind = _kind(node)
        if kind == "barrier":
            seen.clear()
            continue
        if kind != "pure" or node in keep_apart or _defines_symbol(node):
            continue
        key = _key(node)
        if key is None:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            removed += 1
    if removed:
        gm.recompile()
    return removed


def _kind(node: torch.fx.Node) -> str:
    """``pure`` (may be merged), ``other`` (left alone) or ``barrier`` (may change state:
    nothing is merged across it)."""
    target = node.target
    if target is operator.getitem:
        return "pure"
    if isinstance(target, torch._ops.OpOverload):
        if target.namespace not in _NAMESPACES or target._schema.is_mutable:
            return "barrier"
        name = target._schema.name.split("::")[-1]
        if torch.Tag.nondeterministic_seeded in target.tags or name.startswith(("empty", "new_empty")):
            return "other"
        return "pure"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return "barrier"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return "barrier"  # an overload not resolved: its schema is unknown here
    return "other"  # Python callables on sizes (operator.mul, sym_max): pure, but not worth keys


def _writes_intermediates(graph: torch.fx.Graph) -> bool:
    """Whether a call writes into a value computed in the graph rather than into a graph input.
    A functionalized joint graph writes only into its inputs (input mutations, at the end);
    anything else could write into a value that a merge made stand for two."""
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        if not target._schema.is_mutable:
            continue
        for i, arg in enumerate(target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, torch.fx.Node) and v.op != "placeholder" for v in values):
                return True
    return False


def _defines_symbol(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _aliases_of_outputs(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    storages = {s for s in map(_storage, output.all_input_nodes) if s is not None}
    return {n for n in graph.nodes if _storage(n) in storages}


def _storage(node: torch.fx.Node) -> Any:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())
    except (NotImplementedError, RuntimeError):  # a tensor without storage (sparse, subclass)
        return None


class _Unkeyable(Exception):
    pass


def _key(node: torch.fx.Node) -> Any:
    try:
        return (node.target, _freeze(node.args), _freeze(tuple(sorted(node.kwargs.items()))))
    except _Unkeyable:
        return None


def _freeze(value: Any) -> Any:
    """A hashable stand-in for an argument, equal only for arguments that are the same."""
    if isinstance(value, torch.fx.Node):
        return ("node", value)
    if isinstance(value, float):
        return (float, repr(value))  # -0.0 and 0.0 differ; nan equals nan
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_freeze(v) for v in value))
    raise _Unkeyable  # symbolic numbers, tensors, anything else: never merged
