"""bf16 roundings without a NaN test where the expression proves every NaN's low half is
zero (``plugins/cpu_cpp/half_nan.py``): which values are proven, and kernels that use the
shortcut give eager's bits, NaNs, infinities and subnormals included."""
from __future__ import annotations

import sympy
import torch

import coil
from coil.sdk import Cast, Const, Load, Op
from coil_cpu_cpp.half_nan import nan_low_half_clear

F32, BF16 = torch.float32, torch.bfloat16


def _load(dtype: torch.dtype) -> Load:
    return Load(dtype=dtype, buffer="q0", index=sympy.Symbol("x0"))


def _widened(dtype: torch.dtype) -> Cast:
    return Cast(dtype=F32, x=_load(dtype))


def test_what_is_proven_clean():
    bf = _widened(BF16)
    rounded = Cast(dtype=F32, x=Cast(dtype=BF16, x=_load(F32)))
    assert nan_low_half_clear(bf)
    assert nan_low_half_clear(rounded)  # a rounding's result, whatever went in
    assert nan_low_half_clear(Op(dtype=F32, name="add", args=(bf, Const(dtype=F32, value=float("nan")))))
    assert nan_low_half_clear(Op(dtype=F32, name="mul", args=(Op(dtype=F32, name="neg", args=(bf,)), rounded)))
    assert nan_low_half_clear(Cast(dtype=F32, x=_load(torch.int64)))  # integers have no NaN
    assert nan_low_half_clear(Op(dtype=F32, name="where", args=(_load(torch.bool), bf, Const(dtype=F32, value=0.0))))


def test_what_is_not():
    bf = _widened(BF16)
    assert not nan_low_half_clear(_load(F32))  # a float32 tensor's NaN can have any payload
    assert not nan_low_half_clear(Op(dtype=F32, name="add", args=(bf, _load(F32))))
    assert not nan_low_half_clear(_widened(torch.float16))  # fp16 payload bits land in the low half
    assert not nan_low_half_clear(Cast(dtype=F32, x=_load(torch.float64)))
    assert not nan_low_half_clear(Op(dtype=F32, name="exp", args=(bf,)))  # not proven for functions


def _bf16_specials() -> torch.Tensor:
    """Every bf16 bit pattern: the NaNs with all their payloads, infinities, subnormals."""
    return torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_a_bf16_chain_keeps_eagers_bits_with_the_shortcut():
    x = _bf16_specials()
    y = x.flip(0)  # every pattern against another, NaNs against numbers and NaNs

    def fn(x, y):
        return ((x + y) * 3 - x) / y

    report = coil.explain(fn, x, y)
    source = "\n".join(k.source for k in report.kernels)
    assert "round_bf16_nan_clean" in source and "to_bf16_nan_clean" in source
    want, got = fn(x, y), report.result
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_selects_and_square_roots_of_bf16_values_keep_eagers_bits():
    x = _bf16_specials()
    y = x.flip(0)

    def fn(x, y):
        return torch.maximum(x.abs().sqrt(), y).clamp_min(-2.0) * torch.minimum(x, y).clamp_max(3.0)

    report = coil.explain(fn, x, y)
    source = "\n".join(k.source for k in report.kernels)
    assert "round_bf16_nan_clean" in source and "round_bf16(" not in source
    want, got = fn(x, y), report.result
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def test_float32_payloads_keep_the_nan_test():
    nans = torch.tensor([0x7fffffff, 0x7f800001, 0x7fc0ffff, -1, 0x7f80ffff], dtype=torch.int32).view(torch.float32)
    x = torch.cat([nans, torch.randn(59)])

    def fn(x):
        return (x * 2).to(torch.bfloat16)

    report = coil.explain(fn, x)
    assert "nan_clean" not in report.kernels[0].source
    assert torch.isnan(report.result[:5]).all()
    torch.testing.assert_close(report.result[5:], fn(x)[5:], atol=0, rtol=0)


_UNARY = [torch.neg, torch.abs, torch.sqrt, torch.rsqrt, torch.reciprocal, torch.square, torch.relu]
_BINARY = [torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum]


def _random_chain(rng: torch.Generator, depth: int):
    """A random expression over ``x`` and ``y`` of the ops the prover accepts, each op's bf16
    result rounded as eager rounds it."""
    def build(d: int):
        if d == 0:
            return [lambda x, y: x, lambda x, y: y][int(torch.randint(2, (1,), generator=rng))]
        if torch.rand((), generator=rng) < 0.4:
            op, inner = _UNARY[int(torch.randint(len(_UNARY), (1,), generator=rng))], build(d - 1)
            return lambda x, y: op(inner(x, y))
        op = _BINARY[int(torch.randint(len(_BINARY), (1,), generator=rng))]
        left, right = build(d - 1), build(d - 1)
        return lambda x, y: op(left(x, y), right(x, y))
    return build(depth)


def test_random_chains_of_proven_ops_keep_eagers_bits():
    rng = torch.Generator().manual_seed(1)
    x = _bf16_specials()
    y = x[torch.randperm(x.numel(), generator=rng)]
    for _ in range(8):
        fn = _random_chain(rng, 3)
        torch._dynamo.reset()
        want, got = fn(x, y), torch.compile(fn, backend="coil")(x, y)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
