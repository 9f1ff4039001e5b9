"""Math for Coil's Triton kernels: each op's GPU and interpreter spelling, the ``coil_*``
helpers behind them, and :func:`jit`, which makes a single kernel interpreted.

Triton's interpreter (numpy on the CPU; what CI runs) cannot call libdevice, so each op has
two spellings in :data:`SPELLINGS`: for the GPU a Triton builtin or libdevice, chosen from
the PTX each emits for sm_90; for the interpreter a builtin it runs natively (exp, exp2,
log, log2, sin, cos, sqrt, rsqrt, erf, floor, ceil, abs, fma, where, bitcasts, and float
``%`` as C fmod) or a helper built from those. Helpers compute in float64 and round once,
so float32 results measure within 0.51 ulp; float64 inputs get the accuracy noted at each
helper (2-3 ulp for most). All helpers also compile for the GPU.

Interpreting one kernel (verified on triton 3.6.0): ``triton.jit`` reads ``TRITON_INTERPRET``
only when it decorates, so setting the variable around the decorator, or building
``triton.runtime.interpreter.InterpretedFunction(fn)``, gives one interpreted kernel; but that
kernel fails ("Cannot call @triton.jit'd outside of the scope of a kernel") at its first call
of another JIT function: a helper, or ``tl.sum``, ``tl.max``, ``tl.sigmoid``, which Triton
builds at import. And interpreted calls of those functions patch ``tl.core`` without undoing
it, after which ``triton.compile`` of any kernel calling ``tl.sum`` fails in the same
process. (With the variable set before triton is imported, everything is interpreted and no
kernel using ``tl.sum`` compiles at all.) So :func:`jit` (``interpret=True``) returns an
:class:`InterpretedKernel` whose launches run inside :func:`interpreting`: it patches ``tl``
and ``tl.core`` as the interpreter would, routes every JITFunction call to an interpreted
copy, and restores all of it afterwards, leaving other kernels and ahead-of-time compiles
untouched. Helpers are real JITFunctions whatever the variable says, and run interpreted
when an interpreted kernel calls them, so they serve both ways of interpreting. Launches
are not thread-safe."""
from __future__ import annotations

import contextlib
import hashlib
import linecache
import math
import types
from typing import Any, Callable, Iterator

import numpy as np
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice
from triton.runtime import interpreter as _interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


class _Helper(JITFunction):
    """A real JITFunction whatever ``TRITON_INTERPRET`` says (so GPU kernels always compile
    with it) that, when an interpreted kernel calls it, runs interpreted instead of raising."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return InterpretedFunction(self.fn)(*args, **kwargs)


# Named constants are constexpr globals: a float assigned inside a helper would become a
# float32 tensor. They go right of a tensor operand: ``constexpr - tensor`` misbehaves in
# the interpreter. NaN is spelled inline: a NaN constexpr global fails Triton's check that a
# global is unchanged between compiles (NaN != NaN).
_INF = tl.constexpr(math.inf)
_PI = tl.constexpr(math.pi)
_PI_2 = tl.constexpr(math.pi / 2)
_PI_4 = tl.constexpr(math.pi / 4)
_INV_PI = tl.constexpr(1 / math.pi)
_TAN_PI_8 = tl.constexpr(math.tan(math.pi / 8))
_LN2 = tl.constexpr(math.log(2))
_INV_LN10 = tl.constexpr(1 / math.log(10))
_INV_SQRT_PI = tl.constexpr(1 / math.sqrt(math.pi))
_TWO_OVER_SQRT_PI = tl.constexpr(2 / math.sqrt(math.pi))
_HALF_LOG_2PI = tl.constexpr(0.5 * math.log(2 * math.pi))
_EULER_GAMMA = tl.constexpr(0.5772156649015329)
_ATAN_TERMS = tl.constexpr(22)     # Taylor terms on |u| <= tan(pi/8): 0.172**22 / 45 < 1e-18
_ERFC_CF_TERMS = tl.constexpr(40)  # continued-fraction depth for x >= 2 (error 6e-14 at 40)
# (-1)^k (zeta(k) - 1) / k, k = 2..18: Taylor series of lgamma(2 + e) (A&S 6.1.33).
_LGAMMA2 = tl.constexpr((
    0.3224670334241132, -0.0673523010531981, 0.020580808427784546, -0.007385551028673986,
    0.0028905103307415234, -0.001192753911703261, 0.0005096695247430425,
    -0.00022315475845357939, 9.945751278180853e-05, -4.492623673813314e-05,
    2.050721277567069e-05, -9.439488275268397e-06, 4.374866789907488e-06,
    -2.039215753801366e-06, 9.55141213040742e-07, -4.492469198764566e-07, 2.1207184805554665e-07))
# Lanczos g = 7, n = 9 (Godfrey's coefficients).
_LANCZOS = tl.constexpr((
    0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
    -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
    1.5056327351493116e-7))
# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), float32 fits.
_GILES_CENTRAL = tl.constexpr((
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941))
_GILES_TAIL = tl.constexpr((
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682))


# --- bit-level and rounding helpers: exact, any float dtype ---------------------------------

@_Helper
def _bits(x):
    """The float's bits as a signed integer of its width (negative iff the sign bit is set)."""
    if x.dtype == tl.float64:
        return x.to(tl.int64, bitcast=True)
    elif x.dtype == tl.float32:
        return x.to(tl.int32, bitcast=True)
    else:
        return x.to(tl.int16, bitcast=True)


