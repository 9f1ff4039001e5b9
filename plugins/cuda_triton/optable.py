"""Triton spellings of Coil's pointwise ops and dtypes.

Values are computed in a *compute type*: the storage dtype, except that bf16 and fp16 are
computed in fp32 (loaded, then widened; narrowed again only when stored or cast). Math
functions come from :mod:`.mathlib`, which has an interpreter-safe spelling of each for CI."""
from __future__ import annotations

import math
from typing import Callable

import torch


#: Triton dtype of each torch dtype, as stored in memory.
STORAGE: dict[torch.dtype, str] = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

#: Pointer element types in a kernel signature (``*fp32``...).
POINTER: dict[torch.dtype, str] = {
    torch.float32: "*fp32", torch.float64: "*fp64", torch.bfloat16: "*bf16", torch.float16: "*fp16",
    torch.int8: "*i8", torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64",
    torch.uint8: "*u8", torch.bool: "*i1",
}

HALF = (torch.bfloat16, torch.float16)


def compute(dtype: torch.dtype) -> str:
    """The Triton type values of ``dtype`` are computed in."""
    return "tl.float32" if dtype in HALF else STORAGE[dtype]


def literal(value: object, dtype: torch.dtype, shape: str) -> str:
    """A tensor of ``shape`` (source text such as ``[1]``) filled with ``value``."""
    if dtype == torch.bool:
        text = "1" if value else "0"
    elif dtype.is_floating_point:
        v = float(value)  # type: ignore[arg-type]
        if v == 0 and math.copysign(1.0, v) < 0:  # Triton makes every constant equal to 0 a +0.0
            return f"(tl.full({shape}, 0.0, {compute(dtype)}) * -1.0)"
        text = f'float("{v}")' if math.isnan(v) or math.isinf(v) else repr(v)
    else:  # wrapped to the dtype's width, as eager converts it (uint8 + -1 adds 255)
        bits = torch.iinfo(dtype).bits
        v = int(value) & ((1 << bits) - 1)  # type: ignore[call-overload]
        if dtype.is_signed and v >= 1 << (bits - 1):
            v -= 1 << bits
        text = str(v)
    return f"tl.full({shape}, {text}, {compute(dtype)})"


Spelling = Callable[[list[str], torch.dtype, bool], str]


def _infix(op: str) -> Spelling:
    return lambda a, t, interp: f"({a[0]} {op} {a[1]})"


def _call(name: str, args: list[str], interpret: bool) -> str:
    from . import mathlib  # imports triton: only when a kernel is written
    return mathlib.call(name, args, interpret)


def _math(name: str) -> Spelling:
    return lambda a, t, interp: _call(name, a, interp)


def _int_or(int_fn: str, float_spelling: Spelling) -> Spelling:
    def spell(a: list[str], t: torch.dtype, interp: bool) -> str:
        if t.is_floating_point:
            return float_spelling(a, t, interp)
        return f"{int_fn}({', '.join(a)})"
    return spell


def _quotient(a: str, b: str, t: torch.dtype) -> str:
    """``a / b`` rounded as IEEE division, as eager's CUDA kernels divide: Triton spells a
    float32 ``/`` as ``div.full.f32``, an approximation within 2 ulp (float64's ``/`` is
    ``div.rn.f64`` already; other types keep ``/``). ``trunc(6.0 / 3.0)`` must be 2, not 1."""
    return f"tl.div_rn({a}, {b})" if t == torch.float32 or t in HALF else f"({a} / {b})"


def _abs(a: list[str], t: torch.dtype, interp: bool) -> str:
    if t == torch.bool:
        return a[0]
    return f"tl.abs({a[0]})" if t.is_floating_point or t.is_signed else a[0]


def _sign(a: list[str], t: torch.dtype, interp: bool) -> str:
    x = a[0]
    if t == torch.bool:
        return x
    ct = compute(t)
    return f"((0 < {x}).to({ct}) - ({x} < 0).to({ct}))"  # as ATen's: the sign of a NaN is 0


