"""Outputs that eager returns as views of one storage come back as such views, with eager's
strides and offsets (found by a hunt against eager, session 30: ``return y, y[1:]`` gave two
buffers, so a later ``y.add_`` no longer showed through the slice, and an expanded output came
back dense, accepting an in-place write that eager refuses)."""
from __future__ import annotations

import pytest
import torch


def _run(f, *args):
    expected = f(*[a.clone() for a in args])
    torch._dynamo.reset()
    got = torch.compile(f, backend="coil")(*[a.clone() for a in args])
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for e, g in zip(expected, got):
        assert (g.stride(), g.storage_offset()) == (e.stride(), e.storage_offset())
    return expected, got


def _same_storage(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("f", [
    lambda x: ((y := x * 2), y[1:]),
    lambda x: ((y := x.sin()), y.t()),
    lambda x: ((y := x + 1), y[0], y[:, 2:]),
    lambda x: (x.exp() * 3).unbind(0),
    lambda x: ((y := x.relu()), y.view(-1)),
], ids=["slice", "t", "select_and_slice", "unbind", "view"])
def test_outputs_over_one_storage_share_it(f):
    x = torch.randn(4, 6)
    expected, got = _run(f, x)
    for e, g in zip(expected[1:], got[1:]):
        assert _same_storage(e, expected[0]) and _same_storage(g, got[0])
    expected[0].add_(100)
    got[0].add_(100)  # shows through every other output, as in eager
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("f", [
    lambda x: x.mean(0, keepdim=True).expand_as(x),
    lambda x: (x[:, :1] + 1).expand(4, 6),
    lambda x: torch.broadcast_tensors(x * 2, x[:1] + 1)[1],
], ids=["mean_expand", "pointwise_expand", "broadcast"])
def test_an_expanded_output_keeps_its_zero_stride(f):
    x = torch.randn(4, 6)
    expected, got = _run(f, x)
    if 0 in expected[0].stride():
        with pytest.raises(RuntimeError, match="more than one element"):
            expected[0].add_(1)
        with pytest.raises(RuntimeError, match="more than one element"):
            got[0].add_(1)


def test_views_of_outputs_in_training_graphs():
    x = torch.randn(4, 6, requires_grad=True)

    def f(x):
        y = x.tanh() * 2
        return y, y[1:], y.unbind(1)[2]

    expected, got = _run(f, x)
    assert all(_same_storage(g, got[0]) for g in got[1:])
    sum(t.sum() for t in got).backward()
    grad, x.grad = x.grad, None
    sum(t.sum() for t in expected).backward()
    torch.testing.assert_close(grad, x.grad)


def test_outputs_over_an_input_are_left_to_autograd():
    x = torch.randn(4, 6)
    expected, got = _run(lambda x: (x[1:], x.t()), x)
    assert all(g._base is not None for g in got)
