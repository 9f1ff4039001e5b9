"""The elementary math helpers of Coil's Triton kernels (:mod:`.mathlib`): exponentials and
logarithms, sigmoid, pow, hypot, and the trigonometric and hyperbolic functions and their
inverses. Each computes in float64 and rounds once; float64 inputs get the accuracy noted at
each helper."""
from __future__ import annotations

import math

import triton.language as tl
from triton.language.extra.cuda import libdevice

from .interpret import Helper
from .math_exact import coil_copysign, coil_signbit

# Constexpr globals, as in :mod:`.math_exact`.
_INF = tl.constexpr(math.inf)
_PI = tl.constexpr(math.pi)
_PI_2 = tl.constexpr(math.pi / 2)
_PI_4 = tl.constexpr(math.pi / 4)
_TAN_PI_8 = tl.constexpr(math.tan(math.pi / 8))
_LN2 = tl.constexpr(math.log(2))
_INV_LN10 = tl.constexpr(1 / math.log(10))
_ATAN_TERMS = tl.constexpr(22)     # Taylor terms on |u| <= tan(pi/8): 0.172**22 / 45 < 1e-18


# --- exponentials and logarithms -------------------------------------------------------------

@Helper
def expm1_64(x):
    # Kahan: (u - 1) * x / log(u) cancels the rounding error of u = exp(x). float64: 2 ulp.
    u = tl.exp(x)
    r = (u - 1.0) * (x / tl.log(u))
    r = tl.where(u == 1.0, x, r)
    r = tl.where(x < -40.0, -1.0, r)  # -1 + e^x rounds to -1; log(u) of a subnormal u is poor
    return tl.where(u == _INF, _INF, r)


@Helper
def log1p_64(x):
    # Goldberg: log(u) * x / (u - 1) cancels the rounding error of u = 1 + x. float64: 2 ulp.
    u = 1.0 + x
    r = tl.log(u) * (x / (u - 1.0))
    r = tl.where(u == 1.0, x, r)
    return tl.where(x == _INF, _INF, r)


@Helper
def coil_expm1(x):
    return expm1_64(x.to(tl.float64)).to(x.dtype)


@Helper
def coil_log1p(x):
    return log1p_64(x.to(tl.float64)).to(x.dtype)


@Helper
def coil_log10(x):
    return (tl.log(x.to(tl.float64)) * _INV_LN10).to(x.dtype)  # float64: 3 ulp


@Helper
def coil_sigmoid(x):
    # exp(-|x|) never overflows, so tiny results keep their precision. float64: 2 ulp.
    xd = x.to(tl.float64)
    e = tl.exp(-tl.abs(xd))
    return tl.where(xd >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).to(x.dtype)


@Helper
def coil_sigmoid_gpu(x):
    # ATen's CUDA formula, with a correctly rounded reciprocal. tl.sigmoid is
    # ex2.approx.f32(x * log2e) and div.full.f32: the rounding of x * log2e alone costs
    # ~20 ulp at |x| = 80.
    return libdevice.rcp_rn(1.0 + libdevice.exp(-x))


@Helper
def coil_pow(x, y):
    # C pow: exp2(y * log2|x|) in float64, then the sign and the special cases of C99
    # Annex F. float64: 1.3e-13 relative (566 ulp), the rounding of y * log2|x| magnified.
    xd = x.to(tl.float64)
    yd = y.to(tl.float64)
    y_int = tl.floor(yd) == yd
    y_odd = y_int & (tl.abs(yd) % 2.0 == 1.0)
    r = tl.exp2(yd * tl.log2(tl.abs(xd)))
    r = tl.where(coil_signbit(xd) & y_odd, r * -1.0, r)
    r = tl.where((xd < 0.0) & (xd > -_INF) & (y_int == 0), float("nan"), r)
    r = tl.where((xd == -1.0) & (tl.abs(yd) == _INF), 1.0, r)
    return tl.where((xd == 1.0) | (yd == 0.0), 1.0, r).to(x.dtype)


@Helper
def coil_hypot(x, y):
    # Scaled so float64 inputs do not overflow; inf wins over NaN as in C. float64: 2 ulp.
    ax = tl.abs(x.to(tl.float64))
    ay = tl.abs(y.to(tl.float64))
    hi = tl.maximum(ax, ay)
    q = tl.minimum(ax, ay) / hi
    r = tl.where(hi == 0.0, 0.0, hi * tl.sqrt(1.0 + q * q))
    return tl.where((ax == _INF) | (ay == _INF), _INF, r).to(x.dtype)


# --- trigonometric and hyperbolic -------------------------------------------------------------

