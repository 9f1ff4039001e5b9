"""The special-function math helpers of Coil's Triton kernels (:mod:`.mathlib`): the error
function's complement and inverse, and the log-gamma function. Each computes in float64 and
rounds once; float64 inputs get the accuracy noted at each helper."""
from __future__ import annotations

import math

import triton.language as tl

from .interpret import Helper
from .math_elementary import log1p_64
from .math_exact import coil_copysign

# Constexpr globals, as in :mod:`.math_exact`.
_INF = tl.constexpr(math.inf)
_PI = tl.constexpr(math.pi)
_INV_PI = tl.constexpr(1 / math.pi)
_INV_SQRT_PI = tl.constexpr(1 / math.sqrt(math.pi))
_TWO_OVER_SQRT_PI = tl.constexpr(2 / math.sqrt(math.pi))
_HALF_LOG_2PI = tl.constexpr(0.5 * math.log(2 * math.pi))
_EULER_GAMMA = tl.constexpr(0.5772156649015329)
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


@Helper
def _erfc_64(x):
    # Below 2, 1 - erf(x) loses at most 2e-14 relative (erfc(2) = 4.7e-3). From 2 on,
    # Laplace's continued fraction x + (1/2)/(x + 1/(x + (3/2)/(x + ...))). float64: 6e-14
    # (255 ulp), set by the rounding of x*x in exp(-x*x) near the underflow at x = 27.
    f = x
    for n in tl.static_range(_ERFC_CF_TERMS, 0, -1):
        f = x + (0.5 * n) / f
    return tl.where(x < 2.0, 1.0 - tl.erf(x), tl.exp(-x * x) / f * _INV_SQRT_PI)


@Helper
def coil_erfc(x):
    return _erfc_64(x.to(tl.float64)).to(x.dtype)


@Helper
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


@Helper
def _lgamma_near2(e):
    # lgamma(2 + e) = (1 - gamma) e + sum (-1)^k (zeta(k) - 1) / k e^k; for |e| <= 0.2 the
    # 17 terms reach 1e-17, and there is no cancellation near the zero at e = 0.
    p = e * 0.0
    for i in tl.static_range(16, -1, -1):
        p = (p + _LGAMMA2[i]) * e
    return (p + (1.0 - _EULER_GAMMA)) * e


@Helper
def _lgamma_pos(z):
    # z >= 0.5. Lanczos (~1e-15) except within 0.2 of the zeros at 1 and 2, where its
    # absolute error would be a large relative one; lgamma(1 + e) = lgamma(2 + e) - log1p(e).
    s = z * 0.0 + _LANCZOS[0]
    for i in tl.static_range(1, 9):
        s = s + _LANCZOS[i] / (z + (i - 1.0))
    t = z + 6.5
    r = (z - 0.5) * tl.log(t) - t + tl.log(s) + _HALF_LOG_2PI
    r = tl.where(tl.abs(z - 1.0) < 0.2, _lgamma_near2(z - 1.0) - log1p_64(z - 1.0), r)
    return tl.where(tl.abs(z - 2.0) < 0.2, _lgamma_near2(z - 2.0), r)


@Helper
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
