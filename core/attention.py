"""Hand-written attention as one ``scaled_dot_product_attention`` call.

Many models still spell attention out: ``softmax(q @ k.transpose(-2, -1) * scale + mask) @ v``,
which Coil would run as two batched matmuls around a materialised score matrix (on the H200,
8x16x2048x64 fp16: 1.18 ms against 0.31 ms for a fused attention kernel). This pass finds the
chain in the Dynamo graph (torch-level ops, before AOTAutograd: inference and training both
get it, the backward is SDPA's own) and replaces it by ``F.scaled_dot_product_attention``
where the two compute the same thing:

* the chain ``matmul(q, kT)`` -> scales by compile-time constants -> masks ->
  ``softmax`` over the last dim -> dropout that is the identity (``training=False`` or
  ``p=0``: SDPA's random numbers are not eager's) -> ``matmul(probabilities, v)``, with dtype
  casts anywhere before the last matmul; ``kT`` transposes its source's last two dims;
* every intermediate value (scores, probabilities) is used by the next step only, and
  nothing between the first and the last matmul mutates a tensor or changes autocast or
  grad mode (the call reads q, k and the mask where the last matmul was);
* dtypes: the first and the last matmul give the same dtype D (under autocast, the one it
  casts to) and every intermediate is D or, for 16-bit D, float32. The call runs on q, k, v
  cast to D, so it returns D with autocast on or off. SDPA keeps scores and softmax in
  float32 internally and rounds the probabilities to D before multiplying by v, as eager
  does after ``softmax(x.float()).to(D)``: never less precise than the chain;
* masks (:mod:`coil.attention_masks`): a fill of -inf becomes a bool ``attn_mask``, one
  proven causal ``is_causal=True``, a fill of ``finfo.min`` and additive masks one additive
  mask.

Rows in which every key is masked are the delicate ones. Forward: a -inf fill gives NaN in
eager and in the call (``attn_mask_and_keys``); a ``finfo.min`` fill or mask the uniform
average in both. Backward, from such a row's output: ``masked_fill`` passes no gradient to
the scores, an additive mask passes it with uniform weights, SDPA's backward (which
recomputes the weights from a log-sum-exp that ``finfo.min`` swallows) with weights of 1. So
a chain whose output needs gradients is rewritten only where no row can be filled fully with
a finite value (``attention_masks.check_gradients``: -inf fills, causal masks, additive masks
built from parameters and numbers of magnitude at most ``SMALL_MASK_VALUE``); Hugging
Face's ``(1 - mask) * finfo.min`` and masks the graph receives are rewritten in inference
only. One difference stays: with a -inf fill, a fully masked row's NaN reaches eager's
gradients (v's whole gradient is NaN) and not SDPA's, whose gradients stay finite.

:data:`rewrites` counts the rewritten chains by mask kind, for tests and ``coil.explain``
readers; the ``attention_rewrite`` knob turns the pass off."""
from __future__ import annotations

import collections
import math
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .attention_masks import Mask, Refused, attn_mask_and_keys, check_gradients, check_order, kind_of, read_mask
from .dynamo_ops import (Call, Emitter, canonical, constant, erase_unused, has_effects, permutation,
                         same_shape, value)

log = logging.getLogger(__name__)

#: Chains rewritten in this process, by mask kind ("none", "causal", "bool", "additive").
rewrites: collections.Counter[str] = collections.Counter()

#: The dtypes an intermediate value may take when the matmuls run in D.
_PRECISE_ENOUGH = {
    torch.float16: (torch.float16, torch.float32),
    torch.bfloat16: (torch.bfloat16, torch.float32),
    torch.float32: (torch.float32,),
    torch.float64: (torch.float64,),
}


@dataclass
class _Chain:
    """What the walk from the first matmul found."""

    nodes: list[torch.fx.Node] = field(default_factory=list)  # first matmul .. last matmul
    scale: Any = 1.0  # a float, or None for SDPA's default 1/sqrt(E)
    masks: list[Mask] = field(default_factory=list)
    past_softmax: bool = False
    leftovers: list[Any] = field(default_factory=list)  # nodes that may die with the chain


