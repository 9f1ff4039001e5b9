"""Comparisons of an index with a constant, decided or reduced by the loop ranges
(``coil.index_compare``): every rewrite agrees with the comparison it replaces at every point
of the ranges, and a ``cat`` read through a permute and a reshape (ViT's qkv gradient) selects
its parts by the reduced index and matches eager."""
from __future__ import annotations

import itertools

import pytest
import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from coil import ir
from coil.index_compare import simplify_comparison
from coil.report import recording
from coil.symbolic import FloorDiv, ModIdx, sym
from helpers import cpu_routed_to, cpu_tensors

x0, x1 = sym("x0"), sym("x1")


def _value(v: ir.Value, env: dict) -> bool | int:
    if isinstance(v, ir.Const):
        return v.value
    if isinstance(v, ir.IndexValue):
        e = v.expr.xreplace({k: sympy.Integer(n) for k, n in env.items()})
        return int(e.replace(FloorDiv, lambda a, b: sympy.floor(a / b)).replace(ModIdx, lambda a, b: a % b))
    assert isinstance(v, ir.Op), v
    a, b = (_value(x, env) for x in v.args)
    return {"ge": a >= b, "gt": a > b, "lt": a < b, "le": a <= b}[v.name]


def _compare(name: str, e: sympy.Expr, k: int) -> ir.Op:
    return ir.Op(torch.bool, name=name, args=(ir.IndexValue(torch.int64, expr=e), ir.IndexValue(torch.int64, expr=sympy.Integer(k))))


def test_the_vit_qkv_selection_reduces_to_the_part_index():
    ranges = {x0: 64 * 197, x1: 576}
    index = FloorDiv(x0, 197) + 64 * FloorDiv(x1, 192)
    always = simplify_comparison(_compare("ge", index, 0), ranges)
    assert always == ir.Const(torch.bool, True) and type(always.value) is bool  # a plugin's literal()
    reduced = simplify_comparison(_compare("lt", index, 128), ranges)
    assert isinstance(reduced, ir.Op) and reduced.args[0].expr == FloorDiv(x1, 192) and reduced.args[1].expr == 2


def test_a_comparison_nothing_reduces_is_kept():
    assert simplify_comparison(_compare("ge", x0 + 2 * x1, 3), {x0: 5, x1: 4}) is None


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 6), st.integers(-3, 30),
       st.sampled_from(["ge", "gt", "lt", "le"]), st.integers(-4, 4))
def test_every_rewrite_agrees_at_every_point(n0, d, g, k, name, c):
    ranges = {x0: n0 * d, x1: 7}
    index = FloorDiv(x0, d) + g * ModIdx(x1, 3) + g * FloorDiv(x1, 3) * 2 + c
    op = _compare(name, index, k)
    got = simplify_comparison(op, ranges)
    if got is None:
        return
    for i, j in itertools.product(range(n0 * d), range(7)):
        env = {x0: i, x1: j}
        assert _value(got, env) == _value(op, env), (op, got, env)


@pytest.mark.parametrize("route", ["cpu", "triton"])
def test_qkv_gradient_cat_through_a_permute_matches_eager(route):
    B, N, H, D = 3, 13, 2, 8

    def attention(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        qkv = (x @ w).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, H * D).square().sum()

    with cpu_tensors():
        torch.manual_seed(0)
        x = torch.randn(B, N, H * D, requires_grad=True)
        w = torch.randn(H * D, 3 * H * D, requires_grad=True)
        attention(x, w).backward()
        want = (x.grad.clone(), w.grad.clone())
        x.grad = w.grad = None
        compiled = torch.compile(attention, backend="coil")
        if route == "triton":
            with cpu_routed_to("triton", "index-compare-tests"), recording() as report:
                compiled(x, w).backward()
        else:
            with recording() as report:
                compiled(x, w).backward()
    torch.testing.assert_close((x.grad, w.grad), want)
    assert any(g.kind == "backward" for g in report.graphs)