@_Helper
def coil_isnan(x):
    return x != x


@_Helper
def coil_isinf(x):
    return tl.abs(x) == _INF


@_Helper
def coil_signbit(x):
    # Bits, not ``x < 0``: -0.0 and negative NaNs count, as in torch.signbit.
    return _bits(x) < 0


@_Helper
def coil_copysign(x, y):
    # Triton's unary minus is 0 - x, which gives +0.0 for x = 0; * -1 flips the sign of zero.
    return tl.where(coil_signbit(y), tl.abs(x) * -1.0, tl.abs(x))


@_Helper
def coil_nextafter(x, y):
    # Stepping the bit pattern by one is C's nextafter, subnormals included.
    b = _bits(x)
    away = (y > x) == (x > 0)  # away from zero the magnitude bits grow
    r = tl.where(away, b + 1, b - 1).to(x.dtype, bitcast=True)
    tiny = (b * 0 + 1).to(x.dtype, bitcast=True)  # the smallest subnormal
    r = tl.where(x == 0, tl.where(y > 0, tiny, -tiny), r)
    r = tl.where(x == y, y, r)
    return tl.where((x != x) | (y != y), x + y, r)


@_Helper
def coil_fmod(x, y):
    # Interpreter only: it evaluates float % with numpy.fmod (exact). On the GPU ``%`` is
    # x - trunc(x / y) * y, inexact for large quotients; the GPU spelling is libdevice.fmod.
    return x % y


@_Helper
def _floor_mod(r, y):
    # ATen's recipe from a C remainder to Python's: the sign follows the divisor.
    return tl.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


@_Helper
def coil_remainder(x, y):
    return _floor_mod(x % y, y)


@_Helper
def coil_remainder_gpu(x, y):
    return _floor_mod(libdevice.fmod(x, y), y)


@_Helper
def coil_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@_Helper
def coil_round(x):
    # Half to even on |x|, where |x| - floor(|x|) is exact; inf and NaN pass through.
    a = tl.abs(x)
    f = tl.floor(a)
    d = a - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    return coil_copysign(r, x)


# --- exponentials and logarithms (float64 inside) -------------------------------------------

@_Helper
def _expm1_64(x):
    # Kahan: (u - 1) * x / log(u) cancels the rounding error of u = exp(x). float64: 2 ulp.
    u = tl.exp(x)
    r = (u - 1.0) * (x / tl.log(u))
    r = tl.where(u == 1.0, x, r)
    r = tl.where(x < -40.0, -1.0, r)  # -1 + e^x rounds to -1; log(u) of a subnormal u is poor
    return tl.where(u == _INF, _INF, r)


@_Helper
def _log1p_64(x):
    # Goldberg: log(u) * x / (u - 1) cancels the rounding error of u = 1 + x. float64: 2 ulp.
    u = 1.0 + x
    r = tl.log(u) * (x / (u - 1.0))
    r = tl.where(u == 1.0, x, r)
    return tl.where(x == _INF, _INF, r)


@_Helper
def coil_expm1(x):
    return _expm1_64(x.to(tl.float64)).to(x.dtype)


@_Helper
def coil_log1p(x):
    return _log1p_64(x.to(tl.float64)).to(x.dtype)


@_Helper
def coil_log10(x):
    return (tl.log(x.to(tl.float64)) * _INV_LN10).to(x.dtype)  # float64: 3 ulp


