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
AOTAutograd traced them."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx


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
