"""Attention masks that a graph builds from constants alone, evaluated when it compiles: a
``scaled_dot_product_attention`` call loses a boolean mask that is True everywhere, and
trades a causal one for ``is_causal=True``.

Under ``torch.compile`` transformers cannot ask whether a mask may be skipped, so it builds
one from ``arange``s where eager passes none: True everywhere for a bidirectional encoder
(5.17's ``(arange(L) + 0)[None, None, :, None] >= 0``, expanded to ``(B, 1, L, S)``), the
causal triangle for a decoder (5.24 builds it from position ids, with a check for packed
sequences that is True everywhere when the positions are an ``arange``). With a mask, SDPA
on the GPU loses the flash and cuDNN kernels: AOTAutograd traces the math form, which
upcasts bf16 to float32 around a materialised score matrix (ViT-base from transformers on
the H200: two float32 GEMMs per layer, 3.9 ms of a 12 ms inference call, where eager runs
cuDNN's flash kernel in 0.5 ms).

A mask qualifies only when nothing it is computed from comes from outside the graph: no
input, parameter, buffer or module call (their values can change without a recompile), no
random op, nothing with effects, static sizes throughout, and nothing in the graph writes
to it or to a view of it. Such a mask has one value for
every call of the compiled graph, so the pass computes it once, on the graph's device, and
compares: True everywhere -> no mask (SDPA computes exactly the same); with ``L == S``, True
exactly where key ``j <= i`` for every batch and head -> ``is_causal=True`` (SDPA's causal
mask is that triangle). Any other mask stays. A mask is changed only where the call's result
keeps its shape without it."""
from __future__ import annotations

import collections
import logging
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.symbolic_shapes import is_concrete_int, statically_known_true

from .dynamo_ops import erase_unused, has_effects, value, written

log = logging.getLogger(__name__)

#: Masks changed in this process, by what they became ("none", "causal"); tests read it.
changed: collections.Counter[str] = collections.Counter()

_SDPA = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
#: positions of attn_mask, is_causal and scale in (q, k, v, attn_mask, dropout_p, is_causal, scale)
_MASK, _CAUSAL, _SCALE = 3, 5, 6
#: Masks larger than this (elements) are left alone: evaluating one costs compile time.
_MOST_ELEMENTS = 1 << 26


def simplify_masks(gm: torch.fx.GraphModule) -> int:
    """Drop or replace by ``is_causal`` the constant masks of the SDPA calls of the Dynamo
    graph ``gm`` (in place); returns how many calls changed."""
    verdicts: dict[torch.fx.Node, str | None] = {}
    dropped: list[torch.fx.Node] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        mask = _argument(node, _MASK, "attn_mask")
        if not isinstance(mask, torch.fx.Node) or _argument(node, _CAUSAL, "is_causal") or \
                not _keeps_shape_without(node, mask):
            continue
        if mask not in verdicts:
            verdicts[mask] = _verdict(mask)
        verdict = verdicts[mask]
        if verdict is None or (verdict == "causal" and not _positive_scale(node)):
            continue
        _set(node, _MASK, "attn_mask", None)
        if verdict == "causal":
            _set(node, _CAUSAL, "is_causal", True)
        changed[verdict] += 1
        dropped.append(mask)
    if dropped:
        erase_unused(gm.graph, dropped)
        gm.graph.lint()
        gm.recompile()
        log.debug("coil: %d constant attention masks replaced", len(dropped))
    return len(dropped)


def _positive_scale(call: torch.fx.Node) -> bool:
    """Whether the call's scale is SDPA's default or a positive number: with a scale <= 0,
    torch's CPU flash kernel returns NaN rows under ``is_causal`` where the same call with
    the mask is finite, so such a call keeps its mask."""
    scale = _argument(call, _SCALE, "scale")
    return scale is None or (isinstance(scale, (int, float)) and scale > 0)


def _argument(node: torch.fx.Node, position: int, name: str) -> Any:
    return node.args[position] if len(node.args) > position else node.kwargs.get(name)


def _set(node: torch.fx.Node, position: int, name: str, new: Any) -> None:
    if len(node.args) > position:
        node.args = node.args[:position] + (new,) + node.args[position + 1:]
    else:
        node.kwargs = {**node.kwargs, name: new}


def _keeps_shape_without(call: torch.fx.Node, mask: torch.fx.Node) -> bool:
    """A boolean mask, and the call's result has the shape it has without one: q, k and v's
    batch dims broadcast, then (L, Ev)."""
    if len(call.args) < 3:  # q, k, v by keyword: left alone
        return False
    fakes = [value(a) for a in call.args[:3]] + [value(mask), value(call)]
    if not all(isinstance(f, torch.Tensor) for f in fakes) or fakes[3].dtype != torch.bool:
        return False
    q, k, v, _, out = fakes
    if min(q.dim(), k.dim(), v.dim()) < 2:
        return False
    try:  # with enable_gqa, k and v have fewer heads than q: q's count
        batch = q.shape[:-2] if call.kwargs.get("enable_gqa") else torch.broadcast_shapes(
            q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        return False
    expected = (*batch, q.shape[-2], v.shape[-1])
    return out.dim() == len(expected) and all(statically_known_true(a == b) for a, b in zip(out.shape, expected))


def _verdict(mask: torch.fx.Node) -> str | None:
    """"none" (True everywhere), "causal" (the triangle ``j <= i``), or None."""
    nodes = _constant_subgraph(mask)
    if nodes is None:
        return None
    try:
        with unset_fake_temporarily(), torch.no_grad():
            result = _evaluate(nodes)[mask]
    except Exception as exc:  # noqa: BLE001 - a mask we cannot evaluate stays as it is
        log.debug("coil: attention mask %s not evaluated: %s", mask.name, exc)
        return None
    if not isinstance(result, torch.Tensor) or result.dtype != torch.bool or result.dim() < 2:
        return None
    if bool(result.all()):
        return "none"
    rows, cols = result.shape[-2:]
    if rows == cols and bool((result == torch.ones(rows, cols, dtype=torch.bool, device=result.device).tril()).all()):
        return "causal"
    return None


def _constant_subgraph(mask: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes ``mask`` is computed from, in graph order, when all of them are calls
    without effects on static sizes that read nothing from outside the graph; else None."""
    seen: set[torch.fx.Node] = set()
    pending = [mask]
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        if node.op not in ("call_function", "call_method") or has_effects(node) or _random(node):
            return None
        fake = value(node)
        if isinstance(fake, torch.Tensor):
            if not all(is_concrete_int(s) for s in fake.shape) or fake.numel() > _MOST_ELEMENTS:
                return None
        elif isinstance(fake, torch.SymInt | torch.SymFloat | torch.SymBool):
            return None
        seen.add(node)
        pending.extend(node.all_input_nodes)
    return None if written(mask.graph, seen) else [n for n in mask.graph.nodes if n in seen]


def _random(node: torch.fx.Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return any(word in name for word in ("rand", "bernoulli", "dropout", "normal", "multinomial", "uniform"))


def _evaluate(nodes: list[torch.fx.Node]) -> dict[torch.fx.Node, Any]:
    values: dict[torch.fx.Node, Any] = {}
    for node in nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
        if node.op == "call_function":
            values[node] = node.target(*args, **kwargs)
        else:
            values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
    return values