def rewrite_attention(gm: torch.fx.GraphModule) -> int:
    """Replace each hand-written attention of the Dynamo graph ``gm`` (in place) by a
    ``scaled_dot_product_attention`` call; returns how many."""
    count = 0
    erased: set[torch.fx.Node] = set()
    for node in list(gm.graph.nodes):
        call = canonical(node)
        if node in erased or call is None or call.op != "matmul" or _transposed(call["other"]) is None:
            continue
        try:
            chain = _walk(call)
            erased |= _rewrite(gm.graph, call, chain)
        except Refused as why:
            if _softmax_follows(node):  # an attention-like chain: say why it stays
                log.debug("attention at %s not rewritten: %s", _where(node), why)
            continue
        rewrites[kind_of(chain.masks)] += 1
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _where(node: torch.fx.Node) -> str:
    """The user's source line of ``node``: ``File "m.py", line 7, in forward: <code>``."""
    lines = (node.meta.get("stack_trace") or "").strip().splitlines()
    files = [i for i, line in enumerate(lines) if line.strip().startswith("File ")]
    if not files or files[-1] + 1 >= len(lines):
        return node.name
    return f"{lines[files[-1]].strip()}: {lines[files[-1] + 1].strip()}"


def _softmax_follows(node: torch.fx.Node, depth: int = 6) -> bool:
    """Whether a softmax reads ``node`` within a few steps (the chain looks like attention)."""
    frontier = [node]
    for _ in range(depth):
        frontier = [user for n in frontier for user in n.users][:32]
        if any(getattr(canonical(n), "op", None) == "softmax" for n in frontier):
            return True
    return False


def _transposed(kt: Any) -> tuple[torch.fx.Node, tuple[int, ...]] | None:
    """``(source, perm)`` when ``kt`` is ``source`` with dims reordered so that
    ``kt == source.permute(perm).transpose(-2, -1)``; None when ``kt`` is no transposing op."""
    call = canonical(kt)
    perm = permutation(call) if call is not None else None
    if perm is None or len(perm) < 2 or not isinstance(call["input"], torch.fx.Node):
        return None
    perm = perm[:-2] + (perm[-1], perm[-2])
    return call["input"], perm


# ----------------------------------------------------------------------------- the walk


def _walk(first: Call) -> _Chain:
    """Follow the single users of ``first`` to the matmul with v (:class:`Refused` otherwise)."""
    chain = _Chain(nodes=[first.node])
    dtype_readers: list[torch.fx.Node] = []
    node = first.node
    while True:
        readers = [u for u in node.users if _reads_dtype_only(u, node)]
        users = [u for u in node.users if u not in readers]
        if len(users) != 1:
            raise Refused(f"{node.name} has {len(users)} users (scores or weights read elsewhere)")
        dtype_readers += readers
        call = canonical(users[0])
        if call is None or not isinstance(value(call.node), torch.Tensor):
            raise Refused(f"{users[0].name} ({users[0].target}) is no attention step")
        chain.nodes.append(call.node)
        if _step(call, node, chain):
            break
        node = call.node
    if any(reader not in chain.nodes for reader in dtype_readers):
        raise Refused("an intermediate value's dtype is read outside the chain")
    return chain


def _reads_dtype_only(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    """``x.type_as(node)``, ``x.to(node)``: a cast that reads ``node``'s dtype, not its values
    (T5's ``softmax(s.float()).type_as(s)``)."""
    call = canonical(user)
    return call is not None and call.op == "cast" and call["input"] is not node


def _step(call: Call, chain_input: torch.fx.Node, chain: _Chain) -> bool:
    """Account for one step after ``chain_input``; True at the final matmul."""
    before = not chain.past_softmax
    if call.op == "matmul" and call["input"] is chain_input and call["other"] is not chain_input:
        if before:
            raise Refused("a second matmul before any softmax")
        return True
    if call.op == "cast" and _only_dtype_changes(chain_input, call.node):
        return False
    if call.op == "softmax" and call["input"] is chain_input and before:
        ndim = value(chain_input).dim()
        if not isinstance(call["dim"], int) or call["dim"] % ndim != ndim - 1:
            raise Refused(f"softmax over dim {call['dim']}, not the last")
        chain.past_softmax = True
        return False
    if call.op == "dropout" and call["input"] is chain_input and not before:
        training = call["training"] if "training" in call.args else call["train"]
        if training is not False and constant(call["p"]) != 0.0:
            raise Refused("dropout with p > 0 in training (SDPA's random numbers differ from eager's)")
        return False
    if before and call.op in ("mul", "div"):
        _scale(call, chain_input, chain)
        return False
    if before and call.op in ("add", "masked_fill", "where"):
        mask, read = read_mask(call, chain_input)
        check_order(chain.masks, mask)
        chain.masks.append(mask)
        chain.leftovers += read
        return False
    raise Refused(f"{call.node.name} ({call.op}) is no attention step here")


def _only_dtype_changes(before: torch.fx.Node, after: torch.fx.Node) -> bool:
    a, b = value(before), value(after)
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device == b.device
            and same_shape(a, b) and b.is_floating_point())


