"""The Triton plugin computes what eager computes where Triton's or LLVM's own semantics
differ (found by a hunt through Triton's interpreter, session 31; the C++ plugin was right in
each): integer powers, integer constants outside a dtype's range, one-row scans, float64
narrowed to float16, and negative floats cast to uint8. ``tests/test_edge_semantics.py`` holds the same cases for
the GPU run (``COIL_TEST_DEVICE=cuda``), with INT_MIN divided by -1, which LLVM leaves
undefined and the interpreter's numpy wraps."""
from __future__ import annotations

import pytest
import torch

import coil
from helpers import check
from test_triton import _clean_language, _sources, backend, interpreted  # noqa: F401 (fixtures)

I32, I64, U8 = torch.int32, torch.int64, torch.uint8


def test_integer_powers_wrap_as_eager(backend):
    """The float pow truncated 3 ** 3 to 26 and saturated on overflow."""
    a, b = torch.tensor([-3, 3, 7, 2, -1, 1, 5], dtype=I32), torch.tensor([3, 25, 0, -1, -3, -2, 13], dtype=I32)
    check(lambda a, b: a ** b, a, b, atol=0, rtol=0)
    check(lambda a: a ** 3, torch.tensor([2, -3, 2000], dtype=I32), atol=0, rtol=0)
    check(lambda a, b: a ** b, torch.tensor([3, 255], dtype=U8), torch.tensor([5, 2], dtype=U8), atol=0, rtol=0)
    check(lambda a: a ** 40, torch.tensor([3, -3], dtype=I64), atol=0, rtol=0)


def test_integer_constants_wrap_to_the_dtype(backend):
    """``uint8 + -1`` adds 255, as eager; the literal -1 was refused for a uint8 block."""
    u8 = torch.tensor([0, 255, 7], dtype=U8)
    for f in (lambda a: a + -1, lambda a: a == -1, lambda a: a * 300):
        check(f, u8, atol=0, rtol=0)
        torch._dynamo.reset()
    check(lambda a: a + 200, torch.tensor([1, -100], dtype=torch.int8), atol=0, rtol=0)


def test_scans_of_one_row(backend):
    """A one-row scan's store had no x in its index: a pointer block narrower than its mask."""
    check(lambda a: a.cumsum(0) * 2, torch.tensor([1.0, 2.0, 3.0]))
    check(lambda a: a.cumprod(1), torch.ones(1, 3, 1) * 2)


def test_float64_narrowed_to_float16_rounds_through_float32(backend):
    x = torch.tensor([1.0004882812500002, 65519.999999, -2.5], dtype=torch.float64)
    check(lambda x: x.to(torch.float16), x, atol=0, rtol=0)


def test_negative_floats_cast_to_uint8_wrap(backend):
    """LLVM's fptoui gives 0 for -1.0 on the GPU (the interpreter's numpy wraps): the cast
    goes through int64, as eager's."""
    report = check(lambda x: (x * 1).to(U8), torch.tensor([-1.0, -2.5, 3.7, 255.0]), atol=0, rtol=0)
    assert any(".to(tl.int64).to(tl.uint8)" in s for s in _sources(report))


_EMPTY_REDUCTIONS = {"sum_all": (lambda x: x.sum(), (0, 7)), "mean_all": (lambda x: x.mean(), (7, 0)),
                     "sum_rows": (lambda x: x.sum(1), (7, 0)), "prod_rows": (lambda x: x.prod(1), (7, 0)),
                     "logsumexp_rows": (lambda x: x.logsumexp(1), (7, 0)),
                     "mean_hw": (lambda x: x.mean((2, 3)), (2, 3, 0, 5))}


@pytest.mark.parametrize("name", _EMPTY_REDUCTIONS)
def test_reductions_over_nothing_load_nothing(backend, name):
    """A reduced extent of 0 is a multiple of every block, so its loads went unmasked: a
    block of the empty input read past its end (a segfault under the interpreter, an illegal
    address or garbage on a GPU; a hunt against eager, session 33). Eager's 0, 1, NaN, -inf."""
    fn, shape = _EMPTY_REDUCTIONS[name]
    check(fn, torch.randn(shape))
