"""The counter-based random numbers of Coil's Triton kernels (:mod:`.mathlib`): the catalogue's
rand and randn.

Triton's own Philox4x32-10 (tl.randint4x) keys it with the seed's (low, high) words and runs
it on the counter (low word, high word, 0, 0), as coil.ops defines; the conversions are
Coil's (the top 24 bits, not tl.rand's 31), so results equal the other plugins' bit for bit.
Both run under the interpreter, which has umulhi."""
from __future__ import annotations

import triton.language as tl

from .interpret import Helper


@Helper
def _unit_float(w):
    return (w >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24


@Helper
def coil_rand(seed, counter):
    w0, w1, w2, w3 = tl.randint4x(seed, counter)
    return _unit_float(w0)


@Helper
def coil_randn(seed, counter):
    # Box-Muller; 1 - u lies in (0, 1], so the logarithm is finite
    w0, w1, w2, w3 = tl.randint4x(seed, counter)
    radius = tl.sqrt(-2.0 * tl.log(1.0 - _unit_float(w0)))
    return radius * tl.cos(_unit_float(w1) * 6.283185307179586)
