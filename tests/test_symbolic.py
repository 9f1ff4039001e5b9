"""Unit tests of index arithmetic: FloorDiv/ModIdx folding, range-based simplification, printing."""

from __future__ import annotations

import pytest
import sympy
import torch
from hypothesis import given, strategies as st

from coil.symbolic import ExprPrinter, FloorDiv, ModIdx, simplify_index, sym

x0, x1, s0 = sym("x0"), sym("x1"), sym("s0")


def test_constant_folding():
    assert FloorDiv(sympy.Integer(7), sympy.Integer(2)) == 3
    assert ModIdx(sympy.Integer(7), sympy.Integer(2)) == 1
    assert FloorDiv(x0, sympy.Integer(1)) == x0
    assert ModIdx(x0, sympy.Integer(1)) == 0


def test_simplify_with_ranges():
    ranges = {x0: sym("s1"), x1: s0}
    assert simplify_index(FloorDiv(x0 * s0 + x1, s0), ranges) == x0
    assert simplify_index(ModIdx(x0 * s0 + x1, s0), ranges) == x1
    # not provable: x1 may reach 2*s0
    assert simplify_index(FloorDiv(x0 * s0 + x1, s0), {x0: 4, x1: 2 * s0}).has(FloorDiv)


@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6))
def test_simplified_index_agrees_numerically(a, b, c):
    ranges = {x0: a, x1: b * c}
    flat = x0 * b * c + x1
    exprs = [FloorDiv(flat, b * c), ModIdx(flat, b * c), FloorDiv(ModIdx(flat, b * c), c)]
    for e in exprs:
        s = simplify_index(e, ranges)
        for i in range(a):
            for j in range(b * c):
                want = _evaluate(e, {x0: i, x1: j})
                assert _evaluate(s, {x0: i, x1: j}) == want


def _evaluate(e, env):
    e = e.xreplace({k: sympy.Integer(v) for k, v in env.items()})
    return int(
        e.replace(FloorDiv, lambda a, b: sympy.floor(a / b)).replace(ModIdx, lambda a, b: a % b)
    )


def test_printer():
    text = ExprPrinter().print(FloorDiv(x0, 4) * 3 + ModIdx(x1, s0) - 2)
    assert text == "(-2 + 3*(x0 // 4) + (x1 % s0))"


def test_a_zero_divisor_has_no_exact_quotient():
    """A zero-size dim puts 0 in index arithmetic; the quotient helper must decline, not raise
    (``torch.tile`` of a (0,)-sized input raised ZeroDivisionError in the OpInfo sweep)."""
    from coil.sdk.symbolic import _exact_quotient
    x = sympy.Symbol("x0", integer=True, nonnegative=True)
    assert _exact_quotient(4 * x, sympy.Integer(0)) is None
    assert _exact_quotient(4 * x, sympy.Integer(2)) == 2 * x


def test_tile_of_an_empty_tensor_compiles():
    import torch
    for shape in [(0,), (3, 0)]:
        x = torch.randn(shape)
        got = torch.compile(lambda t: torch.tile(t, ()) + 1, backend="coil", dynamic=False)(x)
        torch.testing.assert_close(got, torch.tile(x, ()) + 1)


def test_inner_dims_recombined_fold_into_one_remainder():
    """``x % 64 + 64*((x // 64) % 3)`` is ``x % 192`` (ViT's q, k and v heads read back as one
    row of the qkv gradient)."""
    from coil.symbolic import fold_divmod
    assert fold_divmod(ModIdx(x1, 64) + 64 * ModIdx(FloorDiv(x1, 64), 3) + 5 * x0) == ModIdx(x1, 192) + 5 * x0
    assert fold_divmod(2 * ModIdx(x1, 64) + 128 * ModIdx(FloorDiv(x1, 64), 3)) == 2 * ModIdx(x1, 192)
    kept = 2 * ModIdx(x1, 64) + 64 * ModIdx(FloorDiv(x1, 64), 3)
    assert fold_divmod(kept) == kept


@given(st.integers(1, 8), st.integers(1, 5), st.integers(0, 200))
def test_folded_remainders_agree_numerically(b, n, x):
    from coil.symbolic import fold_divmod
    e = ModIdx(x1, b) + b * ModIdx(FloorDiv(x1, b), n)
    assert _evaluate(fold_divmod(e), {x1: x}) == _evaluate(e, {x1: x})


@pytest.mark.parametrize("f", [
    lambda a: a.view(-1, 2) * 2,
    lambda a: a.view(-1, 2).t().sum(1),
    lambda a: a.reshape(2, -1).t().contiguous(),
], ids=["pairs", "pairs_transposed_sum", "halves_transposed"])
def test_a_dynamic_size_split_by_a_constant(f):
    """A dynamic dim split in two (``view(-1, 2)``) makes indices such as ``s0/2``: printed
    as one division of the sum over its common denominator (they raised "cannot print index
    expression 1/2"). Several sizes through one compiled function, as eager."""
    compiled = torch.compile(f, backend="coil", dynamic=True)
    for n in (6, 10, 34):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))


@pytest.mark.parametrize("f", [
    lambda a: (a.view(a.shape[0] // 2, 2, -1) * 2).sum(1),
    lambda a: a.view(2, a.shape[0] // 2, -1).sum(0),
    lambda a: a.view(a.shape[0] // 2, 2, -1).transpose(0, 1).contiguous(),
], ids=["halves_summed", "two_halves", "halves_transposed"])
def test_a_view_whose_inferred_dim_divides_by_a_floor_division(f):
    """``view(s0 // 2, 2, -1)`` of an [s0, s1] tensor: the ``-1`` is ``s0*s1 / (2*(s0 // 2))``,
    a fraction no index can hold (it raised "cannot print index expression 1/2"); it is now
    the exact integer quotient. Several sizes, forward and gradient, as eager."""
    compiled = torch.compile(f, backend="coil", dynamic=True)
    for n in (8, 12, 20):
        x = torch.randn(n, 6, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        got, want = compiled(x), f(y)
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        torch.testing.assert_close(x.grad, y.grad)
