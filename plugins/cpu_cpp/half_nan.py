"""Which float values need no NaN test before their bf16 rounding.

Rounding a float to bf16 adds ``0x7fff`` plus the last kept bit to its bits and clears the
low half (``coil::to_bf16``, ``coil::round_bf16``). For a NaN whose low 16 bits are not zero
that addition can carry into the exponent and sign, and the NaN comes out as an infinity or
a zero, so the general rounding first replaces a NaN by the canonical quiet NaN (a compare and
a masked move per vector). A float whose NaNs all have a zero low half can skip that: adding
at most ``0x8000`` to such a NaN changes no kept bit.

Which values are such "clean" floats, proven from the expression alone:

* a bf16 value widened to float (its low half is zero, whatever it holds);
* an integer or bool converted to float (never a NaN), and every constant (a NaN constant
  is written as the canonical quiet NaN);
* a bf16 rounding's result;
* ``+ - * /``, square roots, negation, ``abs``, ``maximum``/``minimum``, clamps and ``where``
  of clean operands: IEEE arithmetic returns one of its operands' NaNs (quieted, which sets
  bit 22 only) or the default NaN, whose low half is zero on every ISA the plugin builds for
  (x86-64, AArch64, RISC-V), and the selects return an operand.

Anything else (a float32, float64 or fp16 load, a math function, a reduction's result) is not
proven and keeps the test. Used by ``KernelWriter.visit_cast`` in ``codegen.py`` (bias + GELU +
residual in bf16, one thread: 11.9 -> 10.8 ms in a C++ harness, two of its three roundings
proven)."""
from __future__ import annotations

import torch

from coil.sdk import Cast, Const, Load, Masked, Op, Value

#: Ops whose NaN result is one of their operands' NaNs or the default NaN: IEEE arithmetic
#: (``/`` also in ``reciprocal`` and ``rsqrt``, ``sqrt`` a vector square root) and the plugin's
#: selects and sign operations (``coil::max_nan``, ``clamp_min``, ``std::fabs``...), which
#: return an operand, its sign changed at most.
_PROPAGATING = frozenset({"add", "sub", "mul", "truediv", "neg", "abs", "square", "reciprocal", "sqrt",
                          "rsqrt", "maximum", "minimum", "clamp_min", "clamp_max"})


def nan_low_half_clear(v: Value | None, memo: dict[int, bool] | None = None) -> bool:
    """True when every NaN that float value ``v`` can hold has its low 16 bits clear."""
    if v is None:
        return False
    memo = {} if memo is None else memo
    known = memo.get(id(v))
    if known is None:
        known = memo[id(v)] = _clean(v, memo)
    return known


def _clean(v: Value, memo: dict[int, bool]) -> bool:
    if v.dtype == torch.bfloat16 or not (v.dtype.is_floating_point or v.dtype.is_complex):
        return True  # a bf16 value (zero low half once widened), or an integer or bool: no NaN
    if isinstance(v, Const):
        return True
    if isinstance(v, Cast):
        inner = v.x
        if inner is None or inner.dtype in (torch.float64, torch.float16):
            return False  # a narrowed float64 NaN or a widened fp16 one can have low bits set
        return nan_low_half_clear(inner, memo)
    if isinstance(v, Op):
        if v.name in _PROPAGATING:
            return all(nan_low_half_clear(a, memo) for a in v.args)
        if v.name == "where":
            return all(nan_low_half_clear(a, memo) for a in v.args[1:])
        return False
    if isinstance(v, Masked):
        return nan_low_half_clear(v.body, memo)  # ``other`` is a constant
    if isinstance(v, Load):
        return False  # a float buffer's NaNs are whatever was written there
    return False


__all__ = ["nan_low_half_clear"]
