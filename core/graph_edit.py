"""Adding ATen calls to an FX graph in a graph pass, each with the fake result that lowering
reads from ``node.meta["val"]`` (computed in the graph's fake mode) and the stack trace of
the node it replaces."""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.fx


def caller(graph: torch.fx.Graph, replaced: torch.fx.Node) -> Callable[[object, tuple], torch.fx.Node]:
    """``call(target, args)``: a new ``call_function`` node at the graph's insertion point,
    its ``meta["val"]`` computed from its arguments' fake values; for a pass that replaces
    ``replaced``."""
    fake = torch._guards.detect_fake_mode([replaced.meta["val"]])

    def call(target: object, args: tuple) -> torch.fx.Node:
        new = graph.call_function(target, args)  # type: ignore[arg-type]
        values = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
        with fake:
            new.meta["val"] = target(*values)  # type: ignore[operator]
        new.meta["stack_trace"] = replaced.meta.get("stack_trace")
        return new

    return call


def settled(gm: torch.fx.GraphModule, count: int, log: logging.Logger, message: str) -> int:
    """After a pass rewrote ``count`` nodes of ``gm`` (none: nothing to do): check the graph,
    regenerate its code and log ``message % count``; returns ``count``."""
    if count:
        gm.graph.lint()
        gm.recompile()
        log.debug(message, count)
    return count