def _scale(call: Call, chain_input: torch.fx.Node, chain: _Chain) -> None:
    if chain.masks:
        raise Refused("scores scaled after a mask")
    operands = [call["input"], call["other"]]
    if call.op == "div" and (operands[0] is not chain_input or call["rounding_mode"] is not None):
        raise Refused("not a division of the scores")
    if chain_input not in operands or operands[0] is operands[1]:
        raise Refused("scores multiplied by themselves")
    _same_dtype(chain_input, call.node)
    factor_arg = operands[1] if operands[0] is chain_input else operands[0]
    factor = constant(factor_arg)
    if chain.scale is None or (factor is None and chain.scale != 1.0):
        raise Refused("scaled twice, once symbolically")
    if factor is None:
        _default_scale(call, factor_arg, chain)
        return
    if not math.isfinite(factor):
        raise Refused(f"scores scaled by {factor}")
    if call.op == "div":
        if factor == 0.0:
            raise Refused("division by zero")
        factor = 1.0 / factor
    chain.scale *= factor


def _default_scale(call: Call, factor_arg: Any, chain: _Chain) -> None:
    """A symbolic scale (``/ math.sqrt(k.size(-1))`` with a dynamic head dim) is accepted when
    it provably equals SDPA's default, ``1 / sqrt(E)``: the call then passes no scale."""
    factor = value(factor_arg)
    if not isinstance(factor, torch.SymFloat):
        raise Refused(f"scale {factor_arg} is not known at compile time")
    first = canonical(chain.nodes[0])
    assert first is not None
    head_dim = value(first["input"]).shape[-1]
    root = torch._sym_sqrt(head_dim)  # type: ignore[attr-defined]
    expected = root if call.op == "div" else 1.0 / root
    if not statically_known_true(factor == expected):
        raise Refused(f"symbolic scale {factor} is not 1/sqrt({head_dim})")
    chain.scale = None
    chain.leftovers.append(factor_arg)


def _same_dtype(before: torch.fx.Node, after: torch.fx.Node) -> None:
    if value(before).dtype != value(after).dtype or not same_shape(value(before), value(after)):
        raise Refused(f"{after.name} changes the scores' dtype or shape")


# ----------------------------------------------------------------------------- the rewrite


def _rewrite(graph: torch.fx.Graph, first: Call, chain: _Chain) -> set[torch.fx.Node]:
    """Replace the chain by the call; returns the nodes erased."""
    last = canonical(chain.nodes[-1])
    assert last is not None
    if chain.scale is not None and not chain.scale > 0:
        # torch's CPU flash kernel returns NaN rows for a causal mask with such a scale (the
        # chain as written is finite); scores scaled so are not attention as SDPA's kernels know it
        raise Refused(f"scores scaled by {chain.scale}, not a positive number")
    k_source, k_perm = _transposed(first["other"])  # type: ignore[misc]
    q, v = first["input"], last["other"]
    dtype = _check_dtypes(chain, [q, k_source, v])
    if value(chain.nodes[-1]).requires_grad:
        check_gradients(chain.masks)
    _check_shapes(q, k_source, k_perm, v)
    _check_nothing_between(chain)
    emit = Emitter(graph, chain.nodes[-1])
    try:
        with graph.inserting_before(chain.nodes[-1]):
            out = _emit_call(emit, q, k_source, k_perm, v, chain, dtype)
    except Refused:
        emit.undo()
        raise
    except Exception as exc:  # noqa: BLE001 - the fake run of the new call rejected it
        emit.undo()
        raise Refused(f"scaled_dot_product_attention refused the operands: {exc}") from None
    log.debug("attention at %s rewritten: %s %s, mask %s, scale %s", _where(first.node),
              tuple(value(q).shape), dtype, kind_of(chain.masks), chain.scale)
    chain.nodes[-1].replace_all_uses_with(out)
    for node in reversed(chain.nodes):
        graph.erase_node(node)
    return set(chain.nodes) | erase_unused(graph, [first["other"], *chain.leftovers])


def _check_dtypes(chain: _Chain, operands: list[Any]) -> torch.dtype:
    """The dtype D the call runs in."""
    for operand in operands:
        fake = value(operand)
        if not isinstance(fake, torch.Tensor) or not fake.is_floating_point():
            raise Refused("q, k or v is not a floating-point tensor")
    dtype = value(chain.nodes[0]).dtype
    allowed = _PRECISE_ENOUGH.get(dtype)
    if allowed is None or value(chain.nodes[-1]).dtype != dtype:
        raise Refused(f"the matmuls give {dtype} and {value(chain.nodes[-1]).dtype}")
    for node in chain.nodes[1:-1]:
        if value(node).dtype not in allowed:
            raise Refused(f"{node.name} computes in {value(node).dtype}: "
                          f"SDPA in {dtype} would be less precise")
    return dtype