@Helper
def _atan_64(x):
    # Reduce to |u| <= tan(pi/8) with atan(t) = pi/2 - atan(1/t) and
    # atan(t) = pi/4 + atan((t - 1) / (t + 1)); then the Taylor series. float64: 1 ulp.
    a = tl.abs(x)
    inv = a > 1.0
    t = tl.where(inv, 1.0 / a, a)
    mid = t > _TAN_PI_8
    u = tl.where(mid, (t - 1.0) / (t + 1.0), t)
    u2 = u * u
    p = u2 * 0.0 + 1.0 / (2 * _ATAN_TERMS + 1)
    for k in tl.static_range(_ATAN_TERMS - 1, -1, -1):
        p = p * -u2 + 1.0 / (2 * k + 1)
    r = tl.where(mid, u * p + _PI_4, u * p)  # where(c, scalar, scalar) would be float32
    r = tl.where(inv, -r + _PI_2, r)
    return coil_copysign(r, x)


@Helper
def _atan2_64(y, x):
    # C atan2, signed zeros and infinities included. float64: 2 ulp.
    ax = tl.abs(x)
    ay = tl.abs(y)
    swap = ay > ax
    t = _atan_64(tl.where(swap, ax / ay, ay / ax))
    t = tl.where(swap, -t + _PI_2, t)
    t = tl.where((ax == _INF) & (ay == _INF), _PI_4, t)
    t = tl.where((ax == 0.0) & (ay == 0.0), 0.0, t)
    t = tl.where(coil_signbit(x), -t + _PI, t)
    return coil_copysign(t, y)


@Helper
def coil_tan(x):
    # The interpreter's sin and cos (numpy) reduce huge arguments exactly. float64: 2 ulp.
    xd = x.to(tl.float64)
    return (tl.sin(xd) / tl.cos(xd)).to(x.dtype)


@Helper
def coil_atan(x):
    return _atan_64(x.to(tl.float64)).to(x.dtype)


@Helper
def coil_atan2(y, x):
    return _atan2_64(y.to(tl.float64), x.to(tl.float64)).to(y.dtype)


@Helper
def coil_asin(x):
    # (1 - x)(1 + x) keeps full precision near |x| = 1; |x| > 1 gives sqrt(<0) = NaN.
    # float64: 3 ulp.
    xd = x.to(tl.float64)
    return _atan2_64(xd, tl.sqrt((1.0 - xd) * (1.0 + xd))).to(x.dtype)


@Helper
def coil_acos(x):
    xd = x.to(tl.float64)
    return (2.0 * _atan2_64(tl.sqrt(1.0 - xd), tl.sqrt(1.0 + xd))).to(x.dtype)  # float64: 3 ulp


@Helper
def coil_sinh(x):
    # (e + e / (e + 1)) / 2 with e = expm1|x| has no cancellation; past 20 it is exp|x| / 2,
    # formed as (h / 2) * h with h = exp(|x| / 2) so float64 overflows only where sinh does.
    a = tl.abs(x.to(tl.float64))
    e = expm1_64(a)
    h = tl.exp(0.5 * a)
    r = tl.where(a > 20.0, (0.5 * h) * h, 0.5 * (e + e / (e + 1.0)))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)  # float64: 2 ulp


@Helper
def coil_cosh(x):
    a = tl.abs(x.to(tl.float64))
    e = tl.exp(a)
    h = tl.exp(0.5 * a)
    return tl.where(a > 20.0, (0.5 * h) * h, 0.5 * (e + 1.0 / e)).to(x.dtype)  # float64: 2 ulp


@Helper
def coil_tanh(x):
    # t / (t + 2) with t = expm1(2|x|); tanh rounds to 1 in float64 beyond 19.1.
    # float64: 2 ulp.
    a = tl.abs(x.to(tl.float64))
    t = expm1_64(2.0 * a)
    r = tl.where(a > 40.0, 1.0, t / (t + 2.0))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)


@Helper
def coil_asinh(x):
    # log1p(a + a^2 / (1 + sqrt(1 + a^2))) is accurate near 0; log(2a) past 2^28.
    # float64: 2 ulp.
    a = tl.abs(x.to(tl.float64))
    a2 = a * a
    r = tl.where(a > 268435456.0, tl.log(a) + _LN2,
                 log1p_64(a + a2 / (1.0 + tl.sqrt(1.0 + a2))))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)


@Helper
def coil_acosh(x):
    # log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact near 1); log(2x) past 2^28.
    # float64: 2 ulp.
    xd = x.to(tl.float64)
    t = xd - 1.0
    r = tl.where(xd > 268435456.0, tl.log(xd) + _LN2, log1p_64(t + tl.sqrt(2.0 * t + t * t)))
    return tl.where(xd < 1.0, float("nan"), r).to(x.dtype)


@Helper
def coil_atanh(x):
    # log1p(2a / (1 - a)) / 2; 1 - a is exact near 1, and |x| > 1 reaches log1p(< -1) = NaN.
    a = tl.abs(x.to(tl.float64))
    r = 0.5 * log1p_64(2.0 * a / (1.0 - a))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)  # float64: 2 ulp
