"""A backward must not read an input that the forward writes.

AOTAutograd's joint graph writes a mutated input at the end of its forward part
(``copy_(primal, new_value)``), and the forward graph runs that write before the backward
runs. A backward that reads the primal itself, or recomputes a value from it, then reads the
new value where the forward read the old one. The partitioner does that whenever it finds
recomputing cheaper than saving: a module that counts its calls in a buffer under
``no_grad`` and scales its output by the count (``self.cnt += 1; return x * self.cnt``) got
gradients computed with the count one higher than the forward used, twice eager's at the
first step, in every backend on torch 2.13 (``aot_eager`` and Inductor too).

So after partitioning, Coil checks whether the backward graph takes a mutated input; if it
does, the joint graph reads each such input through a copy made before the write (a
``clone`` the partitioner must save, never recompute) and is partitioned again. The copy
costs a kernel and the input's size, only in graphs that had the defect."""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.fx
from torch.utils.checkpoint import CheckpointPolicy

from .graph_edit import caller, settled

log = logging.getLogger(__name__)
aten = torch.ops.aten


def mutated_primals(joint: torch.fx.GraphModule) -> set[str]:
    """Names of the joint graph's inputs that its forward writes (``copy_`` into them)."""
    return {n.args[0].name for n in joint.graph.nodes
            if n.op == "call_function" and n.target is aten.copy_.default
            and isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"}


def backward_reads(backward: torch.fx.GraphModule, names: set[str]) -> set[str]:
    """Which of ``names`` the partitioned backward graph takes as inputs."""
    return {n.name for n in backward.graph.nodes if n.op == "placeholder"} & names


def partition_safely(partition: Callable[..., Any], joint: torch.fx.GraphModule,
                     *args: Any, **kwargs: Any) -> Any:
    """``partition(joint, ...)``, again with mutated inputs read through saved copies where
    its backward took one of them."""
    mutated = mutated_primals(joint)
    result = partition(joint, *args, **kwargs)
    if not mutated:
        return result
    read = backward_reads(result[1], mutated)
    if not read:
        return result
    snapshot_inputs(joint, read)
    log.debug("coil: the backward read inputs the forward writes (%s): partitioned again with "
              "copies saved", ", ".join(sorted(read)))
    return partition(joint, *args, **kwargs)


def snapshot_inputs(joint: torch.fx.GraphModule, names: set[str]) -> int:
    """Make every reader of the inputs ``names`` but their ``copy_`` read a copy taken before
    it, which the partitioner must save; returns how many inputs."""
    graph = joint.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    done = 0
    for primal in placeholders:
        if primal.name not in names:
            continue
        with graph.inserting_after(placeholders[-1]):
            copy = caller(graph, primal)(aten.clone.default, (primal,))
        copy.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        for user in list(primal.users):
            if user is copy or (user.target is aten.copy_.default and user.args[0] is primal):
                continue
            user.replace_input_with(primal, copy)
        done += 1
    return settled(joint, done, log, "read %d mutated inputs through saved copies")
