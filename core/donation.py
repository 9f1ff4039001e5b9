"""Donated inputs: the saved activations of a backward graph whose memory the graph may take
over once it has read them for the last time.

A backward graph's inputs include the tensors its forward saved. AOTAutograd lists, in
``fw_metadata.bw_donated_idxs`` of the graph's tracing context, those that alias no input or
output of the forward nor any gradient the backward returns; when it calls the compiled
backward it has dropped its own references (``ctx.maybe_clear_saved_tensors``) and hands the
argument list over (the boxed call), so the wrapper holds them alone. A backward called with
``retain_graph=True`` or ``create_graph=True`` compiles without donations (or fails with
torch's own error when the graph was compiled with them), and
``torch._functorch.config.donated_buffer = False`` turns the list off for every compiler.

Without this the memory planner never takes over a graph input, so a backward wrote each new
value into fresh memory while saved tensors it had finished with were still held for a later
taker that could not come: DeiT-tiny's backward starts with the final layer norm's gradient,
a float32 tensor of batch x tokens x width allocated while the norm's float32 input (the
same size, read for the last time in that kernel) was still alive (+7.5 MiB at the top of
the training peak on the H200, batch 64; Inductor writes that gradient over the saved input).

Coil is stricter than the list, per input, on the graph's example tensors: a donated input
must have static sizes, start at its storage's first element and cover its storage exactly
(non-overlapping and dense), share its storage with no other input, and not be written by
the graph (an input mutation). The wrapper checks each input's strides on every call of a
backward graph and copies a tensor that arrives in another layout (``restride``), so what a
later buffer takes over is always the input's own span."""
from __future__ import annotations

import collections
from typing import Any, Sequence

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch.multiprocessing.reductions import StorageWeakRef

from .config import Config


def donated_positions(kind: str, example_inputs: Sequence[Any], config: Config) -> tuple[int, ...]:
    """Positions of the inputs of the graph being compiled whose memory it may take over
    after their last use; empty for forward and inference graphs."""
    if kind != "backward" or config.graph_capture == "on":
        return ()
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    listed = getattr(metadata, "bw_donated_idxs", None)
    if not listed:
        return ()
    storages = collections.Counter(_storage(t) for t in example_inputs if isinstance(t, torch.Tensor))
    return tuple(i for i in sorted(set(listed))
                 if 0 <= i < len(example_inputs) and _owns_its_storage(example_inputs[i], storages))


def _storage(t: torch.Tensor) -> Any:
    return StorageWeakRef(t.untyped_storage())


def _owns_its_storage(t: Any, storages: collections.Counter) -> bool:
    if not isinstance(t, torch.Tensor) or t.is_sparse or t.numel() == 0:
        return False
    dims = [*t.size(), *t.stride(), t.storage_offset()]
    if any(isinstance(d, torch.SymInt) for d in dims) or t.storage_offset() != 0:
        return False
    if not is_non_overlapping_and_dense(t) or storages[_storage(t)] != 1:
        return False
    nbytes = t.untyped_storage().nbytes()
    return not isinstance(nbytes, torch.SymInt) and nbytes == t.numel() * t.element_size()

