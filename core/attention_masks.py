"""The masks of a hand-written attention, and the ``attn_mask`` that replaces them.

A chain may mask its scores once or several times: a fill (``masked_fill(cond, fill)``,
``where(keep, s, fill)``) and any number of additive masks after it (T5 adds a position bias,
then the padding mask). :func:`read_mask` turns one such step into a :class:`Mask`;
:func:`attn_mask` turns the chain's masks into SDPA's arguments:

* one fill of -inf: a bool ``attn_mask`` (True = attend), negating the condition where the
  chain names the filled places;
* one fill proven causal by :mod:`coil.causal`: ``is_causal=True`` and no mask;
* anything else: one additive mask in the call's dtype D, the sum of the chain's masks, each
  fill as ``where(cond, fill, 0)`` in the scores' dtype. A finite fill is accepted only where
  it swamps any score in float32 (:data:`SWAMPING_FILL`): eager's filled scores all equal the
  fill, SDPA's are ``score + fill``, equal only then, and a row filled everywhere stays
  uniform as in eager. A float32 mask for a bfloat16 call is clamped to bfloat16's range
  before the cast (autocast would round ``finfo(float32).min`` to -inf, and a fully masked
  row to zeros or NaN), and accepted only where it is known to hold 0, -inf and swamping
  fills (:func:`_zero_or_swamping`: Hugging Face's ``(1 - mask) * finfo.min``, fills of a
  bool condition): a float32 position bias (ALiBi, T5, Swin) rounded to bfloat16 moved the
  weights by up to 0.18 where eager adds it in float32 (session 31), so that chain stays as
  written. One for a float16 call is refused (its range cannot hold
  ``finfo(float32).min``-style masks with the same effect)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.fx

from .causal import causal_polarity
from .dynamo_ops import Call, Emitter, canonical, constant, same_shape, value

#: A finite mask fill at or below this swallows any score below 2**75 in float32 arithmetic
#: (``fill + s == fill``), so SDPA's ``s + fill`` is eager's ``fill`` exactly.
SWAMPING_FILL = -(2.0 ** 100)

MaskKind = Literal["causal", "bool", "fill", "additive"]


class Refused(Exception):
    """The chain is not (provably) equivalent to the call; the message says why."""


@dataclass(frozen=True)
class Mask:
    kind: MaskKind
    #: the condition of a fill ("causal", "bool", "fill"), the added tensor ("additive")
    tensor: torch.fx.Node
    #: fills: whether ``tensor`` is True where attention is allowed (else where filled)
    attend: bool = True
    #: fills: the value eager stores in the scores, and the scores' dtype
    fill: float = float("-inf")
    dtype: torch.dtype = torch.float32


def read_mask(call: Call, scores: torch.fx.Node) -> tuple[Mask, list[torch.fx.Node]]:
    """The mask that ``call`` applies to ``scores``, and the nodes only it may have read
    (erased if the call does not read them)."""
    if call.op == "add":
        mask = _additive(call, scores)
        read = []
    else:
        mask = _filled(call, scores)
        read = [mask.tensor] + [a for a in (call["value"], call["input"], call["other"])
                                if isinstance(a, torch.fx.Node) and a is not scores]
    if not same_shape(value(call.node), value(scores)):
        raise Refused("the mask broadcasts the scores to a larger shape")
    return mask, read


def _additive(call: Call, scores: torch.fx.Node) -> Mask:
    operands = [call["input"], call["other"]]
    if scores not in operands or operands[0] is operands[1] or call["alpha"] != 1:
        raise Refused("not an addition to the scores")
    mask = operands[1] if operands[0] is scores else operands[0]
    fake = value(mask)
    if not isinstance(mask, torch.fx.Node) or not isinstance(fake, torch.Tensor):
        raise Refused("the scores shifted by a number")
    if not fake.is_floating_point() or fake.dim() == 0:
        raise Refused(f"additive mask of dtype {fake.dtype} and {fake.dim()} dims")
    return Mask("additive", mask)


def _filled(call: Call, scores: torch.fx.Node) -> Mask:
    """``masked_fill(cond, fill)``, ``where(cond, scores, fill)`` or ``where(cond, fill, scores)``."""
    if call.op == "masked_fill" and call["input"] is scores:
        cond, fill, attend = call["mask"], call["value"], False
    elif call.op == "where" and call["input"] is scores and call["other"] is not scores:
        cond, fill, attend = call["condition"], call["other"], True
    elif call.op == "where" and call["other"] is scores and call["input"] is not scores:
        cond, fill, attend = call["condition"], call["input"], False
    else:
        raise Refused(f"{call.node.name} does not fill the scores")
    dtype = value(call.node).dtype
    if dtype != value(scores).dtype:
        raise Refused(f"{call.node.name} changes the scores' dtype")
    if not isinstance(value(cond), torch.Tensor) or value(cond).dtype != torch.bool:
        raise Refused("mask condition is not a bool tensor")
    number = constant(fill)
    if number is None:
        raise Refused(f"mask fill {fill} is not known at compile time")
    # the fill as eager stores it in the scores' dtype (finfo(float32).min in bfloat16 is -inf)
    number = float(torch.tensor(number, dtype=torch.float64).to(dtype).item())
    if not number <= SWAMPING_FILL:  # NaN too: eager's NaN rows are not a mask
        raise Refused(f"mask fill {number} does not swamp the scores (rows it fills fully would differ)")
    shape = value(scores).shape
    causal = causal_polarity(cond, shape[-2], shape[-1]) == attend
    kind: MaskKind = "causal" if causal else "bool" if number == float("-inf") else "fill"
    return Mask(kind, cond, attend=attend, fill=number, dtype=dtype)


def attn_mask(emit: Emitter, masks: list[Mask], dtype: torch.dtype) -> tuple[torch.fx.Node | None, bool]:
    """``(attn_mask, is_causal)`` for a call in ``dtype`` that applies ``masks`` in order."""
    mask, causal, _ = attn_mask_and_keys(emit, masks, dtype)
    return mask, causal


def attn_mask_and_keys(emit: Emitter, masks: list[Mask], dtype: torch.dtype
                       ) -> tuple[torch.fx.Node | None, bool, torch.fx.Node | None]:
    """:func:`attn_mask`, and a bool tensor of the mask's shape, True where a key is not
    masked out with -inf (read before a float32 mask is clamped for a bfloat16 call)."""
    if not masks:
        return None, False, None
    if len(masks) == 1 and masks[0].kind == "causal":
        return None, True, None
    if len(masks) == 1 and masks[0].kind == "bool":
        mask = masks[0].tensor if masks[0].attend else _negated(emit, masks[0].tensor)
        return mask, False, mask
    _check_sum_order(masks)
    total = None
    for mask in masks:
        added = mask.tensor if mask.kind == "additive" else _as_additive(emit, mask)
        total = added if total is None else emit.function(torch.add, total, added)
    assert total is not None
    if dtype == torch.bfloat16 and value(total).dtype == torch.float32 and \
            not all(m.kind != "additive" or _zero_or_swamping(m.tensor) for m in masks):
        # a position bias (ALiBi, T5, Swin) rounded to bfloat16 moved the weights by up to
        # 0.18 where eager adds it in float32 (found by a hunt against eager, session 31)
        raise Refused("a float32 additive mask that may hold values bfloat16 rounds (a position bias)")
    keys = emit.function(torch.ne, total, float("-inf"))
    if not all(_no_swamping(m.tensor) if m.kind == "additive" else m.fill == float("-inf") or not _swamping(m.fill)
               for m in masks):
        total = _kernel_safe(emit, total)
    return _in_dtype(emit, total, dtype), False, keys


def _check_sum_order(masks: list[Mask]) -> None:
    """Refuse additive masks whose sum the call may round otherwise than eager's adds. Eager
    adds them to the scores one after another, ``(s + a) + b``; the call adds their sum,
    ``s + (a + b)``. That is exact where all but one of them hold only 0, -inf and swamping
    values (a padding mask after a position bias, T5's), and off by the last bits of values
    of at most :data:`SMALL_MASK_VALUE` where those are the others (Swin's bias and -100);
    with larger values in two of them it is not: a -1e9 padding mask after a position bias
    (float32's spacing near 1e9 is 64) moved the weights of a fully padded row by up to 3.7
    (a hunt against eager, session 39)."""
    loose = [m for m in masks if m.kind == "additive" and not _zero_or_swamping(m.tensor)]
    if len(loose) > 1 and not all(_no_swamping(m.tensor) for m in loose):
        raise Refused("two additive masks, one that may hold large finite values (a -1e9 padding mask): "
                      "eager's (s + a) + b would round otherwise than s + (a + b)")


def _kernel_safe(emit: Emitter, total: torch.fx.Node) -> torch.fx.Node:
    """``total`` with every finite value at or below :data:`SWAMPING_FILL` replaced so that
    SDPA's kernels compute eager's weights. CUDA's fused kernels scale the masked scores by
    log2(e) and overflow ``finfo.min`` to -inf: a row whose every key holds such a fill came
    out as zeros where eager's is the uniform average (found on an H100, session 33). In
    eager, a swamping value swallows the score added to it (``s + m == m``), and two distinct
    values of that size differ by at least 2**76, so a row's weights go to its largest value
    alone: where that largest value is above the fill, every swamping value weighs 0 (-inf
    here); where it is itself swamping, the keys holding it weigh equally (each becomes the
    fill, which swallows the scores as eager's values do) and the rest weigh 0."""
    top = emit.method("amax", total, -1, keepdim=True)
    swamped = emit.function(torch.le, total, SWAMPING_FILL)
    top_swamped = emit.function(torch.logical_and, emit.function(torch.le, top, SWAMPING_FILL),
                                emit.function(torch.isfinite, top))
    kept = emit.function(torch.logical_and, emit.function(torch.eq, total, top), top_swamped)
    return emit.method("masked_fill", emit.method("masked_fill", total, swamped, float("-inf")), kept,
                       SWAMPING_FILL)


_SHAPES = ("reshape", "cast", "transpose", "permute", "t", "getitem")


def _swamping(number: float | None) -> bool:
    return number is not None and number < 0 and (number == float("-inf") or number <= SWAMPING_FILL)


def _zero_one(node: object, depth: int = 0) -> float:
    """The smallest magnitude other than 0 that ``node`` may hold, where it holds no more than
    0 and numbers at least that large and not above 1 (else 0.0): 1.0 for a bool or integer
    mask (an integer attention mask is 0/1 by convention), cast or re-shaped; 2**-24 for
    ``1 - x`` of a float32 x (Hugging Face's ``(1 - mask) * finfo.min``: 1 - x is 0 or at least
    2**-24; where x > 1 the product is huge and positive, garbage in eager as in the call)."""
    fake = value(node)
    if isinstance(fake, torch.Tensor) and (fake.dtype == torch.bool or not fake.is_floating_point()):
        return 1.0
    call = canonical(node)
    if call is None or depth > 8:
        return 0.0
    if call.op in _SHAPES:
        return _zero_one(call["input"], depth + 1)
    if call.op != "sub" or constant(call["input"]) != 1 or call["alpha"] != 1:
        return 0.0
    other = value(call["other"])
    if isinstance(other, torch.Tensor) and other.dtype == torch.float32:
        return 2.0 ** -24
    return _zero_one(call["other"], depth + 1)


def _zero_or_swamping(node: object, depth: int = 0) -> bool:
    """Whether every value of ``node`` is 0, -inf or a number that swamps any score
    (``(1 - mask) * finfo.min``, a masked_fill of such a mask): bfloat16 rounds none of them
    into a value a softmax tells apart."""
    call = canonical(node)
    if call is None or depth > 8:
        return False
    if call.op in _SHAPES:
        return _zero_or_swamping(call["input"], depth + 1)
    if call.op == "zeros":
        return True
    if call.op == "full":
        return constant(call["fill_value"]) == 0 or _swamping(constant(call["fill_value"]))
    a, b = call["input"], call["other"]
    if call.op == "mul":
        return any(c is not None and _swamping(c * _zero_one(x)) for c, x in ((constant(b), a), (constant(a), b)))
    if call.op == "add":
        return call["alpha"] == 1 and _zero_or_swamping(a, depth + 1) and _zero_or_swamping(b, depth + 1)
    if call.op == "masked_fill":
        return _swamping(constant(call["value"])) and _zero_or_swamping(a, depth + 1)
    if call.op == "where":
        return all(constant(x) == 0 or _swamping(constant(x)) or _zero_or_swamping(x, depth + 1) for x in (a, b))
    return False


def check_gradients(masks: list[Mask]) -> None:
    """Refuse masks that may fill a whole row with a finite swamping value, for a chain whose
    output needs gradients. Eager's weights in such a row are uniform (1/n); SDPA's backward
    recomputes them from a log-sum-exp that the fill swallows (``fill + log n == fill`` in
    float32) and uses weights of 1, so the row's gradients to q, k and v are n times eager's,
    and a masked_fill passes none to the scores at all (a hunt's left-padded Llama block that
    reads such rows differed by up to 21.8, session 31). A -inf fill (NaN rows in both), a
    causal mask (no row is fully masked) and additive masks without swamping values (a learned
    position bias, Swin's -100) are exact."""
    for mask in masks:
        if mask.kind == "fill":
            raise Refused(f"a fill of {mask.fill} with gradients (rows it fills fully get SDPA's gradients, "
                          "not eager's)")
        if mask.kind == "additive" and not _no_swamping(mask.tensor):
            raise Refused("an additive mask that may hold swamping values (finfo.min), with gradients "
                          "(rows it fills fully get SDPA's gradients, not eager's)")


#: The largest magnitude of a constant an additive mask may hold for a chain with gradients:
#: SDPA's backward recomputes the weights from ``score + c - logsumexp``, which loses the
#: bits of ``c``'s magnitude (-1e9 swallows scores of ordinary size: spacing 64; even 1e4 moved
#: gradients by 1e-3). Swin's -100 is within it.
SMALL_MASK_VALUE = 128.0


def _no_swamping(node: object, depth: int = 0) -> bool:
    """Whether every value of ``node`` is -inf or a number of magnitude at most
    :data:`SMALL_MASK_VALUE`: a parameter (a learned bias), such numbers, and sums, shapes
    and fills of those. An input or a buffer may hold anything."""
    number = constant(node)
    if number is not None or not isinstance(node, torch.fx.Node):
        return number is not None and (number == float("-inf") or abs(number) <= SMALL_MASK_VALUE)
    if node.op in ("placeholder", "get_attr"):
        fake = value(node)
        return isinstance(fake, torch.Tensor) and fake.requires_grad  # a parameter
    call = canonical(node)
    if call is None or depth > 12:
        return False
    if call.op in _SHAPES:
        return _no_swamping(call["input"], depth + 1)
    if call.op in ("zeros", "ones"):
        return True
    if call.op == "full":
        return _no_swamping(call["fill_value"], depth + 1)
    if call.op in ("add", "sub"):
        return call["alpha"] in (1, None) and all(_no_swamping(x, depth + 1) for x in (call["input"], call["other"]))
    if call.op == "masked_fill":
        return _no_swamping(call["input"], depth + 1) and _no_swamping(call["value"], depth + 1)
    if call.op == "where":
        return _no_swamping(call["input"], depth + 1) and _no_swamping(call["other"], depth + 1)
    return False


def check_order(masks: list[Mask], new: Mask) -> None:
    """A fill comes first: a fill after an additive mask overwrites it, where a sum would not."""
    if masks and new.kind != "additive":
        raise Refused("a fill after another mask")


def kind_of(masks: list[Mask]) -> str:
    """How the call masks: "none", "causal", "bool" (a bool attn_mask) or "additive"."""
    if not masks:
        return "none"
    if len(masks) == 1 and masks[0].kind in ("causal", "bool"):
        return masks[0].kind
    return "additive"


def _as_additive(emit: Emitter, mask: Mask) -> torch.fx.Node:
    """0 where attending, the fill elsewhere, in the scores' dtype."""
    if mask.attend:
        base = emit.function(torch.full_like, mask.tensor, mask.fill, dtype=mask.dtype)
        return emit.method("masked_fill", base, mask.tensor, 0.0)
    base = emit.function(torch.zeros_like, mask.tensor, dtype=mask.dtype)
    return emit.method("masked_fill", base, mask.tensor, mask.fill)


def _in_dtype(emit: Emitter, mask: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
    mask_dtype = value(mask).dtype
    if mask_dtype == dtype or torch.finfo(mask_dtype).bits < torch.finfo(dtype).bits:
        return emit.cast(mask, dtype)  # exact
    if dtype == torch.bfloat16 and mask_dtype == torch.float32:
        return emit.cast(emit.method("clamp_min", mask, torch.finfo(dtype).min), dtype)
    raise Refused(f"a {mask_dtype} additive mask would be rounded to {dtype} (its values are unknown)")


def _is_bool(node: object) -> bool:
    fake = value(node)
    return isinstance(fake, torch.Tensor) and fake.dtype == torch.bool


def _negated(emit: Emitter, cond: torch.fx.Node) -> torch.fx.Node:
    call = canonical(cond)
    negation = call is not None and call.op in ("bitwise_not", "logical_not")
    if negation and _is_bool(call["input"]):
        return call["input"]
    return emit.function(torch.logical_not, cond)
