"""The exact math helpers of Coil's Triton kernels (:mod:`.mathlib`): bit-level tests (isnan,
isinf, signbit), copysign and nextafter, and rounding and remainders (fmod, remainder, trunc,
round). Exact for any float dtype."""
from __future__ import annotations

import math

import triton.language as tl
from triton.language.extra.cuda import libdevice

from .interpret import Helper

# Named constants are constexpr globals: a float assigned inside a helper would become a
# float32 tensor. They go right of a tensor operand: ``constexpr - tensor`` misbehaves in
# the interpreter. NaN is spelled inline: a NaN constexpr global fails Triton's check that a
# global is unchanged between compiles (NaN != NaN).
_INF = tl.constexpr(math.inf)


@Helper
def _bits(x):
    """The float's bits as a signed integer of its width (negative iff the sign bit is set)."""
    if x.dtype == tl.float64:
        return x.to(tl.int64, bitcast=True)
    elif x.dtype == tl.float32:
        return x.to(tl.int32, bitcast=True)
    else:
        return x.to(tl.int16, bitcast=True)


@Helper
def coil_isnan(x):
    return x != x


@Helper
def coil_isinf(x):
    return tl.abs(x) == _INF


@Helper
def coil_signbit(x):
    # Bits, not ``x < 0``: -0.0 and negative NaNs count, as in torch.signbit.
    return _bits(x) < 0


@Helper
def coil_copysign(x, y):
    # Triton's unary minus is 0 - x, which gives +0.0 for x = 0; * -1 flips the sign of zero.
    return tl.where(coil_signbit(y), tl.abs(x) * -1.0, tl.abs(x))


@Helper
def coil_nextafter(x, y):
    # Stepping the bit pattern by one is C's nextafter, subnormals included.
    b = _bits(x)
    away = (y > x) == (x > 0)  # away from zero the magnitude bits grow
    r = tl.where(away, b + 1, b - 1).to(x.dtype, bitcast=True)
    tiny = (b * 0 + 1).to(x.dtype, bitcast=True)  # the smallest subnormal
    r = tl.where(x == 0, tl.where(y > 0, tiny, -tiny), r)
    r = tl.where(x == y, y, r)
    return tl.where((x != x) | (y != y), x + y, r)


@Helper
def coil_fmod(x, y):
    # Interpreter only: it evaluates float % with numpy.fmod (exact). On the GPU ``%`` is
    # x - trunc(x / y) * y, inexact for large quotients; the GPU spelling is libdevice.fmod.
    return x % y


@Helper
def _floor_mod(r, y):
    # ATen's recipe from a C remainder to Python's: the sign follows the divisor.
    return tl.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


@Helper
def coil_remainder(x, y):
    return _floor_mod(x % y, y)


@Helper
def coil_remainder_gpu(x, y):
    return _floor_mod(libdevice.fmod(x, y), y)


@Helper
def coil_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@Helper
def coil_round(x):
    # Half to even on |x|, where |x| - floor(|x|) is exact; inf and NaN pass through.
    a = tl.abs(x)
    f = tl.floor(a)
    d = a - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    return coil_copysign(r, x)
