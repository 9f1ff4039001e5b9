"""Joint graphs with embeddings partitioned both ways, the smaller saved set kept.

AOTAutograd's min-cut partitioner may recompute an ``aten.index`` in the backward but never an
``aten.embedding``: only the first is on its list of recomputable ops, although both are the
same gather of table rows. Which form saves less differs from model to model. Kept whole, the
Qwen2-like's first residual sum is recomputed from a bf16 projection instead of being saved in
float32 (a 14 MiB block less at batch 16 on the H200); written as an index, T5-small's token
embeddings (float32, 16 and 8 MiB at batch 16) and its relative-position biases are recomputed
from the ids instead of being saved (T5's peak on the H200 was 24 MiB higher whole).

So a joint graph whose forward looks rows up with ``aten.embedding`` is partitioned twice: as
traced, and with every such lookup written as ``aten.index`` of its table, unless no lookup
could be recomputed in that form either (an output under a quarter of the table's bytes,
which the partitioner never recomputes) or one is sparse. The partition whose saved values
(the forward's outputs that only the backward reads) take fewer bytes is kept;
the lifetime of a parameter or buffer is the caller's, so saving one costs nothing. A tie
keeps the traced form. The embedding's backward (``embedding_dense_backward``) reads the ids,
not the forward's lookup, so either form differentiates alike."""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch._functorch import config as functorch_config

log = logging.getLogger(__name__)
aten = torch.ops.aten

Partition = Callable[..., "tuple[torch.fx.GraphModule, torch.fx.GraphModule]"]


def _lookups(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is aten.embedding.default]


def _bytes(node: Any) -> int | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    numel = val.numel() if isinstance(val, torch.Tensor) else None
    return numel * val.element_size() if isinstance(numel, int) else None


def _sparse(lookup: torch.fx.Node) -> bool:
    return (len(lookup.args) > 4 and lookup.args[4] is True) or lookup.kwargs.get("sparse") is True


def _recomputable(lookup: torch.fx.Node) -> bool:
    """Whether the partitioner could recompute ``lookup`` written as an index: it never
    recomputes an op whose output is under a quarter of its node arguments
    (``ban_recompute_reductions``; the index's ids come in a list, so the table alone), as a
    lookup of a few tokens in a large table is (GPT-2 at 8192 tokens: 50257 rows). A sparse
    lookup is never rewritten (:func:`as_index`)."""
    out, table = _bytes(lookup), _bytes(lookup.args[0])
    if out is None or table is None:
        return False
    return not (functorch_config.ban_recompute_reductions and 4 * out < table)


def as_index(joint: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of ``joint`` with each ``aten.embedding`` written as ``aten.index`` of its table,
    or None when it has none the partitioner could recompute in that form (then the copy would
    partition much as ``joint`` does, at the cost of a copy and a second partition: 0.6 s of
    the zoo's small T5 on the 2-core CPU). ``joint`` itself is not changed."""
    lookups = _lookups(joint.graph)
    if not any(_recomputable(n) for n in lookups) or any(_sparse(n) for n in lookups):
        return None
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(joint.graph, env)
    graph.output(out)
    for node in _lookups(graph):
        weight, ids = node.args[0], node.args[1]
        with graph.inserting_before(node):
            gather = graph.call_function(aten.index.Tensor, (weight, [ids]))
        gather.meta = dict(node.meta)
        node.replace_all_uses_with(gather)
        graph.erase_node(node)
    return torch.fx.GraphModule(joint, graph)


def saved_bytes(fw: torch.fx.GraphModule, num_fwd_outputs: int, static: set[int]) -> int | None:
    """Bytes of the tensors ``fw`` saves for the backward, each counted once, less the inputs
    at ``static`` (parameters and buffers: kept alive by their module anyway); None when a
    saved tensor's size is symbolic."""
    inputs = [n for n in fw.graph.nodes if n.op == "placeholder"]
    free = {inputs[i] for i in static if i < len(inputs)}
    output = next(n for n in fw.graph.nodes if n.op == "output")
    total, seen = 0, set()
    for value in output.args[0][num_fwd_outputs:]:
        if not isinstance(value, torch.fx.Node) or value in free or value in seen:
            continue
        seen.add(value)
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            numel = val.numel()
            if not isinstance(numel, int):
                return None
            total += numel * val.element_size()
    return total


def partition_smaller(base: Partition, joint: torch.fx.GraphModule, *args: Any,
                      **kwargs: Any) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """``base``'s partition of ``joint``, or of its lookups-as-index copy where that one saves
    fewer bytes."""
    num_fwd_outputs = kwargs.get("num_fwd_outputs")
    other = as_index(joint) if isinstance(num_fwd_outputs, int) else None
    if other is None:
        return base(joint, *args, **kwargs)
    static = set(kwargs.get("static_lifetime_input_indices") or ())
    alternative = base(other, *args, **kwargs)  # first: the partitioner marks the graph it reads
    traced = base(joint, *args, **kwargs)
    whole = saved_bytes(traced[0], num_fwd_outputs, static)
    gathered = saved_bytes(alternative[0], num_fwd_outputs, static)
    log.debug("coil: with embeddings whole the forward saves %s bytes, as index %s", whole, gathered)
    if whole is None or gathered is None:
        return traced
    return alternative if gathered < whole else traced
