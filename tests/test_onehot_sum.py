"""Sums of a one-hot selection computed without a loop (:mod:`coil.lowering.onehot`): the rule
on hand-built IR against a loop that sums the body term by term (signs of zero and NaN
included), then cross-entropy, nll_loss and hand-written one-hot sums against eager on the
C++ plugin and under Triton's interpreter, with the backward kernels checked for a loop over
the classes; the forms the rule leaves alone still match eager."""
from __future__ import annotations

import itertools
import math

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from coil import compile as coil_compile
from coil import ir
from coil.compile import lowering_registry
from coil.config import Config
from coil.graph import GraphLowering
from coil.lowering.onehot import sum_of_one_hot
from coil.sdk.reference import apply_op

from helpers import check, cpu_routed_to

R_SYM = sympy.Symbol("r0", integer=True, nonnegative=True)
F32, I64 = torch.float32, torch.int64

#: What a reduction loop leaves in a kernel's source: the C++ plugin's accumulator update,
#: Triton's block sum and reduction index.
LOOP_MARKERS = ("sum_update", "tl.sum", "rindex")


def _loops(source: str) -> bool:
    return any(m in source for m in LOOP_MARKERS)


# ----------------------------------------------------------------------------- the rule on IR


def _eval(v: ir.Value, buffers: dict[str, torch.Tensor], r: int | None) -> torch.Tensor:
    """A scalar evaluation of a value tree (the reference's op semantics); ``r`` binds r0."""
    env = {R_SYM: r} if r is not None else {}
    if isinstance(v, ir.Const):
        return torch.tensor(v.value, dtype=v.dtype)
    if isinstance(v, ir.IndexValue):
        return torch.tensor(int(v.expr.subs(env)), dtype=v.dtype)
    if isinstance(v, ir.Load):
        return buffers[v.buffer][int(v.index.subs(env))].to(v.dtype)
    if isinstance(v, ir.Cast):
        return _eval(v.x, buffers, r).to(v.dtype)
    if isinstance(v, ir.Masked):
        if bool(_eval(v.mask, buffers, r)):
            return _eval(v.body, buffers, r).to(v.dtype)
        return torch.tensor(v.other, dtype=v.dtype)
    assert isinstance(v, ir.Op), v
    return apply_op(v.name, [_eval(a, buffers, r) for a in v.args], v.dtype)


