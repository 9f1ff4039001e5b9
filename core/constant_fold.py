"""Constants of a frozen graph (:mod:`coil.freezing`): what depends on frozen parameters alone
is computed once, at compile time.

A frozen parameter is a ``get_attr`` node whose tensor is the parameter itself; each such node
and each value computed from them carries the input positions it derives from
(``node.meta[ORIGIN]``), so that the compiled graph can check, call by call, that none of those
parameters changed (:func:`coil.freezing.guarded`). Only deterministic, non-mutating ``aten``
and ``prims`` ops are evaluated, and only over values that derive from a frozen parameter:
constants the graph builds by itself (masks from ``arange``, say) are left for the passes that
recognise them. A value that is only a view of a parameter stays in the graph (a transpose
read by a matrix product costs nothing), and a computed value larger than its inputs together
(a broadcast) is not stored either."""
from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: ``node.meta`` key: the graph input positions a constant derives from.
ORIGIN = "coil_frozen_from"

#: Ops whose result is not a function of their arguments' values.
_UNINITIALISED = frozenset({aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
                            aten.new_empty_strided})


#: Ops whose result may outnumber their inputs without being a broadcast: each element is
#: read from a table (Swin's relative-position bias, a [49, H] table gathered to [H, 16, 16]
#: by a [16, 16] index, was gathered again in every attention's softmax kernel).
_GATHERS = frozenset({aten.index, aten._unsafe_index, aten.index_select, aten.gather, aten.embedding,
                      aten.take})
#: The most elements a gather larger than its inputs is stored with (a table gathered by
#: broadcast indices could hold far more than either).
GATHER_LIMIT = 1 << 22


def foldable(target: Any) -> bool:
    """Whether ``target`` may run at compile time: a pure, deterministic ATen or prims op."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace not in ("aten", "prims"):
        return False
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    return target.overloadpacket not in _UNINITIALISED


def value_of(gm: torch.fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The tensor a constant node holds (a ``get_attr`` carrying :data:`ORIGIN`, or a view of
    constants that :func:`fold_constants` left in the graph); None for anything else."""
    if not isinstance(node, torch.fx.Node) or ORIGIN not in node.meta:
        return None
    if node.op == "get_attr":
        value = getattr(gm, str(node.target), None)
        return value if isinstance(value, torch.Tensor) else None
    if node.op != "call_function" or not foldable(node.target):
        return None
    inputs = {i: value_of(gm, i) for i in node.all_input_nodes}
    if any(v is None for v in inputs.values()):
        return None
    value = node.target(*torch.fx.node.map_arg(node.args, inputs.__getitem__),
                        **torch.fx.node.map_arg(node.kwargs, inputs.__getitem__))
    return value if isinstance(value, torch.Tensor) else None


def add_constant(gm: torch.fx.GraphModule, value: torch.Tensor, origin: frozenset[int],
                 before: torch.fx.Node) -> torch.fx.Node:
    """A new ``get_attr`` node holding ``value``, inserted before ``before``."""
    index = 0
    while hasattr(gm, f"_coil_frozen{index}"):
        index += 1
    name = f"_coil_frozen{index}"
    gm.register_buffer(name, value, persistent=False)
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(name)
    node.meta[ORIGIN] = origin
    node.meta["val"] = fake_of(gm, value)
    return node


def fake_of(gm: torch.fx.GraphModule, value: torch.Tensor) -> torch.Tensor:
    """``value`` as the fake mode of ``gm``'s inputs sees it (the ``meta["val"]`` later passes
    propagate through), or ``value`` itself where the graph has none."""
    example = next((n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")
                    if isinstance(n.meta.get("val"), torch.Tensor)), None)
    fake_mode = torch._guards.detect_fake_mode([example] if example is not None else [])
    return fake_mode.from_tensor(value, static_shapes=True) if fake_mode is not None else value


def fold_constants(gm: torch.fx.GraphModule) -> int:
    """Evaluate every op over frozen constants alone and store each result that a
    non-constant op reads as a new constant; returns how many ops were evaluated."""
    graph = gm.graph
    values: dict[torch.fx.Node, torch.Tensor] = {}
    computed: set[torch.fx.Node] = set()  # derives through at least one non-view op
    for node in graph.nodes:
        value = value_of(gm, node)
        if value is not None:
            values[node] = value
    evaluated = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not foldable(node.target):
            continue
        inputs = node.all_input_nodes
        if not inputs or not all(i in values for i in inputs):
            continue
        try:
            out = node.target(*torch.fx.node.map_arg(node.args, values.__getitem__),
                              **torch.fx.node.map_arg(node.kwargs, values.__getitem__))
        except Exception as exc:  # noqa: BLE001 - left in the graph, computed at run time
            log.debug("not folded: %s (%s)", node.format_node(), exc)
            continue
        if not isinstance(out, torch.Tensor):
            continue
        is_view = bool(getattr(node.target, "is_view", False))
        gather = node.target.overloadpacket in _GATHERS and out.numel() <= GATHER_LIMIT
        if not is_view and not gather and out.numel() > sum(values[i].numel() for i in inputs):
            continue  # a broadcast: computed where it is read, not stored
        values[node] = out
        node.meta[ORIGIN] = frozenset().union(*(i.meta[ORIGIN] for i in inputs))
        if not is_view or any(i in computed for i in inputs):
            computed.add(node)
        evaluated += 1
    for node in computed:
        if all(u in values for u in node.users):
            continue  # read only by other constants
        value = values[node]
        if value.storage_offset() != 0:
            value = value.clone()
        constant = add_constant(gm, value, node.meta[ORIGIN], node)
        node.replace_all_uses_with(constant)
        _fresh_outputs(graph, constant, node)
    graph.eliminate_dead_code()
    gm.recompile()
    return evaluated


def _fresh_outputs(graph: torch.fx.Graph, constant: torch.fx.Node, node: torch.fx.Node) -> None:
    """A folded constant the graph returns is returned as a copy, made at each call, as eager
    computes a new tensor: the constant itself came back from every call, so a write into one
    result (``pos += x`` after a graph break, ``out.zero_()``) changed every later one (a hunt,
    session 37)."""
    outputs = [u for u in constant.users if u.op == "output"]
    if not outputs:
        return
    with graph.inserting_before(outputs[0]):
        fresh = graph.call_function(aten.clone.default, (constant,))
    fresh.meta["val"] = node.meta.get("val")
    for out in outputs:
        out.replace_input_with(constant, fresh)
