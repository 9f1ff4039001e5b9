"""Graphs holding what Coil's buffers cannot follow run in eager, and the report says why.

- ``p.data = p.data - lr * p.grad`` (manual SGD, weight clipping, EMA updates) reaches the
  backend as ``aten.set_(p, new)``: afterwards ``p`` *is* ``new``'s storage. Coil's buffers
  are planned as values written into storage the wrapper owns, and the wrapper dropped the
  call, so the parameter kept its old value and training silently stalled.
- A random op inside ``torch.utils.checkpoint`` puts the RNG-state higher-order ops
  (``run_and_save_rng_state`` in the forward, ``run_with_rng_state`` in the backward;
  ``graphsafe_run_with_rng_state`` in both where the partitioner makes CUDA graphs safe) into
  the graph, whose results Coil's fallback could not take apart (a ``TypeError`` at compile).

Both found by a hunt against eager (session 31). Such graphs are rare and small; they run as
AOTAutograd traced them.

A graph that writes into anything while an input's elements share memory (``as_strided``
with overlapping rows) runs as Dynamo captured it, before AOTAutograd: eager's later reads
see a write through every alias, where the functional graph (and Coil's buffers) hold the
written values once (``x[:, 0].fill_(7); x.sum(1)`` summed other values; a hunt against
eager, session 33). :func:`overlapping_input` finds such an input."""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from .dynamo_ops import has_effects


def _targets() -> dict[Any, str]:
    found: dict[Any, str] = {torch.ops.aten.set_: "the graph swaps a tensor's storage (`.data =`)"}
    for name in ("run_and_save_rng_state", "run_with_rng_state", "graphsafe_run_with_rng_state"):
        op = getattr(torch.ops.higher_order, name, None)
        if op is not None:
            found[op] = "a random op under activation checkpointing (RNG-state higher-order op)"
    return found


_TARGETS = _targets()


def eager_only(gm: torch.fx.GraphModule) -> tuple[str, str] | None:
    """(the op, why) for the first node of ``gm`` that Coil leaves to eager, or None."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        key = getattr(node.target, "overloadpacket", node.target)
        if key in _TARGETS:
            return str(node.target), _TARGETS[key]
    return None


def overlapping_input(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Why ``gm`` must run as captured: it may write into a tensor (an in-place op, ``out=``)
    while one of its inputs holds elements that share memory; else None."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    overlapping = [(i, _value(node)) for i, (node, t) in enumerate(zip(placeholders, example_inputs))
                   if isinstance(t, torch.Tensor) and _may_overlap(t)]
    if not overlapping:
        return None
    # the inputs' storages as the graph's example values hold them (None: not known)
    storages = {StorageWeakRef(v.untyped_storage()) if isinstance(v, torch.Tensor) else None: i
                for i, v in overlapping}
    for node in gm.graph.nodes:
        written = _written(node)
        if written is None:
            continue
        value = _value(written) if isinstance(written, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or None in storages:
            return f"the graph writes into a tensor it may not tell apart from input {overlapping[0][0]}, " \
                   "whose elements share memory"
        index = storages.get(StorageWeakRef(value.untyped_storage()))
        if index is not None:
            return f"the graph writes into input {index}, whose elements share memory"
    return None


def _value(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _written(node: torch.fx.Node) -> Any:
    """What an in-place op or ``out=`` writes into (None for other nodes; a mode switch has
    effects too but writes nothing)."""
    if node.op not in ("call_function", "call_method") or not has_effects(node):
        return None
    if node.op == "call_function" and node.target in torch.fx.node._side_effectful_functions:
        return None
    if "out" in node.kwargs:
        return node.kwargs["out"]
    return node.args[0] if node.args else node


def _may_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory: its dims of more than one element, by
    stride, each step past the extent of the smaller ones (sizes read at their hints where
    symbolic; none: assume the worst)."""
    try:
        if any(_hint(sz) == 0 for sz in t.shape):
            return False  # no elements
        dims = sorted((_hint(st), _hint(sz)) for sz, st in zip(t.shape, t.stride()) if _hint(sz) > 1)
    except ValueError:
        return True
    extent = 0
    for stride, size in dims:
        if stride <= extent:
            return True
        extent += stride * (size - 1)
    return False


def _hint(n: Any) -> int:
    if isinstance(n, torch.SymInt):
        hint = n.node.hint
        if hint is None:
            raise ValueError("a size without a hint")
        return int(hint)
    return int(n)
