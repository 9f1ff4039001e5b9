"""Triton helper functions the generated kernels call: NaN-propagating max/min, the combine
functions of multi-value reductions (argmax/argmin), and integer division with
Python's (or C's) rounding.

They are plain functions here; :func:`coil_cuda_triton.loader.namespace` wraps each with
``triton.jit`` (or Triton's interpreter) so generated kernels call them like builtins."""
from __future__ import annotations

import triton.language as tl


def max_nan(a, b):
    # NaN wins, as in ATen (tl.maximum returns the non-NaN operand)
    return tl.where(a != a, a, tl.where(a > b, a, b))


def min_nan(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))


def clamp_below(a, b):
    # clamp_min: only a's NaN propagates (a NaN bound is ignored, as torch 2.11's clamp)
    return tl.where(a < b, b, a)


def clamp_above(a, b):
    return tl.where(a > b, b, a)


def add_combine(a, b):
    return a + b


def mul_combine(a, b):
    return a * b


def or_combine(a, b):
    return a | b


def and_combine(a, b):
    return a & b


def argmax_combine(va, ia, vb, ib):
    # the first index of the largest value; NaN counts as the largest
    a_nan = va != va
    b_nan = vb != vb
    pick_a = (va > vb) | (a_nan & ~b_nan) | (((va == vb) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(pick_a, va, vb), tl.where(pick_a, ia, ib)


def argmin_combine(va, ia, vb, ib):
    a_nan = va != va
    b_nan = vb != vb
    pick_a = (va < vb) | (a_nan & ~b_nan) | (((va == vb) | (a_nan & b_nan)) & (ia < ib))
    return tl.where(pick_a, va, vb), tl.where(pick_a, ia, ib)


def int_floordiv(a, b):
    # Python's floor division; division by zero gives 0 (Coil's contract), not a trap. A
    # divisor of -1 negates (INT_MIN wraps to itself, as eager): LLVM leaves INT_MIN / -1
    # undefined
    if a.dtype.is_int_signed():
        minus = b == -1
        safe = tl.where((b == 0) | minus, 1, b)
        q = tl.where(minus, 0 - a, a // safe)
    else:
        safe = tl.where(b == 0, 1, b)
        q = a // safe
    fix = ((a % safe) != 0) & ((a < 0) != (safe < 0))
    return tl.where(b == 0, 0, tl.where(fix, q - 1, q))


def int_truncdiv(a, b):
    if a.dtype.is_int_signed():
        minus = b == -1
        safe = tl.where((b == 0) | minus, 1, b)
        return tl.where(b == 0, 0, tl.where(minus, 0 - a, a // safe))
    safe = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a // safe)


def int_remainder(a, b):
    # x % -1 is 0: the divisor becomes 1 (INT_MIN % -1 is undefined in LLVM)
    if a.dtype.is_int_signed():
        safe = tl.where((b == 0) | (b == -1), 1, b)
    else:
        safe = tl.where(b == 0, 1, b)
    r = a % safe
    fix = (r != 0) & ((r < 0) != (safe < 0))
    return tl.where(b == 0, 0, tl.where(fix, r + safe, r))


def int_fmod(a, b):
    if a.dtype.is_int_signed():
        safe = tl.where((b == 0) | (b == -1), 1, b)
    else:
        safe = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a % safe)


def int_pow(a, b):
    # a ** b of integers by repeated squaring, wrapping as eager's kernels (the float pow
    # truncated 3 ** 3 to 26 and saturated on overflow); a negative exponent gives 1 for a
    # base of 1, +-1 for -1 and 0 otherwise, as eager
    base = a + b * 0
    e = b + a * 0
    result = base * 0 + 1
    for _ in tl.static_range(tl.constexpr(a.dtype.primitive_bitwidth)):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    if a.dtype.is_int_signed():
        odd = (b & 1) != 0
        negative = tl.where(a == 1, 1, tl.where(a == -1, tl.where(odd, -1, 1), 0))
        result = tl.where(b < 0, negative, result)
    return result.to(a.dtype)


def int_shift_left(a, b):
    # a count below 0 or at least the width shifts every bit out, as eager's kernels (LLVM
    # leaves such a shift undefined: a constant count >= the width stored garbage on the H100)
    out = (b < 0) | (b >= a.dtype.primitive_bitwidth)
    return tl.where(out, 0, a << tl.where(out, 0, b)).to(a.dtype)


def int_shift_right(a, b):
    out = (b < 0) | (b >= a.dtype.primitive_bitwidth)
    shifted = a >> tl.where(out, 0, b)
    if a.dtype.is_int_signed():
        return tl.where(out, tl.where(a < 0, -1, 0), shifted).to(a.dtype)
    return tl.where(out, 0, shifted).to(a.dtype)


def round_bf16(x):
    # float32 -> nearest bfloat16 (ties to even), as float32: the interpreter's own
    # conversion truncates, the GPU's rounds; CI spells narrowing with this
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


def loop_bound(n):
    # the trip count of a loop over a runtime size (see interpreted_loop_bound)
    return n


def interpreted_loop_bound(n):
    """The interpreter's spelling of :func:`loop_bound`: its scalar arguments are 1-element
    numpy arrays, which ``range`` cannot take under numpy 2."""
    handle = getattr(n, "handle", None)
    return int(handle.data.reshape(-1)[0]) if handle is not None else int(n)


HELPERS = ("loop_bound", "round_bf16", "max_nan", "min_nan", "clamp_below", "clamp_above", "add_combine",
           "mul_combine", "or_combine", "and_combine",
           "argmax_combine", "argmin_combine", "int_floordiv", "int_truncdiv",
           "int_remainder", "int_fmod", "int_pow", "int_shift_left", "int_shift_right")