@_Helper
def coil_sigmoid(x):
    # exp(-|x|) never overflows, so tiny results keep their precision. float64: 2 ulp.
    xd = x.to(tl.float64)
    e = tl.exp(-tl.abs(xd))
    return tl.where(xd >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).to(x.dtype)


@_Helper
def coil_sigmoid_gpu(x):
    # ATen's CUDA formula, with a correctly rounded reciprocal. tl.sigmoid is
    # ex2.approx.f32(x * log2e) and div.full.f32: the rounding of x * log2e alone costs
    # ~20 ulp at |x| = 80.
    return libdevice.rcp_rn(1.0 + libdevice.exp(-x))


@_Helper
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


@_Helper
def coil_hypot(x, y):
    # Scaled so float64 inputs do not overflow; inf wins over NaN as in C. float64: 2 ulp.
    ax = tl.abs(x.to(tl.float64))
    ay = tl.abs(y.to(tl.float64))
    hi = tl.maximum(ax, ay)
    q = tl.minimum(ax, ay) / hi
    r = tl.where(hi == 0.0, 0.0, hi * tl.sqrt(1.0 + q * q))
    return tl.where((ax == _INF) | (ay == _INF), _INF, r).to(x.dtype)


# --- trigonometric and hyperbolic (float64 inside) ------------------------------------------

@_Helper
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


@_Helper
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


@_Helper
def coil_tan(x):
    # The interpreter's sin and cos (numpy) reduce huge arguments exactly. float64: 2 ulp.
    xd = x.to(tl.float64)
    return (tl.sin(xd) / tl.cos(xd)).to(x.dtype)


@_Helper
def coil_atan(x):
    return _atan_64(x.to(tl.float64)).to(x.dtype)


@_Helper
def coil_atan2(y, x):
    return _atan2_64(y.to(tl.float64), x.to(tl.float64)).to(y.dtype)


@_Helper
def coil_asin(x):
    # (1 - x)(1 + x) keeps full precision near |x| = 1; |x| > 1 gives sqrt(<0) = NaN.
    # float64: 3 ulp.
    xd = x.to(tl.float64)
    return _atan2_64(xd, tl.sqrt((1.0 - xd) * (1.0 + xd))).to(x.dtype)


@_Helper
def coil_acos(x):
    xd = x.to(tl.float64)
    return (2.0 * _atan2_64(tl.sqrt(1.0 - xd), tl.sqrt(1.0 + xd))).to(x.dtype)  # float64: 3 ulp


@_Helper
def coil_sinh(x):
    # (e + e / (e + 1)) / 2 with e = expm1|x| has no cancellation; past 20 it is exp|x| / 2,
    # formed as (h / 2) * h with h = exp(|x| / 2) so float64 overflows only where sinh does.
    a = tl.abs(x.to(tl.float64))
    e = _expm1_64(a)
    h = tl.exp(0.5 * a)
    r = tl.where(a > 20.0, (0.5 * h) * h, 0.5 * (e + e / (e + 1.0)))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)  # float64: 2 ulp


@_Helper
def coil_cosh(x):
    a = tl.abs(x.to(tl.float64))
    e = tl.exp(a)
    h = tl.exp(0.5 * a)
    return tl.where(a > 20.0, (0.5 * h) * h, 0.5 * (e + 1.0 / e)).to(x.dtype)  # float64: 2 ulp


@_Helper
def coil_tanh(x):
    # t / (t + 2) with t = expm1(2|x|); tanh rounds to 1 in float64 beyond 19.1.
    # float64: 2 ulp.
    a = tl.abs(x.to(tl.float64))
    t = _expm1_64(2.0 * a)
    r = tl.where(a > 40.0, 1.0, t / (t + 2.0))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)


@_Helper
def coil_asinh(x):
    # log1p(a + a^2 / (1 + sqrt(1 + a^2))) is accurate near 0; log(2a) past 2^28.
    # float64: 2 ulp.
    a = tl.abs(x.to(tl.float64))
    a2 = a * a
    r = tl.where(a > 268435456.0, tl.log(a) + _LN2,
                 _log1p_64(a + a2 / (1.0 + tl.sqrt(1.0 + a2))))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)


@_Helper
def coil_acosh(x):
    # log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact near 1); log(2x) past 2^28.
    # float64: 2 ulp.
    xd = x.to(tl.float64)
    t = xd - 1.0
    r = tl.where(xd > 268435456.0, tl.log(xd) + _LN2, _log1p_64(t + tl.sqrt(2.0 * t + t * t)))
    return tl.where(xd < 1.0, float("nan"), r).to(x.dtype)


