"""Eager's results at the edges of arithmetic, found by a hunt against eager (session 28):
float floor division (from ``fmod``, as c10's ``div_floor_floating``, not ``floor(a / b)``),
``clamp`` with a NaN bound (NaN, as eager; a NaN scalar bound is ignored by torch 2.11's
eager and followed there too), the sign of a NaN (0, as ATen's ``(0 < x) - (x <
0)``), integer division by -1 (a wrapping negation: ``INT_MIN // -1`` trapped with SIGFPE
in the C++ plugin and killed the process) and by zero (eager's CPU kernels raise; the C++
plugin returned 0)."""
from __future__ import annotations

import platform

import pytest
import torch

from conftest import TEST_BACKEND
from helpers import check, cpu_routed_to, cpu_tensors

NAN = float("nan")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_division_of_exact_multiples_is_exact(dtype):
    """``a / b`` where ``a`` is a multiple of ``b``, then truncated: eager's CUDA kernels divide
    as IEEE does, so the quotient is the integer. The Triton plugin's float32 ``/`` was
    ``div.full.f32`` (2 ulp): on an H100 2.7% of these quotients truncated one below eager's
    (session 42). Checked bit for bit with the reciprocal and plain division too."""
    g = torch.Generator().manual_seed(0)
    b = torch.randint(1, 100, (1 << 16,), generator=g).to(dtype)
    a = (torch.randint(-30, 30, (1 << 16,), generator=g).to(dtype) * b).to(dtype)
    check(lambda a, b: (torch.div(a, b, rounding_mode="trunc"), a / b, b.reciprocal(), torch.trunc(a / b)),
          a, b, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_float_floor_division_matches_eager(dtype):
    a = torch.tensor([3.0, 1.0, 0.7, -3.0, 1.0, -0.7, 5.0, -5.0, 0.0, -0.0, 7.5, NAN, float("inf")])
    b = torch.tensor([0.3, 0.1, 0.1, 0.3, -0.1, 0.1, 0.0, 0.0, 3.0, 3.0, -2.0, 1.0, 2.0])
    a, b = a.to(dtype), b.to(dtype)
    fns = [lambda a, b: a // b, lambda a, b: torch.div(a, b, rounding_mode="floor"),
           lambda a, b: torch.floor_divide(a, 0.1)]
    if dtype != torch.bfloat16:  # eager's bf16 results here depend on its vector or scalar path
        fns.append(lambda a, b: (a * 10) // b + a % b)
    for f in fns:
        got = torch.compile(f, backend="coil")(a, b)
        expected = f(a, b)
        torch.testing.assert_close(got, expected, atol=0, rtol=0, equal_nan=True)
        numbers = ~expected.isnan()
        assert torch.equal(torch.signbit(got[numbers]), torch.signbit(expected[numbers]))  # -0.0 as eager's
        torch._dynamo.reset()
    x = torch.randn(4096, dtype=torch.float64) * 100
    check(lambda x, y: x // y, x, torch.rand(4096, dtype=torch.float64) * 2 - 1, atol=0, rtol=0)


@pytest.mark.parametrize("f", [
    lambda x, t: x.clamp(min=NAN), lambda x, t: x.clamp(max=NAN), lambda x, t: x.clamp(min=t),
    lambda x, t: x.clamp(max=t), lambda x, t: torch.clamp(x, t, t + 1), lambda x, t: x.clamp(min=t[:1]),
], ids=["min_nan", "max_nan", "min_tensor", "max_tensor", "both_tensors", "broadcast_bound"])
def test_clamp_with_a_nan_bound_is_nan_as_in_eager(f):
    x = torch.tensor([1.0, -2.0, NAN, 4.0])
    t = torch.tensor([NAN, 0.0, 0.0, NAN])
    check(f, x, t)


def test_clamp_ignores_a_nan_number_as_bound_where_eager_does(monkeypatch):
    """torch 2.11's ``clamp`` ignores a NaN number as bound, on the CPU and CUDA (2.13 returns
    NaN): ``clamp_min``/``clamp_max`` then carry only x's NaN. The Triton plugin spelled them
    with the NaN-propagating maximum and returned NaN everywhere (found on an H100 with torch
    2.11, session 31); this forces 2.11's behaviour under any torch."""
    from coil.lowering import pointwise
    monkeypatch.setattr(pointwise, "NAN_SCALAR_BOUND_PROPAGATES", False)
    x = torch.tensor([1.0, -2.0, NAN, 4.0])
    cases = [(lambda x: x.clamp(min=NAN), x), (lambda x: x.clamp(max=NAN), x), (lambda x: x.clamp(NAN, NAN), x),
             (lambda x: x.clamp(min=0.0), torch.tensor([1.0, 0.0, NAN, 4.0]))]
    for f, expected in cases:
        torch.testing.assert_close(torch.compile(f, backend="coil")(x), expected, equal_nan=True)
        torch._dynamo.reset()


def test_the_sign_of_nan_is_zero_as_in_eager():
    x = torch.tensor([NAN, -1.0, 0.0, -0.0, 2.0, float("-inf")])
    check(lambda x: x.sign() + x.sgn() * 2, x)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_division_by_minus_one_wraps_as_in_eager(dtype):
    low = torch.iinfo(dtype).min
    a = torch.tensor([low, 7, -7, low + 1], dtype=dtype)
    b = torch.tensor([-1, -1, -1, -1], dtype=dtype)
    check(lambda a, b: (a // b, a % b, torch.fmod(a, b)), a, b)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_signed_integer_overflow_wraps_as_in_eager(dtype):
    """Eager's integer arithmetic wraps (two's complement). In C++ a signed overflow is
    undefined, and GCC at -O3 folded ``(x + 1) > x`` to true, ``(x * 2) // 2`` to x and
    ``x.abs() >= 0`` to true (found by a hunt, session 34): the C++ plugin builds with
    ``-fwrapv``."""
    info = torch.iinfo(dtype)
    x = torch.tensor([info.max, info.min, -5, 7, info.min + 1], dtype=dtype)
    check(lambda x: ((x + 1) > x, (x * 2) // 2, x.abs() >= 0, (x * 2) > 0, x.abs() % 20,
                     torch.maximum(x + 1, x), torch.minimum(x - 1, x), (x * 3) // 3, -x > 0), x)
    y = torch.tensor([info.max, info.max, 3], dtype=dtype)
    check(lambda y: (y.sum(), y.cumsum(0), y.prod()), y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_constants_hold_the_half_value(dtype):
    """A half tensor made by ``full``, ``full_like`` or ``fill_`` holds the fill rounded to
    its type; fused into a consumer computing in float32, the fill was read unrounded (0.1
    where eager's tensor holds 0.0999755859375; found by a hunt, session 34)."""
    x = torch.tensor([1000.0, 3.0, 0.001, 7.0, -2.5], dtype=dtype)
    check(lambda x: (torch.full_like(x, 0.1) * x, torch.full((5,), 0.1, dtype=dtype) + x,
                     torch.full_like(x, 0.1).float() + x.float(), torch.empty_like(x).fill_(3.3) * x),
          x, atol=0, rtol=0)


@pytest.mark.skipif(TEST_BACKEND == "triton", reason="the cpu device served by the Triton plugin, "
                    "which follows eager's CUDA add: eager's CPU add rounds the number")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_scalar_operands_as_in_eager(dtype):
    """A Python number with a half tensor: eager rounds it to the half type for
    ``remainder``, ``fmod``, ``pow`` and ``atan2``, reads it unrounded for ``mul`` and ``div``,
    and for ``add`` and ``sub`` (and ``alpha``) rounds it on the CPU only
    (``Capabilities.half_add_scalars_rounded``); ``a + alpha * b`` is rounded once. ``(x +
    1000.7) - 1000.7`` gave 9.797 for 10 in float16 on the CPU (session 34); on an H100 eager's
    ``add`` read 1000.7 unrounded, as the Triton plugin does, and its ``x % 0.1`` rounded
    0.1 where the Triton plugin did not. 64 elements: eager's CPU ``add`` with ``alpha``
    rounds ``alpha * b`` to the half type in its scalar loop (a tensor's last few elements)
    but not in its vector loop."""
    x = torch.tensor([10.0, 7.0, 1.0, -20.0, 0.001, 2.7, 0.3, 5.1], dtype=dtype).repeat(8)
    y = torch.linspace(-3, 3, 64, dtype=dtype)
    check(lambda x, y: ((x + 1000.7) - 1000.7, x % 0.1, torch.fmod(x, 0.3), x + 3.3, 3.3 - x,
                        x.abs() ** 0.3333, 1e5 ** (x / 40), x * 3.3, x / 3.3, torch.add(x, y, alpha=0.1),
                        torch.sub(x, y, alpha=3.3), torch.atan2(x, torch.tensor(0.3))),
          x, y, atol=0, rtol=0)


def test_integer_powers_constants_and_uint8_casts_as_in_eager():
    """Cases the Triton plugin computed with Triton's or LLVM's semantics (session 31; see
    ``tests/test_triton_semantics.py``): here for the GPU run."""
    i32, u8 = torch.int32, torch.uint8
    check(lambda a, b: a ** b, torch.tensor([-3, 3, 7, 2, -1, 5], dtype=i32),
          torch.tensor([3, 25, 0, -1, -3, 13], dtype=i32), atol=0, rtol=0)
    check(lambda a: (a + -1, a == -1, a * 300), torch.tensor([0, 255, 7], dtype=u8), atol=0, rtol=0)
    check(lambda x: (x * 1).to(u8), torch.tensor([-1.0, -2.5, 3.7, 255.0]), atol=0, rtol=0)
    check(lambda a: a.cumsum(0), torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.skipif(TEST_BACKEND != "cpu_cpp" or torch.get_default_device().type != "cpu",
                    reason="eager raises on the CPU only; the C++ plugin's check")
@pytest.mark.parametrize("f", [lambda a, b: a // b, lambda a, b: a % b, lambda a, b: torch.fmod(a, b) + 1,
                               lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                               lambda a, b: (a // b).sum()], ids=["floordiv", "remainder", "fmod", "trunc", "in_a_sum"])
def test_integer_division_by_zero_raises_as_in_eager(f):
    a, b = torch.tensor([7, -7, 3, 9]), torch.tensor([1, 2, 0, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, b)
    compiled = torch.compile(f, backend="coil")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, b)
    b[2] = 5  # the same compiled graph, no zero: no error, eager's values (the flag was cleared)
    torch.testing.assert_close(compiled(a, b), f(a, b))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_shifts_by_any_count_match_eager(dtype):
    """A count below 0 or at least the width shifts every bit out, as eager's kernels: C++
    leaves it undefined, and the C++ plugin returned ``a`` unshifted for ``a >> 32`` of int32
    in the scalar tail of a loop (found by a hunt against eager, session 29)."""
    info = torch.iinfo(dtype)
    a = torch.tensor([5, -5, 100, 27, 7, 9, 11, info.min, info.max, 0, 1] * 3).clamp(info.min, info.max).to(dtype)
    counts = [0, 1, 3, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 100] + ([] if dtype == torch.uint8 else [-1, -9])
    for c in counts:
        for f in (lambda a: a >> c, lambda a: a << c):
            check(f, a)
            torch._dynamo.reset()
    b = torch.tensor(counts * 3)[: a.numel()].to(dtype)
    check(lambda a, b: (a >> b, a << b), a, b)


@pytest.mark.parametrize("f, x", [
    (lambda a: a ** -1, torch.tensor([1, -1, 2, 3])),
    (lambda a: a.clamp(-300, 300), torch.tensor([100, -100, 5], dtype=torch.int8)),
    (lambda a: a.masked_fill(a > 1, 300), torch.tensor([0, 5, 7], dtype=torch.uint8)),
    (lambda a: (a + 1).fill_(200), torch.tensor([0, 5, 7], dtype=torch.int8)),
], ids=["int_pow_negative", "int8_clamp", "uint8_masked_fill", "int8_fill"])
def test_scalars_eager_rejects_raise_as_in_eager(f, x):
    """An integer to a negative power, and a scalar that does not fit the integer dtype it is
    converted to: eager raises; the kernels returned 1/-1/0 and wrapped bounds (300 -> 44).
    (``uint8.masked_fill(m, -1.7)`` still gives 255: torch's decomposition converts the float
    without a check, for Inductor too.)"""
    with pytest.raises(RuntimeError):
        f(x.clone())
    with pytest.raises(RuntimeError, match="negative integer powers|without overflow"):
        torch.compile(f, backend="coil")(x.clone())
    fits = {"int8": torch.tensor([100, -100, 5], dtype=torch.int8)}
    check(lambda a: a.clamp(-100, 100).masked_fill(a > 50, 127) * 1, fits["int8"])


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_of_another_dtype_raises_as_in_eager(accumulate):
    """ATen's ``index_put`` refuses values of another dtype; Coil cast them (session 30)."""
    def f(x, v):
        x.index_put_((torch.tensor([1, 3]),), v, accumulate=accumulate)
        return x

    for fn in (f, torch.compile(f, backend="coil")):
        with pytest.raises(RuntimeError, match="dtypes match|expected scalar type"):  # CPU 2.13 | CUDA 2.11
            fn(torch.arange(5), torch.tensor([0.5, 1.5]))
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("f", [lambda x: x == 3.3, lambda x: x < 1.001, lambda x: x == 257,
                               lambda x: x <= torch.tensor(3.3), lambda x: x.ne(2049)],
                         ids=["eq", "lt", "eq_int", "le_0dim", "ne_int"])
def test_half_comparisons_round_the_other_side_as_in_eager(f, dtype):
    """Eager compares a half tensor with a number in the half type (3.3 becomes 3.296875 in
    bf16); Coil compared in float32 with the number as written (session 30)."""
    x = torch.tensor([3.3, 1.001, 256.0, 257.0, 2048.0, 2049.0, 3.29, -1.0]).to(dtype)
    assert torch.equal(torch.compile(f, backend="coil")(x), f(x))
    torch._dynamo.reset()


@pytest.mark.parametrize("f, x", [
    (lambda x: x * 2 - x, torch.tensor([True, False])),
    (lambda x: True - x, torch.tensor([1, 2])),
    (lambda x: x.clamp(min=1e10), torch.tensor([0.0, 2.0], dtype=torch.float16)),
    (lambda x: torch.full_like(x, -1e10), torch.tensor([0.0, 2.0], dtype=torch.float16)),
    # eager has no bool kernel for these (session 34's hunt: Coil returned 0, [1, 1], False)
    (lambda x: x.argmax(), torch.tensor([True, False, True])),
    (lambda x: True ** x, torch.tensor([True, False])),
    (lambda x: x % True, torch.tensor([True, False])),
    (lambda x: x.abs(), torch.tensor([True, False])),  # session 38's hunt: Coil returned x
    # a scalar past the half range that eager converts to the type, checked (Coil gave inf)
    (lambda x: x ** 1e5, torch.tensor([1.0, 2.0, -3.0], dtype=torch.float16)),
    (lambda x: torch.add(x, x, alpha=1e5), torch.tensor([1.0, 2.0, -3.0], dtype=torch.float16)),
], ids=["bool_sub", "rsub_bool", "half_clamp_overflow", "half_full_overflow", "bool_argmax", "bool_pow",
        "bool_remainder", "bool_abs", "half_pow_overflow",
        "half_alpha_overflow"])
def test_what_eager_rejects_raises_as_in_eager(f, x):
    """Subtraction with a bool operand, and a number past a half type's range, raise in eager;
    Coil computed them (an int, or inf; session 30). Eager on the GPU machine (CUDA, torch
    2.11) takes a number past the half range and computes with it: there the compiled result
    must be eager's."""
    try:
        expected = f(x)
    except RuntimeError:
        expected = None
    if expected is not None:
        torch.testing.assert_close(torch.compile(f, backend="coil")(x), expected, equal_nan=True)
        return
    for fn in (f, torch.compile(f, backend="coil")):
        with pytest.raises(RuntimeError):
            fn(x)
    torch._dynamo.reset()


@pytest.mark.parametrize("shape,dims", [((0, 7), None), ((7, 0), 1), ((2, 3, 0, 5), (2, 3))])
def test_reductions_over_nothing(shape, dims):
    """Eager's 0, NaN and -inf for reductions over no elements (the Triton plugin loaded an
    empty extent unmasked: a hunt against eager, session 33; tests/test_triton_semantics.py
    holds the interpreter's run)."""
    x = torch.randn(shape)
    for f in (lambda x: x.sum(dims) if dims else x.sum(), lambda x: x.mean(dims) if dims else x.mean(),
              lambda x: x.logsumexp(dims if dims else (0, 1))):
        torch._dynamo.reset()
        check(f, x)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.int64])
@pytest.mark.parametrize("space", ["linspace", "logspace"])
def test_linspace_and_logspace_as_eager_computes_them(dtype, space):
    """PyTorch's decompositions of ``linspace`` and ``logspace`` compute a half type's step in
    float32 and do not wrap a uint8 start as eager's CPU kernel does (found by a hunt); Coil
    decomposes them in float32 and float64 only. Eager's CPU kernel is the reference: the CPU
    is the default device here, since Dynamo 2.11 puts a factory of a CUDA default device on
    the CPU when the graph's inputs are there (Inductor as well)."""
    make = getattr(torch, space)
    end = 3.0 if space == "logspace" else 120

    def f(x):
        return make(-7, end, 37, dtype=dtype) + x.to(dtype)
    z = torch.zeros((), device="cpu")
    torch._dynamo.reset()
    with cpu_tensors():
        got = torch.compile(f, backend="coil")(z)
        expected = f(z)
    exact = {} if dtype == torch.float32 else {"atol": 0, "rtol": 0}  # float32: within an ulp
    torch.testing.assert_close(got, expected, **exact)
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int16])
def test_signbit_of_every_dtype(dtype):
    """``signbit`` reads the sign bit (-0.0 and -inf too): ``std::signbit`` of a float widened from
    a half type crashed GCC 12's vectoriser in the C++ plugin (an internal compiler error, found
    by a hunt), so a half-type signbit of 8 elements or more failed to compile."""
    x = torch.tensor([-0.0, 0.0, 1.5, -2.5, float("inf"), -float("inf"), 3.0, -7.0] * 5)
    x = x.to(dtype) if dtype.is_floating_point else (x.nan_to_num(posinf=9, neginf=-9) * 3).to(dtype)
    check(torch.signbit, x, atol=0, rtol=0)
    torch._dynamo.reset()
    check(lambda x: torch.signbit(x) ^ (x.abs() > 2), x, atol=0, rtol=0)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="eager's out-of-range casts are x86's")
@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dst", [torch.int8, torch.int16, torch.uint8])
def test_a_float_cast_to_a_narrow_int_and_back(src, dst):
    """Values out of the int's range, inf and NaN take the low bits of a 32-bit truncation, as
    eager's code does on x86 (300.0 -> int8 44, inf -> 0): the C++ plugin's direct cast was
    undefined there, and GCC folded float -> int8 -> float away (300.0 stayed 300, inf stayed
    inf: found by a hunt)."""
    with cpu_tensors():  # eager's CPU casts are the reference (CUDA's saturate)
        x = torch.tensor([300.0, 3.7, -200.0, 70000.5, -1.5, 3e9, float("inf"), -float("inf"), float("nan")] * 3)
        check(lambda x: x.to(dst) * 2.5 + 1, x.to(src), atol=0, rtol=0)


@pytest.mark.parametrize("plugin", ["cpu_cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int64, torch.bool])
def test_bitwise_not_of_every_int_dtype(dtype, plugin):
    """``~x``: Triton's interpreter inverted a uint8 as ``x ^ -1`` and raised (out of uint8's
    range; found by a hunt); the interpreted Triton plugin now spells it ``x ^ 255``."""
    with cpu_tensors(), cpu_routed_to(plugin, f"invert-{plugin}"):
        x = torch.tensor([0, 1, 200, 255, 7, 127] * 3).to(dtype)
        torch._dynamo.reset()
        check(lambda x: ~x, x, atol=0, rtol=0)
        torch._dynamo.reset()
        check(lambda x: (~x) | (x & 3), x, atol=0, rtol=0)


@pytest.mark.skipif(TEST_BACKEND != "cpu_cpp", reason="the C++ plugin's compiler flags")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_product_and_a_sum_round_apart_without_contraction(dtype):
    """``a * b + c`` of two ops rounds the product first in eager, one kernel per op; GCC's
    default contraction fuses them into one rounding: ``relu(0.1 * 10 - 1)`` gave 1.49e-8 and a
    gradient of 10 where eager gives 0 and 0 (a hunt, session 37). The default stays (without
    it ResNet-18's training gradients left eager's tolerance); the option turns it off. CPU
    tensors under any ``COIL_TEST_DEVICE``: the option is the C++ plugin's."""
    options = {"cpu_cpp.extra_cflags": "-ffp-contract=off"}
    with cpu_tensors():
        a = torch.tensor([0.1, 0.3, 0.7], dtype=dtype)
        b = torch.tensor([10.0, 10.0, 10.0], dtype=dtype)
        c = torch.tensor([-1.0, -3.0, -7.0], dtype=dtype)

        def fn(a, b, c):
            return torch.relu(a * b + c), torch.floor((a * b + c) * 1e9), (a * b - 1) * 1e8

        torch._dynamo.reset()
        got = torch.compile(fn, backend="coil", options=options)(a, b, c)
        for g, w in zip(got, fn(a, b, c)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        leaves = [t.clone().requires_grad_() for t in (a, b, c)]
        eager_leaves = [t.clone().requires_grad_() for t in (a, b, c)]
        torch._dynamo.reset()
        torch.compile(lambda a, b, c: torch.relu(a * b + c), backend="coil", options=options)(*leaves).sum().backward()
        torch.relu(eager_leaves[0] * eager_leaves[1] + eager_leaves[2]).sum().backward()
        for g, w in zip(leaves, eager_leaves):
            torch.testing.assert_close(g.grad, w.grad, rtol=0, atol=0)
        torch._dynamo.reset()