def _loop_sum(body: ir.Value, size: int, buffers: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loop a reduction kernel runs: an accumulator from +0 adding every term."""
    acc = torch.zeros((), dtype=body.dtype)
    for r in range(size):
        acc = acc + _eval(body, buffers, r)
    return acc


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit for floats (the sign of zero counts; NaN equals NaN)."""
    if a.is_floating_point():
        a, b = float(a), float(b)
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return int(a) == int(b)


def _load(name: str, dtype: torch.dtype) -> ir.Load:
    return ir.Load(dtype, buffer=name, index=sympy.Integer(0))


def _op(dtype: torch.dtype, name: str, *args: ir.Value) -> ir.Op:
    return ir.Op(dtype, name=name, args=args)


INDEX = ir.IndexValue(I64, expr=R_SYM)
TARGET = _load("t", I64)
TARGET32 = _load("t32", torch.int32)
SCALE = _load("s", F32)
PICKED = _load("a", F32)
ZERO = ir.Const(F32, value=0.0)

#: Bodies the rule simplifies, as in cross-entropy's backward and its variants.
SIMPLIFIED = {
    "where_times_factor": _op(F32, "mul", _op(F32, "where", _op(torch.bool, "eq", INDEX, TARGET),
                                              ir.Const(F32, value=-1.0), ZERO), SCALE),
    "factor_first_target_left": _op(F32, "mul", SCALE, _op(F32, "where", _op(torch.bool, "eq", TARGET, INDEX),
                                                           PICKED, ZERO)),
    "ne_form_negative_zero": _op(F32, "neg", _op(F32, "where", _op(torch.bool, "ne", INDEX, TARGET),
                                                 ir.Const(F32, value=-0.0), PICKED)),
    "cast_bool_divided": _op(F32, "truediv", ir.Cast(F32, x=_op(torch.bool, "eq", INDEX, TARGET)), SCALE),
    "divided_by_zero": _op(F32, "truediv", _op(F32, "where", _op(torch.bool, "eq", INDEX, TARGET), PICKED, ZERO), ZERO),
    "masked": _op(F32, "mul", ir.Masked(F32, mask=_op(torch.bool, "eq", INDEX, ir.Cast(I64, x=TARGET32)),
                                        body=PICKED, other=0.0), ir.Const(F32, value=2.0)),
    "integer_one_hot": _op(I64, "mul", ir.Cast(I64, x=_op(torch.bool, "eq", ir.Cast(torch.int32, x=INDEX), TARGET)),
                           _load("k", I64)),
}


@pytest.mark.parametrize("name", sorted(SIMPLIFIED))
def test_simplified_value_is_the_loops_sum_to_the_bit(name):
    """Targets in and out of range, factors and selected values of either zero, inf, NaN."""
    body = SIMPLIFIED[name]
    value = sum_of_one_hot(body, R_SYM, sympy.Integer(7), lambda load: None)
    assert value is not None
    assert not any(isinstance(v, ir.IndexValue) and R_SYM in v.expr.free_symbols for v in ir.walk(value))
    for target, scale, picked in itertools.product([-3, -1, 0, 4, 6, 7, 100],
                                                   [1.5, -0.0, 0.0, float("inf"), float("nan")],
                                                   [-2.0, -0.0, float("inf")]):
        buffers = {"t": torch.tensor([target]), "t32": torch.tensor([target], dtype=torch.int32),
                   "s": torch.tensor([scale]), "a": torch.tensor([picked]), "k": torch.tensor([5])}
        got, want = _eval(value, buffers, None), _loop_sum(body, 7, buffers)
        assert _same(got, want), (target, scale, picked, got, want)


def test_masked_one_hot_reads_its_body_only_in_range():
    value = sum_of_one_hot(SIMPLIFIED["masked"], R_SYM, sympy.Integer(7), lambda load: None)
    (masked,) = [v for v in ir.walk(value) if isinstance(v, ir.Masked)]
    assert masked.body is PICKED and masked.mask.name == "logical_and"


def test_symbolic_size_bounds_the_target_with_the_size():
    n = sympy.Symbol("s0", integer=True, positive=True)
    value = sum_of_one_hot(SIMPLIFIED["where_times_factor"], R_SYM, n, lambda load: None)
    assert any(isinstance(v, ir.IndexValue) and v.expr == n for v in ir.walk(value))


LEFT_ALONE = {
    "factor_reads_r": _op(F32, "mul", SIMPLIFIED["cast_bool_divided"].args[0], ir.Load(F32, buffer="x", index=R_SYM)),
    "two_one_hots_added": _op(F32, "add", SIMPLIFIED["where_times_factor"], SIMPLIFIED["factor_first_target_left"]),
    "zero_selected": _op(F32, "where", _op(torch.bool, "eq", INDEX, TARGET), ZERO, PICKED),
    "float_comparison": _op(F32, "where", _op(torch.bool, "eq", ir.Cast(F32, x=INDEX), SCALE), PICKED, ZERO),
    "index_cast_too_narrow": ir.Cast(F32, x=_op(torch.bool, "eq", ir.Cast(torch.int8, x=INDEX), TARGET)),
    "cast_float_to_int": ir.Cast(I64, x=SIMPLIFIED["where_times_factor"]),
    "nonzero_other": _op(F32, "where", _op(torch.bool, "eq", INDEX, TARGET), PICKED, ir.Const(F32, value=1.0)),
}


@pytest.mark.parametrize("name", sorted(LEFT_ALONE))
def test_other_bodies_are_left_alone(name):
    size = sympy.Integer(300) if name == "index_cast_too_narrow" else sympy.Integer(7)
    assert sum_of_one_hot(LEFT_ALONE[name], R_SYM, size, lambda load: None) is None


def test_a_single_element_is_left_to_the_loop():
    assert sum_of_one_hot(SIMPLIFIED["where_times_factor"], R_SYM, sympy.Integer(1), lambda load: None) is None


def _reductions(fn, *inputs) -> int:
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    lowered = GraphLowering(gm, list(inputs), lowering_registry(), Config()).run()
    return sum(isinstance(n, ir.ReductionNode) for n in lowered.nodes)


def test_lowering_reads_through_a_stored_one_hot():
    """The one-hot times a scale is stored (two users, five loads) and the sum reads it back:
    the sum still needs no reduction."""
    def fn(logits, t, g, total):
        onehot = torch.zeros_like(logits).scatter(1, t.unsqueeze(1), -1.0)
        keep = t.unsqueeze(1) != -100
        grad = onehot * torch.where(keep, g / total, 0.0)
        return grad - torch.exp(logits) * grad.sum(1, keepdim=True)

    inputs = (torch.randn(4, 9), torch.tensor([1, -100, 8, 0]), torch.tensor(1.0), torch.tensor(3.0))
    assert _reductions(fn, *inputs) == 0
    assert _reductions(lambda x, t: (torch.arange(9) == t[:, None]).float().mul(x).sum(-1),
                       torch.randn(4, 9), torch.tensor([1, 2, 3, 4])) == 1  # the factor reads r


# ----------------------------------------------------------------------------- against eager


def _step_matches(fn, logits: torch.Tensor, *args, atol=1e-5, rtol=1e-5) -> list:
    """``fn(logits, *args)`` (a loss) and its gradient through Coil against eager; the
    backward graphs' kernels."""
    graphs: list = []
    ref = logits.detach().clone().requires_grad_()
    mine = logits.detach().clone().requires_grad_()
    coil_compile.add_observer(graphs.append)
    try:
        compiled = torch.compile(fn, backend="coil")
        loss = compiled(mine, *args)
        loss.backward()
    finally:
        coil_compile.remove_observer(graphs.append)
    ref_loss = fn(ref, *args)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=atol, rtol=rtol, equal_nan=True)
    torch.testing.assert_close(mine.grad, ref.grad, atol=atol, rtol=rtol, equal_nan=True)
    return [k for g in graphs if g.kind == "backward" for k in g.kernels]