@_Helper
def coil_atanh(x):
    # log1p(2a / (1 - a)) / 2; 1 - a is exact near 1, and |x| > 1 reaches log1p(< -1) = NaN.
    a = tl.abs(x.to(tl.float64))
    r = 0.5 * _log1p_64(2.0 * a / (1.0 - a))
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)  # float64: 2 ulp


# --- error function and gamma (float64 inside) ----------------------------------------------

@_Helper
def _erfc_64(x):
    # Below 2, 1 - erf(x) loses at most 2e-14 relative (erfc(2) = 4.7e-3). From 2 on,
    # Laplace's continued fraction x + (1/2)/(x + 1/(x + (3/2)/(x + ...))). float64: 6e-14
    # (255 ulp), set by the rounding of x*x in exp(-x*x) near the underflow at x = 27.
    f = x
    for n in tl.static_range(_ERFC_CF_TERMS, 0, -1):
        f = x + (0.5 * n) / f
    return tl.where(x < 2.0, 1.0 - tl.erf(x), tl.exp(-x * x) / f * _INV_SQRT_PI)


@_Helper
def coil_erfc(x):
    return _erfc_64(x.to(tl.float64)).to(x.dtype)


@_Helper
def coil_erfinv(x):
    # Giles' float32 approximation (~1e-7; float64 inputs within 1e-10 of 1: ~10%), then
    # four Newton steps: on erf(r) = y centrally, on log(erfc(r)) = log(1 - y) in the tail,
    # where erf is flat and 1 - y is exact. float64: 15 ulp (3e-15).
    y = tl.abs(x.to(tl.float64))
    w = -tl.log((1.0 - y) * (1.0 + y))
    wc = w - 2.5
    wt = tl.sqrt(w) - 3.0
    pc = wc * 0.0 + _GILES_CENTRAL[0]
    pt = wt * 0.0 + _GILES_TAIL[0]
    for i in tl.static_range(1, 9):
        pc = pc * wc + _GILES_CENTRAL[i]
        pt = pt * wt + _GILES_TAIL[i]
    r = tl.where(w < 5.0, pc, pt) * y
    for _ in tl.static_range(4):
        ec = _erfc_64(r)
        d = tl.exp(-r * r) * _TWO_OVER_SQRT_PI  # erf'(r)
        tail = r + (tl.log(ec) - tl.log(1.0 - y)) * (ec / d)
        r = tl.where(y > 0.5, tail, r - (tl.erf(r) - y) / d)
    r = tl.where(y == 1.0, _INF, r)
    return coil_copysign(r, x.to(tl.float64)).to(x.dtype)


@_Helper
def _lgamma_near2(e):
    # lgamma(2 + e) = (1 - gamma) e + sum (-1)^k (zeta(k) - 1) / k e^k; for |e| <= 0.2 the
    # 17 terms reach 1e-17, and there is no cancellation near the zero at e = 0.
    p = e * 0.0
    for i in tl.static_range(16, -1, -1):
        p = (p + _LGAMMA2[i]) * e
    return (p + (1.0 - _EULER_GAMMA)) * e


@_Helper
def _lgamma_pos(z):
    # z >= 0.5. Lanczos (~1e-15) except within 0.2 of the zeros at 1 and 2, where its
    # absolute error would be a large relative one; lgamma(1 + e) = lgamma(2 + e) - log1p(e).
    s = z * 0.0 + _LANCZOS[0]
    for i in tl.static_range(1, 9):
        s = s + _LANCZOS[i] / (z + (i - 1.0))
    t = z + 6.5
    r = (z - 0.5) * tl.log(t) - t + tl.log(s) + _HALF_LOG_2PI
    r = tl.where(tl.abs(z - 1.0) < 0.2, _lgamma_near2(z - 1.0) - _log1p_64(z - 1.0), r)
    return tl.where(tl.abs(z - 2.0) < 0.2, _lgamma_near2(z - 2.0), r)


@_Helper
def coil_lgamma(x):
    # x < 0.5 reflects: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x), with sin taken of
    # x minus its nearest integer (exact), so poles give +inf. float64: 2e-13 relative,
    # except near the zeros at x < 0, where the absolute error stays ~1e-15.
    xd = x.to(tl.float64)
    refl = xd < 0.5
    lg = _lgamma_pos(tl.where(refl, 1.0 - xd, xd))
    frac = xd - tl.floor(xd + 0.5)
    r = tl.where(refl, -tl.log(tl.abs(tl.sin(frac * _PI)) * _INV_PI) - lg, lg)
    return tl.where(tl.abs(xd) == _INF, _INF, r).to(x.dtype)


