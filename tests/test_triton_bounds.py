"""The Triton plugin's bounds checks on indices read from memory, under Triton's interpreter
(on a GPU: ``tests/test_triton_gpu.py``)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import coil
from helpers import check
from test_triton import _sources, backend, interpreted  # noqa: F401 (fixtures)


@pytest.fixture
def interpreter_asserts(monkeypatch):
    """Triton's interpreter drops ``tl.device_assert`` unless its builder's options say
    ``debug`` (``InterpreterBuilder.options`` is a fixed ``InterpreterOptions()``; neither
    ``TRITON_DEBUG`` nor ``triton.knobs.runtime.debug`` reaches it), so turn that on."""
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))


def test_embedding_bounds_check(interpreted, interpreter_asserts):
    from triton.runtime.errors import InterpreterError
    interpreted(bounds_check=True)
    w = torch.randn(10, 4)

    def fn(w, i):
        return F.embedding(i, w) * 2

    report = check(fn, w, torch.tensor([1, 9, 0]))
    assert any("tl.device_assert" in s for s in _sources(report))
    with pytest.raises(InterpreterError, match="index out of bounds"):
        coil.explain(fn, w, torch.tensor([1, 12, 3]))


def test_indices_checked_by_default(backend):
    """On by default, as eager's CUDA kernels and Inductor check: an index out of range stops
    the kernel (a device-side assert on the GPU) instead of reading memory it does not index."""
    from triton.runtime.errors import InterpreterError

    def fn(w, i):
        return F.embedding(i, w) * 2

    report = check(fn, torch.randn(10, 4), torch.tensor([3, 1, 9]))
    assert any("tl.device_assert" in s for s in _sources(report))
    for bad in (10, -1):  # embedding takes no negative index (eager raises)
        with pytest.raises(InterpreterError, match="index out of bounds"):
            coil.explain(fn, torch.randn(10, 4), torch.tensor([1, bad, 3]))
        torch._dynamo.reset()


def test_bounds_check_off(interpreted):
    interpreted(bounds_check=False)
    report = check(lambda w, i: F.embedding(i, w), torch.randn(10, 4), torch.tensor([3, 1]))
    assert not any("device_assert" in s for s in _sources(report))


def test_checked_kernel_keeps_integer_wraparound(backend):
    """A kernel built in debug mode for its bounds check must not add Triton's integer-overflow
    asserts: int32 products wrap in eager, and in Coil's kernels on purpose."""
    def fn(w, i, a):
        return torch.gather(w, 0, i) + (a * 65537).to(torch.float32)

    a = torch.tensor([[2**30, -2**30 - 7], [123456789, 7]], dtype=torch.int32)
    report = check(fn, torch.randn(5, 2), torch.tensor([[4, 0], [1, 3]]), a)
    assert any("tl.device_assert" in s for s in _sources(report))
