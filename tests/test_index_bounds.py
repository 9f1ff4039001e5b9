"""Indices read from memory and out of their dim's range raise, as eager raises, and never
reach memory outside the buffer (found by a hunt against eager, session 29: the C++ plugin
read past the buffer for ``index_select``/``gather``/``embedding``/``take``, wrote past it
for ``scatter_add``/``index_put_``, corrupting the heap, and took a negative index where
eager rejects one). Negative indices where Python's indexing allows them still count from
the end."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import TEST_BACKEND
from helpers import check

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cpu_cpp" or torch.get_default_device().type != "cpu",
                                reason="the C++ plugin's check (the Triton plugin's is a device assert, off by default)")

X = torch.randn(7, 5)


def _raises_as_eager(f, *args):
    with pytest.raises((IndexError, RuntimeError)):
        f(*args)
    compiled = torch.compile(f, backend="coil")
    with pytest.raises((IndexError, RuntimeError), match="out of (bounds|range)|Class values must be"):
        compiled(*args)
    torch._dynamo.reset()


@pytest.mark.parametrize("bad", [7, -8, 10**9])
@pytest.mark.parametrize("f", [
    lambda x, i: torch.index_select(x, 0, i),
    lambda x, i: x[i] * 2,
    lambda x, i: F.embedding(i, x),
    lambda x, i: torch.take(x, i * 5),
    lambda x, i: torch.gather(x, 0, i[:, None].expand(-1, 5)),
    lambda x, i: torch.gather(x.exp(), 0, i[:, None].expand(-1, 5)),  # gathered through the exp
], ids=["index_select", "index", "embedding", "take", "gather", "gather_inlined"])
def test_an_index_read_out_of_range_raises(f, bad):
    i = torch.tensor([0, 3, bad, 1])
    if f(X, torch.tensor([0, 3, 2, 1])) is not None:  # the same call in range works, as eager
        check(f, X, torch.tensor([0, 3, 2, 1]))
        torch._dynamo.reset()
    _raises_as_eager(f, X, i)


@pytest.mark.parametrize("f", [
    lambda x, i: x.scatter_add(0, i[:, None].expand(-1, 5), torch.ones(4, 5)),
    lambda x, i: x.scatter(0, i[:, None].expand(-1, 5), 1.0),
    lambda x, i: x.clone().index_put_((i,), torch.ones(4, 5), accumulate=True),
    lambda x, i: x.clone().index_put_((i,), torch.ones(4, 5)),
    lambda x, i: x.index_add(0, i, torch.ones(4, 5)),
    lambda x, i: x.t().scatter(1, i[:, None].repeat(2, 1)[:5], 2.0),  # one element per line
], ids=["scatter_add", "scatter", "index_put_accumulate", "index_put", "index_add", "scatter_one_per_line"])
def test_an_index_written_out_of_range_raises_and_stays_in_the_buffer(f):
    i = torch.tensor([0, 3, 7, 1])
    _raises_as_eager(f, X, i)
    _raises_as_eager(f, X, torch.tensor([0, 3, 10**9, 1]))
    big = torch.zeros(10**6)  # allocations after the error: a write past the buffer corrupted the heap
    assert float(big.sum()) == 0.0


@pytest.mark.parametrize("f", [
    lambda x, i: torch.gather(x, 0, i[:, None].expand(-1, 5)),
    lambda x, i: x.scatter_add(0, i[:, None].expand(-1, 5), torch.ones(4, 5)),
    lambda x, i: torch.index_select(x, 0, i),
    lambda x, i: F.embedding(i, x),
], ids=["gather", "scatter_add", "index_select", "embedding"])
def test_a_negative_index_raises_where_eager_rejects_it(f):
    _raises_as_eager(f, X, torch.tensor([0, -1, 2, 1]))


@pytest.mark.parametrize("f", [
    lambda x, i: x[i] + 1,
    lambda x, i: torch.take(x, i),
    lambda x, i: x.clone().index_put_((i,), torch.ones(4, 5), accumulate=True),
], ids=["index", "take", "index_put"])
def test_a_negative_index_counts_from_the_end_where_python_indexing_allows_it(f):
    check(f, X, torch.tensor([0, -1, -7, 2]))


def test_cross_entropy_with_a_target_out_of_range_raises_and_the_next_call_does_not():
    logits, good = torch.randn(4, 5), torch.tensor([0, 4, 2, 1])
    f = lambda x, t: F.cross_entropy(x, t)
    compiled = torch.compile(f, backend="coil")
    torch.testing.assert_close(compiled(logits, good), f(logits, good))
    for bad in (5, -1):
        with pytest.raises((IndexError, RuntimeError)):
            f(logits, torch.tensor([0, bad, 2, 1]))
        with pytest.raises(IndexError, match="out of bounds"):
            compiled(logits, torch.tensor([0, bad, 2, 1]))
    torch.testing.assert_close(compiled(logits, good), f(logits, good))  # the flag was cleared
    ignored = torch.tensor([0, -100, 2, 1])  # ignore_index is not out of range
    torch.testing.assert_close(compiled(logits, ignored), f(logits, ignored))


def test_one_hot_of_a_class_out_of_range_raises_as_in_eager():
    """The decomposition checks the classes with ``_assert_async``, whose result nothing
    reads: it was dropped as dead, and a class of 5 or -1 gave a row of zeros."""
    f = lambda t: F.one_hot(t, 5) * 2
    check(f, torch.tensor([0, 4, 2]))
    torch._dynamo.reset()
    for bad in (5, -1):
        _raises_as_eager(f, torch.tensor([0, bad, 2]))