def _bitwise_not(a: list[str], t: torch.dtype, interp: bool) -> str:
    if t == torch.bool:
        return f"({a[0]} == 0)"
    if t == torch.uint8 and interp:  # the interpreter inverts by ``x ^ -1``, out of uint8's range
        return f"({a[0]} ^ tl.full([1], 255, tl.uint8))"
    return f"(~{a[0]})"


def _float_or_int(float_text: Callable[[list[str]], str], int_text: Callable[[list[str]], str]) -> Spelling:
    return lambda a, t, interp: float_text(a) if t.is_floating_point else int_text(a)


OPS: dict[str, Spelling] = {
    "add": _infix("+"), "sub": _infix("-"), "mul": _infix("*"),
    "truediv": lambda a, t, i: _quotient(a[0], a[1], t),
    "floordiv": _int_or("int_floordiv", lambda a, t, i: _call("floor", [_quotient(a[0], a[1], t)], i)),
    "truncdiv": _int_or("int_truncdiv", lambda a, t, i: _call("trunc", [_quotient(a[0], a[1], t)], i)),
    "remainder": _int_or("int_remainder", _math("remainder")),
    "fmod": _int_or("int_fmod", _math("fmod")),
    "neg": lambda a, t, i: f"({a[0]} * -1.0)" if t.is_floating_point else f"(-{a[0]})", "abs": _abs,
    "reciprocal": lambda a, t, i: _quotient("1.0", a[0], t),
    "square": lambda a, t, i: f"({a[0]} * {a[0]})",
    "sign": _sign,
    "maximum": _float_or_int(lambda a: f"max_nan({a[0]}, {a[1]})", lambda a: f"tl.maximum({a[0]}, {a[1]})"),
    "minimum": _float_or_int(lambda a: f"min_nan({a[0]}, {a[1]})", lambda a: f"tl.minimum({a[0]}, {a[1]})"),
    "clamp_min": _float_or_int(lambda a: f"clamp_below({a[0]}, {a[1]})", lambda a: f"tl.maximum({a[0]}, {a[1]})"),
    "clamp_max": _float_or_int(lambda a: f"clamp_above({a[0]}, {a[1]})", lambda a: f"tl.minimum({a[0]}, {a[1]})"),
    "pow": _int_or("int_pow", _math("pow")), "atan2": _math("atan2"), "hypot": _math("hypot"),
    "copysign": _math("copysign"), "nextafter": _math("nextafter"),
    "eq": _infix("=="), "ne": _infix("!="), "lt": _infix("<"), "le": _infix("<="),
    "gt": _infix(">"), "ge": _infix(">="),
    "isnan": lambda a, t, i: f"({a[0]} != {a[0]})" if t.is_floating_point else f"({a[0]} != {a[0]})",
    "isinf": _math("isinf"), "signbit": _math("signbit"),
    "logical_and": lambda a, t, i: f"(({a[0]} != 0) & ({a[1]} != 0))",
    "logical_or": lambda a, t, i: f"(({a[0]} != 0) | ({a[1]} != 0))",
    "logical_xor": lambda a, t, i: f"(({a[0]} != 0) ^ ({a[1]} != 0))",
    "logical_not": lambda a, t, i: f"({a[0]} == 0)",
    "bitwise_and": _infix("&"), "bitwise_or": _infix("|"), "bitwise_xor": _infix("^"),
    "bitwise_not": _bitwise_not, "lshift": _int_or("int_shift_left", _infix("<<")),
    "rshift": _int_or("int_shift_right", _infix(">>")),
    "where": lambda a, t, i: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    # counter-based random numbers (mathlib helpers, the same for the GPU and the interpreter)
    "rand": lambda a, t, i: f"coil_rand({a[0]}, {a[1]})",
    "randn": lambda a, t, i: f"coil_randn({a[0]}, {a[1]})",
}
for _name in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin",
              "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
              "atanh", "erf", "erfc", "erfinv", "lgamma", "sigmoid", "floor", "ceil", "round", "trunc"):
    OPS[_name] = _math(_name)
