"""Index arithmetic of the Triton plugin past int32 (found by a hunt, session 38): a transposing
copy and a split reduction took ``tl.program_id(0)`` in int32 whatever the kernel's indices
needed (the last rows of a [16, 2^27 + 3] transpose stored 4 GiB before their buffer; a sum of
2^31 - 1 elements split into parts whose last loop bound wrapped, dropping 4 million
elements), and the choice of int32 read each index at the loop box's top corner, where an
index with a remainder or a negative coefficient is not largest. The kernels are generated
for the GPU (as the ahead-of-time build spells them) and not run: their grids are millions
of programs, and their inputs are expanded or never written."""
from __future__ import annotations

import pytest
import sympy
import torch

triton = pytest.importorskip("triton")

import coil  # noqa: E402
from coil import plugins  # noqa: E402
from coil.sdk.symbolic import FloorDiv, ModIdx  # noqa: E402
from coil_cuda_triton import mathlib  # noqa: E402
from coil_cuda_triton.backend import TritonBackend  # noqa: E402
from coil_cuda_triton.index_width import INT32_SAFE, magnitude, needs_int64  # noqa: E402
from helpers import cpu_tensors  # noqa: E402


class _Generated(BaseException):
    """Stops a compile once its kernels are generated (a BaseException: no fallback takes it)."""


def _gpu_sources(fn, *args) -> str:
    """The GPU spelling of the kernels Coil generates for ``fn`` on CPU tensors routed to the
    Triton plugin; nothing is launched."""
    gpu = TritonBackend(interpret=False)
    sources: list[str] = []

    def compile_(self, kernels, graph_name):
        sources.extend(s.source for k in kernels for s in gpu.generate(k))
        raise _Generated

    plugins.reset()
    backend = TritonBackend(interpret=True)
    backend.device_type = "cpu"
    backend.compile = compile_.__get__(backend)  # type: ignore[method-assign]
    coil.register_backend_for_device("cpu", backend, name="triton-index-width")
    torch._dynamo.reset()
    try:
        with cpu_tensors(), mathlib.interpreting(), pytest.raises(_Generated):
            torch.compile(fn, backend="coil")(*args)
    finally:
        plugins.reset()
        torch._dynamo.reset()
    assert sources
    return "\n".join(sources)


def test_a_transposing_copy_past_int32_indexes_in_int64():
    with cpu_tensors():
        x = torch.empty_strided((16, 2**27 + 3), (1, 16), dtype=torch.int8)  # 2 GiB, never written
    source = _gpu_sources(lambda x: x.t().contiguous() + 1, x.t())
    assert "pid = tl.program_id(0).to(tl.int64)" in source


def test_a_split_sum_past_int32_counts_its_parts_in_int64():
    with cpu_tensors():
        one = torch.ones(1, dtype=torch.int8)
    source = _gpu_sources(lambda a: a.expand(2**31 - 1).sum(), one)
    assert "pid = tl.program_id(0).to(tl.int64)" in source
    assert "rbase = tl.arange(0, RBLOCK)[None, :].to(tl.int64)" in source


def test_magnitude_bounds_the_whole_box():
    i = sympy.Symbol("x0", integer=True, nonnegative=True)
    ranges = {i: sympy.Integer(20)}
    big = 805306369
    # the hunt's reshaped transpose: largest at i = 4, not at the corner i = 19 (value 3 + big * 4 - ...)
    e = FloorDiv(i, 5) + big * ModIdx(i, 5)
    assert magnitude(e, ranges) >= big * 4
    assert needs_int64([e], ranges)
    # flip: 3221225476 - big * i is largest at i = 0
    assert needs_int64([3221225476 - big * i], ranges)
    assert not needs_int64([i * 1000 + 7], ranges)
    assert magnitude(sympy.Symbol("s0", integer=True) * i, ranges) is None  # a symbolic size
    assert INT32_SAFE == (2**31 - 1) // 2
