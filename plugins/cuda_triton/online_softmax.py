"""One pass instead of two for a row's max and its sum of exponentials.

Softmax, log-softmax and cross-entropy reduce a row twice: ``m = max(b)``, then
``s = sum(exp(b - m))``. When the row is too long for registers (a looped kernel), that is
two reads of the row. The online form keeps, per lane, the largest value seen and the sum of
exponentials relative to it, rescaling the sum whenever the maximum grows
(``s = s * exp(m - b) + 1`` when ``b`` is the new maximum, ``s = s + exp(b - m)`` when not:
both are ``exp(-|b - m|)``, one exponential per element); the lanes are combined at the end
the same way. Both results are then exact up to rounding, from a single read."""
from __future__ import annotations

from coil.sdk import Cast, KernelNode, Load, Loop, Op, ReductionNode, Value

from .optable import compute, literal
from .strategy import Scope, Writer

BLOCK = "[XBLOCK, RBLOCK]"


def _strip_casts(v: Value) -> Value:
    while isinstance(v, Cast) and v.x is not None and v.x.dtype.is_floating_point and v.dtype.is_floating_point:
        v = v.x
    return v


def matches(first: Loop, second: Loop) -> bool:
    """``first`` is one ``max`` of a value b, ``second`` one ``sum`` of ``exp(b - max)``."""
    if len(first.nodes) != 1 or len(second.nodes) != 1:
        return False
    m, s = first.nodes[0], second.nodes[0]
    if not (isinstance(m.node, ReductionNode) and isinstance(s.node, ReductionNode)):
        return False
    if m.node.reduction_type != "max" or s.node.reduction_type != "sum":
        return False
    if not m.body.dtype.is_floating_point or s.node.acc_dtype != m.node.acc_dtype:
        return False
    body = _strip_casts(s.body)
    if not (isinstance(body, Op) and body.name == "exp"):
        return False
    diff = _strip_casts(body.args[0])
    if not (isinstance(diff, Op) and diff.name == "sub"):
        return False
    b, mx = (_strip_casts(a) for a in diff.args)
    return (isinstance(mx, Load) and mx.buffer == m.node.name and not mx.indirect
            and _strip_casts(m.body) == b)


def emit(kw: Writer, m: KernelNode, s: KernelNode) -> None:
    """The fused loop, then both results stored (or kept) like any reduction's."""
    w = kw.w
    acc_t = compute(m.node.acc_dtype)  # type: ignore[union-attr]
    # the hardware exponential: the rescaling factors need no more than its ~2 ulp, and the
    # loop runs two of them per element (libdevice's would make it compute-bound)
    def exp(args: list[str], dtype: object, interpret: bool) -> str:
        return f"tl.exp({args[0]})"
    neg_inf = literal(float("-inf"), m.node.acc_dtype, "[1, 1]")  # type: ignore[union-attr]
    n = m.node.name
    w.line(f"{n}_m = tl.full({BLOCK}, float('-inf'), {acc_t})")
    w.line(f"{n}_s = tl.zeros({BLOCK}, {acc_t})")
    bound = kw.rnumel_text if kw.rnumel.is_number else f"loop_bound({kw.rnumel_text})"
    mask = kw.mask("r") if kw.rmask else None
    with w.block(f"for roffset in range(0, {bound}, RBLOCK):"):
        w.line("rindex = roffset + rbase")
        if kw.rmask:
            w.line(f"rmask = rindex < {kw.rnumel_text}")
        kw.define_r([m])
        with kw.loop_values():
            v = kw.value(m.body, Scope(mask=kw.mask("r")))
            full = f"tl.broadcast_to(({v}).to({acc_t}), {BLOCK})"
            w.line(f"{n}_b = tl.where({mask}, {full}, {neg_inf})" if mask else f"{n}_b = {full}")
            w.line(f"{n}_new = max_nan({n}_m, {n}_b)")
            # one exponential per element: exp(-|b - m|) is the rescaling factor exp(m - b)
            # when b is the new maximum and the term exp(b - m) when it is not; a lane that
            # has seen only -inf keeps sum 0 (exp(-inf - -inf) would be NaN)
            w.line(f"{n}_d = {n}_b - {n}_m")
            e = exp([f"-tl.abs({n}_d)"], m.node.acc_dtype, kw.interpret)  # type: ignore[union-attr]
            w.line(f"{n}_e = {e}")
            w.line(f"{n}_live = {n}_new != float('-inf')")
            w.line(f"{n}_s = tl.where({n}_live, tl.where({n}_d > 0, {n}_s * {n}_e + 1.0, {n}_s + {n}_e), {n}_s)")
            w.line(f"{n}_m = {n}_new")
    w.line(f"{n}_rm = tl.reduce({n}_m, 1, max_nan)[:, None]")
    scale = exp([f"{n}_m - {n}_rm"], m.node.acc_dtype, kw.interpret)  # type: ignore[union-attr]
    w.line(f"{n}_rs = tl.sum(tl.where({n}_m != float('-inf'), {n}_s * {scale}, 0.0), 1)[:, None]")
    kw.store_results(m, [f"{n}_rm"])
    kw.store_results(s, [f"{n}_rs"])