# --- counter-based random numbers: the catalogue's rand and randn --------------------------
# Triton's own Philox4x32-10 (tl.randint4x) keys it with the seed's (low, high) words and runs
# it on the counter (low word, high word, 0, 0), as coil.ops defines; the conversions are
# Coil's (the top 24 bits, not tl.rand's 31), so results equal the other plugins' bit for bit.
# Both run under the interpreter, which has umulhi.

@_Helper
def _unit_float(w):
    return (w >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24


@_Helper
def coil_rand(seed, counter):
    w0, w1, w2, w3 = tl.randint4x(seed, counter)
    return _unit_float(w0)


@_Helper
def coil_randn(seed, counter):
    # Box-Muller; 1 - u lies in (0, 1], so the logarithm is finite
    w0, w1, w2, w3 = tl.randint4x(seed, counter)
    radius = tl.sqrt(-2.0 * tl.log(1.0 - _unit_float(w0)))
    return radius * tl.cos(_unit_float(w1) * 6.283185307179586)


# --- the table ------------------------------------------------------------------------------

#: op -> (GPU spelling, interpreter spelling). GPU choices follow the PTX triton 3.6 emits for
#: sm_90 in float32: tl.exp is ex2.approx.f32(x * log2e) (error grows with |x|), tl.sqrt and
#: libdevice.sqrt are sqrt.approx; tl.exp2/log/log2/sin/cos/erf/floor/ceil are libdevice
#: quality. isnan/isinf/signbit use the helpers on both (libdevice's return int32, not bool).
SPELLINGS: dict[str, tuple[str, str]] = {
    "exp": ("libdevice.exp", "tl.exp"), "exp2": ("tl.exp2", "tl.exp2"),
    "expm1": ("libdevice.expm1", "coil_expm1"), "log": ("tl.log", "tl.log"),
    "log2": ("tl.log2", "tl.log2"), "log10": ("libdevice.log10", "coil_log10"),
    "log1p": ("libdevice.log1p", "coil_log1p"), "sqrt": ("libdevice.sqrt_rn", "tl.sqrt"),
    "rsqrt": ("libdevice.rsqrt", "tl.rsqrt"), "sin": ("tl.sin", "tl.sin"),
    "cos": ("tl.cos", "tl.cos"), "tan": ("libdevice.tan", "coil_tan"),
    "asin": ("libdevice.asin", "coil_asin"), "acos": ("libdevice.acos", "coil_acos"),
    "atan": ("libdevice.atan", "coil_atan"), "sinh": ("libdevice.sinh", "coil_sinh"),
    "cosh": ("libdevice.cosh", "coil_cosh"), "tanh": ("libdevice.tanh", "coil_tanh"),
    "asinh": ("libdevice.asinh", "coil_asinh"), "acosh": ("libdevice.acosh", "coil_acosh"),
    "atanh": ("libdevice.atanh", "coil_atanh"), "erf": ("tl.erf", "tl.erf"),
    "erfc": ("libdevice.erfc", "coil_erfc"), "erfinv": ("libdevice.erfinv", "coil_erfinv"),
    "lgamma": ("libdevice.lgamma", "coil_lgamma"), "sigmoid": ("coil_sigmoid_gpu", "coil_sigmoid"),
    "pow": ("libdevice.pow", "coil_pow"), "atan2": ("libdevice.atan2", "coil_atan2"),
    "hypot": ("libdevice.hypot", "coil_hypot"), "copysign": ("libdevice.copysign", "coil_copysign"),
    "nextafter": ("libdevice.nextafter", "coil_nextafter"), "floor": ("tl.floor", "tl.floor"),
    "ceil": ("tl.ceil", "tl.ceil"), "round": ("libdevice.rint", "coil_round"),
    "trunc": ("libdevice.trunc", "coil_trunc"), "isinf": ("coil_isinf", "coil_isinf"),
    "isnan": ("coil_isnan", "coil_isnan"), "signbit": ("coil_signbit", "coil_signbit"),
    "fmod": ("libdevice.fmod", "coil_fmod"), "remainder": ("coil_remainder_gpu", "coil_remainder"),
}

#: Every ``coil_*`` helper by name, for the namespace generated kernels run in.
HELPERS: dict[str, _Helper] = {k: v for k, v in globals().items() if k.startswith("coil_")}


def call(op: str, args: list[str], interpret: bool) -> str:
    """Source text calling ``op`` on ``args``: ``call("erf", ["t3"], False) == "tl.erf(t3)"``."""
    if op not in SPELLINGS:
        raise KeyError(f"no Triton spelling for op {op!r}; known: {', '.join(sorted(SPELLINGS))}")
    return f"{SPELLINGS[op][1 if interpret else 0]}({', '.join(args)})"


def namespace(interpret: bool) -> dict[str, Any]:
    """Globals for generated kernels: ``triton``, ``tl``, ``libdevice`` and every helper.
    The same either way (the interpreter is chosen per kernel by :func:`jit`); under
    ``interpret`` a stray libdevice call fails with Triton's "not supported" error."""
    return {"triton": triton, "tl": tl, "libdevice": libdevice, **HELPERS}


# --- per-kernel interpretation --------------------------------------------------------------

def _lang_probe() -> None:
    """Never called; a copy whose globals hold ``tl`` and ``tl.core`` steers the patcher."""


_LANG_PROBE = types.FunctionType(_lang_probe.__code__, {"tl": tl, "core": tl.core})


def _call_interpreted(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
    return InterpretedFunction(self.fn)(*args, **kwargs)


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """Scope for interpreted launches: JIT functions called inside run interpreted, and every
    patch of ``triton.language`` made inside is undone on exit. Kernels interpreted through
    ``TRITON_INTERPRET=1`` can be launched inside it too, to keep ``tl.core`` clean."""
    # Patch both language modules first, so that whatever nested interpreted calls patch
    # (and never restore) is recorded here and undone below.
    scope = _interpreter._patch_lang(_LANG_PROBE)
    jit_call = JITFunction.__call__
    JITFunction.__call__ = _call_interpreted
    create_dot = _interpreter.InterpreterBuilder.create_dot
    _interpreter.InterpreterBuilder.create_dot = _widening_dot(create_dot)
    try:
        with np.errstate(all="ignore"):  # IEEE results, as on the GPU, without numpy's warnings
            yield
    finally:
        JITFunction.__call__ = jit_call
        _interpreter.InterpreterBuilder.create_dot = create_dot
        scope.restore()


def _widening_dot(create_dot: Callable[..., Any]) -> Callable[..., Any]:
    """The interpreter's ``tl.dot`` with bfloat16 tiles widened to float32 first: it
    multiplies them as their uint16 bit patterns (triton-lang/triton#11584). Widening is
    exact, as the GPU's MMA units are on bfloat16 products."""
    def widen(x: Any) -> Any:
        if x.dtype != tl.bfloat16:
            return x
        bits = x.data.astype(np.uint32) << 16
        return _interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        return create_dot(self, widen(a), widen(b), d, *args)
    return dot


class InterpretedKernel:
    """A kernel that Triton's interpreter runs whatever ``TRITON_INTERPRET`` says; launched
    like a JITFunction, ``kernel[grid](*args, **constexprs)``, with CPU tensors."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._interpreted = InterpretedFunction(fn)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            with interpreting():
                self._interpreted[grid](*args, **kwargs)
        return launch


def jit(fn: Callable[..., Any], *, interpret: bool) -> JITFunction | InterpretedKernel:
    """``fn`` (a plain function or an already decorated one) as a real JITFunction, or as an
    :class:`InterpretedKernel` when ``interpret``; no other kernel is affected."""
    if not interpret and isinstance(fn, JITFunction):
        return fn
    raw = getattr(fn, "fn", fn)
    return InterpretedKernel(raw) if interpret else JITFunction(raw)


def load_source(source: str, *, interpret: bool, filename: str | None = None) -> dict[str, Any]:
    """Execute generated kernel source in :func:`namespace` and return its ``@triton.jit``
    functions through :func:`jit`. The source is registered with ``linecache`` because Triton
    reads a kernel's source back with ``inspect``."""
    if filename is None:
        filename = f"<coil-triton-{hashlib.sha1(source.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    ns = namespace(interpret)
    exec(compile(source, filename, "exec"), ns)
    return {name: jit(value, interpret=interpret) for name, value in ns.items()
            if isinstance(value, (JITFunction, InterpretedFunction)) and name not in HELPERS}
