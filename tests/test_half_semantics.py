"""bfloat16 and float16 results as eager's CPU kernels give them (found by a hunt, session 38):
Dynamo's rewrites of ``addcdiv``/``addcdiv_``/``addcmul_`` with a ``value`` undone (they rounded
after each op; ``coil.dynamo_rewrites``), a truncating division by a number computed in
float32 and rounded once, and a bf16 variance of large values kept finite (a float64 state, as
eager's CPU ``var``). CPU tensors: eager's CUDA kernels compute some of these otherwise (a
division by a number as a product with its reciprocal)."""
from __future__ import annotations

import pytest
import torch

from conftest import TEST_BACKEND
from helpers import cpu_tensors

HALF = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _cpu():
    with cpu_tensors():
        yield


def _operands(dtype: torch.dtype, n: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    c = (torch.randn(n, generator=g) + 2).to(dtype)
    return a, b, c


UPDATES = {
    "addcdiv_value": lambda a, b, c: torch.addcdiv(a, b, c, value=0.3),
    "addcdiv_method": lambda a, b, c: a.clone().addcdiv_(b, c, value=-0.3),
    # Adam's update of its second moment (torch.optim under Dynamo computes its step with
    # tensors, a formula other than eager's, so a whole step is not compared)
    "addcmul_method": lambda a, b, c: a.clone().mul_(0.999).addcmul_(b, b, value=0.001),
    "addcdiv_no_value": lambda a, b, c: torch.addcdiv(a, b, c),
    # what the user wrote op by op keeps eager's rounding after each op
    "written_out": lambda a, b, c: a + 0.3 * (b / c),
    "written_out_torch": lambda a, b, c: torch.add(a, torch.mul(torch.div(b, c), 0.3)),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(UPDATES))
def test_fused_updates_round_once_as_eager(name, dtype):
    fn = UPDATES[name]
    args = _operands(dtype)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="coil")(*args)
    assert torch.equal(got, fn(*args))


def _addcdiv_as_torch_2_11_traces_it(a, b, c):
    return a.clone().add_(torch.mul(torch.div(b, c), -0.3))  # Dynamo 2.11's addcdiv_


def _addcmul_as_torch_2_11_traces_it(a, b, c):
    return a.clone().mul_(0.999).add_(b * b * 0.001)  # Dynamo 2.11's addcmul_


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fn, fused", [(_addcdiv_as_torch_2_11_traces_it, UPDATES["addcdiv_method"]),
                                       (_addcmul_as_torch_2_11_traces_it, UPDATES["addcmul_method"])],
                         ids=["addcdiv_", "addcmul_"])
def test_torch_2_11s_rewrites_of_the_in_place_updates_are_undone(fn, fused, dtype):
    """Dynamo 2.11 traces ``a.addcdiv_(b, c, value=v)`` as ``a.add_(torch.mul(torch.div(b, c),
    v))`` and ``addcmul_`` with ``operator.mul`` (2.13: a ``prims.fma``); the rewrite's marks
    are the chain and a stack trace naming the op. Written out here on a line naming it, as
    2.11 records it, the chain must round once, as the fused op does (the GPU machine's torch
    2.11 failed the test above for both methods, session 42)."""
    args = _operands(dtype)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(fn, backend="coil")(*args), fused(*args))
    assert not torch.equal(fn(*args), fused(*args))  # eager rounds the written-out chain per op


def test_an_update_written_op_by_op_keeps_per_op_rounding():
    """The same chain on a line that calls neither op is the user's: rounded after each op."""
    args = _operands(torch.bfloat16)
    fn = lambda a, b, c: a.clone().add_(torch.mul(torch.div(b, c), -0.3))  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(torch.compile(fn, backend="coil")(*args), fn(*args))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_truncating_division_by_a_number(dtype):
    a, b, _ = _operands(dtype)
    a = a * 4
    for fn in (lambda a, b: torch.div(a, 0.7, rounding_mode="trunc"),
               lambda a, b: torch.div(a, torch.tensor(0.7), rounding_mode="trunc"),
               lambda a, b: torch.div(a, b, rounding_mode="trunc")):
        torch._dynamo.reset()
        assert torch.equal(torch.compile(fn, backend="coil")(a, b), fn(a, b))


@pytest.mark.skipif(TEST_BACKEND == "triton", reason="CUDA's eager var keeps a float32 state, as the Triton plugin")
def test_bf16_variance_of_large_values_is_finite():
    x = torch.tensor([1.2e19, -1.2e19, 1.2e19, -1.2e19]).bfloat16()
    for fn in (lambda x: x.var(), lambda x: x.std(0), lambda x: torch.var_mean(x)[0]):
        torch._dynamo.reset()
        got = torch.compile(fn, backend="coil")(x)
        assert torch.isfinite(got) and torch.equal(got, fn(x))


@pytest.mark.skipif(TEST_BACKEND == "triton", reason="ATen's CUDA path adds the bias after cuDNN's kernel")
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_half_convolution_adds_its_bias_in_the_call(dtype):
    """Eager's CPU convolution adds a half-type bias in oneDNN's kernel, rounding once; split
    into a pointwise add, 332 of 1024 bf16 elements differed by an ulp (found by a hunt)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 12, 12, generator=g).to(dtype)
    w = torch.randn(16, 8, 3, 3, generator=g).to(dtype)
    b = torch.randn(16, generator=g).to(dtype)
    for fn in (lambda x, w, b: torch.nn.functional.conv2d(x, w, b),
               lambda x, w, b: torch.nn.functional.conv2d(x, w, b, padding=1).relu()):
        torch._dynamo.reset()
        assert torch.equal(torch.compile(fn, backend="coil")(x, w, b), fn(x, w, b))


SCATTER_ADDS = {
    "scatter_add": lambda z, i, s: z.scatter_add(0, i, s),
    "scatter_reduce_sum": lambda z, i, s: z.scatter_reduce(0, i, s, "sum"),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(SCATTER_ADDS))
def test_half_scatter_adds_accumulate_as_eager(name, dtype):
    """Eager's CPU ``scatter_add`` (and ``scatter_reduce`` "sum", and so ``gather``'s gradient)
    adds a half type in float32 and rounds once: a bf16 sum of 5000 ones reached about 1250 in
    eager and stopped at 256 rounding each add (found by a hunt, session 38). The sources are
    small integers, so the float32 sums are exact in any order."""
    g = torch.Generator().manual_seed(3)
    index = torch.randint(0, 4, (5000, 3), generator=g)
    src = torch.randint(0, 4, (5000, 3), generator=g).to(dtype)
    base = torch.randint(-3, 3, (4, 3), generator=g).to(dtype)
    fn = SCATTER_ADDS[name]
    torch._dynamo.reset()
    assert torch.equal(torch.compile(fn, backend="coil")(base, index, src), fn(base, index, src))
