"""Math for Coil's Triton kernels: each op's GPU and interpreter spelling, and the namespace
generated kernels run in, which holds the ``coil_*`` helpers behind those spellings.

Triton's interpreter (numpy on the CPU; what CI runs) cannot call libdevice, so each op has
two spellings in :data:`SPELLINGS`: for the GPU a Triton builtin or libdevice, chosen from
the PTX each emits for sm_90; for the interpreter a builtin it runs natively (exp, exp2,
log, log2, sin, cos, sqrt, rsqrt, erf, floor, ceil, abs, fma, where, bitcasts, and float
``%`` as C fmod) or a helper built from those. Helpers compute in float64 and round once,
so float32 results measure within 0.51 ulp; float64 inputs get the accuracy noted at each
helper (2-3 ulp for most). All helpers also compile for the GPU.

The helpers are grouped by what they compute: :mod:`.math_exact` (bits, rounding,
remainders), :mod:`.math_elementary` (exponentials, logarithms, trigonometric and
hyperbolic), :mod:`.math_special` (erfc, erfinv, lgamma) and :mod:`.math_random` (rand,
randn). :func:`load_source` runs generated source in this namespace; running a single
kernel interpreted is :mod:`.interpret`'s job (its :func:`interpreting` is re-exported here
for the callers that scope interpreted launches)."""
from __future__ import annotations

import hashlib
import linecache
from typing import Any

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice
from triton.runtime.jit import JITFunction

from . import math_elementary, math_exact, math_random, math_special
from .interpret import Helper, interpreted_types, interpreting, jit

__all__ = ["SPELLINGS", "HELPERS", "call", "namespace", "load_source", "interpreting"]

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
HELPERS: dict[str, Helper] = {
    name: value for module in (math_exact, math_elementary, math_special, math_random)
    for name, value in vars(module).items() if name.startswith("coil_")}


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
            if isinstance(value, (JITFunction, *interpreted_types())) and name not in HELPERS}