def _targets(n: int, classes: int) -> torch.Tensor:
    t = torch.randint(0, classes, (n,))
    t[1] = -100
    t[n - 2] = -100
    t[3] = classes - 1
    return t


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_backward_has_no_loop_over_classes(reduction):
    torch.manual_seed(0)
    x, t = torch.randn(16, 301), _targets(16, 301)
    kernels = _step_matches(lambda x, t: F.cross_entropy(x, t, reduction=reduction), x, t)
    assert kernels and not any(_loops(k.source) for k in kernels), [k.source for k in kernels]


@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_under_autocast(weighted):
    """Class weights scale the one-hot by ``w[r]``, a factor that reads ``r``: that sum keeps
    its loop (off the target, ``0 * w[r]`` is NaN wherever ``w[r]`` is not finite)."""
    torch.manual_seed(0)
    x, t = torch.randn(12, 64), _targets(12, 257)
    w = torch.rand(257) + 0.5 if weighted else None
    proj = torch.randn(64, 257) / 8

    def fn(x, t):
        with torch.autocast("cpu", torch.bfloat16):
            return F.cross_entropy(x @ proj, t, weight=w)

    kernels = _step_matches(fn, x, t, atol=1e-2, rtol=1e-2)
    assert any(_loops(k.source) for k in kernels) == weighted


def test_cross_entropy_with_label_smoothing_still_matches():
    torch.manual_seed(0)
    x, t = torch.randn(10, 50), _targets(10, 50)
    _step_matches(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), x, t)