def _check_shapes(q: Any, k_source: Any, k_perm: tuple[int, ...], v: Any) -> None:
    q_shape, v_shape = list(value(q).shape), list(value(v).shape)
    k_shape = [value(k_source).shape[d] for d in k_perm]
    if not 2 <= len(q_shape) <= 4 or not len(q_shape) == len(k_shape) == len(v_shape):
        raise Refused(f"q, k, v have {len(q_shape)}, {len(k_shape)}, {len(v_shape)} dims")
    for a, b in zip(q_shape[:-2] + q_shape[-1:], k_shape[:-2] + k_shape[-1:]):
        if not statically_known_true(a == b):
            raise Refused("q and k differ in batch or head dims (broadcast or grouped heads)")
    for a, b in zip(k_shape[:-1], v_shape[:-1]):
        if not statically_known_true(a == b):
            raise Refused("k and v differ in batch dims or length")


def _check_nothing_between(chain: _Chain) -> None:
    """Nothing between the first and the last matmul may mutate a tensor or change a mode:
    the call reads q, k and the mask where the last matmul is."""
    inside = set(chain.nodes)
    node = chain.nodes[0].next
    while node is not chain.nodes[-1]:
        if node not in inside and has_effects(node):
            raise Refused(f"{node.name} ({node.target}) may mutate or change a mode inside the chain")
        node = node.next


def _emit_call(emit: Emitter, q: Any, k_source: Any, k_perm: tuple[int, ...], v: Any,
               chain: _Chain, dtype: torch.dtype) -> torch.fx.Node:
    ndim = value(q).dim()
    k = k_source if k_perm == tuple(range(ndim)) else emit.method("permute", k_source, *k_perm)
    operands = [emit.cast(x, dtype) for x in (q, k, v)]
    mask, causal, keys = attn_mask_and_keys(emit, chain.masks, dtype)
    # a 2-d or 3-d call runs as 4-d with heads of size 1: (B, 1, L, E) keeps the output
    # contiguous where a flash kernel writes (B, L, H, E)
    pad = 4 - ndim
    for _ in range(pad):
        operands = [emit.method("unsqueeze", x, ndim - 2) for x in operands]
        if mask is not None and value(mask).dim() > 2:
            mask = emit.method("unsqueeze", mask, value(mask).dim() - 2)
            keys = emit.method("unsqueeze", keys, value(keys).dim() - 2)
    if mask is not None and value(mask).dim() < 2:
        mask = emit.method("unsqueeze", mask, 0)
        keys = emit.method("unsqueeze", keys, 0)
    out = emit.function(F.scaled_dot_product_attention, *operands, attn_mask=mask, dropout_p=0.0,
                        is_causal=causal, scale=chain.scale)
    if keys is not None:
        # a row whose every key is masked out with -inf is NaN in eager (softmax of -inf
        # everywhere); SDPA's kernels give 0 or NaN depending on the kernel: keep eager's NaN
        # (an additive mask of -inf too, read before clamping: found by a hunt against eager
        # and a review, session 31)
        attended = emit.method("any", keys, -1, keepdim=True)
        out = emit.function(torch.where, attended, out, float("nan"))
    for _ in range(pad):
        out = emit.method("squeeze", out, ndim - 2)
    expected = value(chain.nodes[-1])
    got = value(out)
    if got.dtype != expected.dtype or not same_shape(got, expected):
        raise Refused(f"the call gives {got.dtype} {tuple(got.shape)}, eager "
                      f"{expected.dtype} {tuple(expected.shape)}")
    if not _layout_safe(got, expected, chain.nodes[-1]):
        out = emit.method("contiguous", out)
    return out


def _layout_safe(out: torch.Tensor, eager: torch.Tensor, replaced: torch.fx.Node) -> bool:
    """A ``view`` downstream may rely on the layout of eager's matmul result (contiguous).
    The call's result can be used as it is when it has eager's strides, or when every user
    transposes it into a contiguous tensor (``y.transpose(1, 2)`` before merging heads), on
    which every view works."""
    strides = zip(out.shape, out.stride(), eager.stride())
    if all(statically_known_true(n == 1) or statically_known_true(a == b) for n, a, b in strides):
        return True
    for user in replaced.users:
        call = canonical(user)
        perm = permutation(call) if call is not None else None
        if perm is None or call["input"] is not replaced or not _contiguous(out, perm):
            return False
    return True


def _contiguous(t: torch.Tensor, perm: tuple[int, ...]) -> bool:
    """Whether ``t.permute(perm)`` is provably contiguous (no guards on symbolic sizes)."""
    expected: Any = 1
    for d in reversed(perm):
        if statically_known_true(t.shape[d] == 1):
            continue
        if not statically_known_true(t.stride()[d] == expected):
            return False
        expected = expected * t.shape[d]
    return True