def test_nll_loss_backward():
    torch.manual_seed(0)
    x, t, w = torch.randn(9, 40), _targets(9, 40), torch.rand(40)
    _step_matches(lambda x, t: F.nll_loss(x, t, weight=w, reduction="sum"), x, t)
    kernels = _step_matches(lambda x, t: F.nll_loss(F.log_softmax(x, -1), t), x, t)
    assert not any(_loops(k.source) for k in kernels)


def test_hand_written_one_hot_sum():
    torch.manual_seed(0)
    t = torch.tensor([0, 5, -1, 63, 64, 200, 17, 17])
    s = torch.randn(8)
    s[6] = float("inf")  # inf * 0 off the target: the whole row is NaN, as in eager
    s[7] = float("nan")
    report = check(lambda t, s: (torch.arange(64) == t[:, None]).float().mul(s[:, None]).sum(-1), t, s)
    assert not any(_loops(k.source) for k in report.kernels)
    report = check(lambda t: (torch.arange(64) == t[:, None]).float().mul(3.0).sum(-1), t)
    assert not any(_loops(k.source) for k in report.kernels)


def test_one_hot_sums_of_integers_and_the_ne_form():
    t = torch.tensor([3, 0, 9, 4])
    a = torch.randn(4)
    report = check(lambda t: (F.one_hot(t, 10) * 3).sum(-1), t)
    assert not any(_loops(k.source) for k in report.kernels)
    check(lambda t, a: torch.where(torch.arange(10) != t[:, None], 0.0, a[:, None]).sum(-1), t, a)


def test_symbolic_class_count():
    for n in (20, 33):
        t, s = torch.randint(-2, n + 2, (6,)), torch.randn(6)
        check(lambda t, s, n=n: (torch.arange(n) == t[:, None]).float().mul(s[:, None]).sum(-1), t, s,
              dynamic=True)


def test_unsimplified_forms_still_match():
    torch.manual_seed(0)
    x, t, u = torch.randn(5, 30), torch.randint(0, 30, (5,)), torch.randint(0, 30, (5,))
    onehot = lambda t: (torch.arange(30) == t[:, None]).float()  # noqa: E731
    report = check(lambda x, t: (onehot(t) * x).sum(-1), x, t)  # the factor depends on r
    assert any(_loops(k.source) for k in report.kernels)
    report = check(lambda x, t, u: (onehot(t) * 2 + onehot(u) * x[:, :1]).sum(-1), x, t, u)
    assert any(_loops(k.source) for k in report.kernels)


# ----------------------------------------------------------------------------- Triton


def test_triton_interpreted_cross_entropy_and_one_hot_sum():
    with cpu_routed_to("triton", "triton-onehot-tests"):
        torch.manual_seed(0)
        x, t = torch.randn(6, 70), _targets(6, 70)
        kernels = _step_matches(lambda x, t: F.cross_entropy(x, t), x, t)
        assert kernels and all("tl." in k.source for k in kernels)
        assert not any(_loops(k.source) for k in kernels), [k.source for k in kernels]
        t = torch.tensor([0, 5, -1, 63, 64, 17])
        report = check(lambda t, s: (torch.arange(64) == t[:, None]).float().mul(s[:, None]).sum(-1),
                       t, torch.randn(6))
        assert not any(_loops(k.source) for k in report.kernels)


def test_shifted_cross_entropy_backward_stores_no_one_hot():
    """A causal LM's loss, ``cross_entropy(logits[:-1], labels[1:])``: the one-hot gradient
    (``-1/n`` at each label) is read twice in the backward (its row sum and the softmax
    term), through loads of the labels and two scalars. Counted by load it passed the
    lowering's limit of four reads and was stored, a float32 tensor of rows x classes; counted
    by buffer (three) it is recomputed and the backward is one kernel."""
    torch.manual_seed(0)
    x, t = torch.randn(17, 301), _targets(17, 301)
    kernels = _step_matches(lambda x, t: F.cross_entropy(x[:-1], t[1:]), x, t)
    assert len(kernels) == 1, [k.name for k in kernels]
