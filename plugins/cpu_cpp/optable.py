"""C++ spellings of Coil's pointwise ops and dtypes (one table, one lambda per op)."""
from __future__ import annotations

import math
from typing import Callable

import torch

from coil.sdk import Op, Value

CTYPES: dict[torch.dtype, str] = {
    torch.float32: "float", torch.float64: "double", torch.bfloat16: "coil::bf16",
    torch.float16: "coil::fp16", torch.int8: "int8_t", torch.int16: "int16_t",
    torch.int32: "int32_t", torch.int64: "int64_t", torch.uint8: "uint8_t", torch.bool: "bool",
}

#: How a buffer of each dtype is addressed: bool buffers as bytes. A value loaded through a
#: ``const bool*`` left GCC 12's loop scalar, with a branch per element where a ``where``
#: selected on it (a ReLU6's backward over 2x32x32x32 floats: 0.29 ms of a training step,
#: its mask random, one thread); loaded as ``uint8_t`` (and converted to bool, which is the
#: test against 0) the loop is vectorised: 37 -> 6.6 us in a harness.
BUFFER_CTYPES: dict[torch.dtype, str] = {**CTYPES, torch.bool: "uint8_t"}

#: Storage-only types: values are converted to float before any arithmetic or comparison.
HALF_TYPES = frozenset({"coil::bf16", "coil::fp16"})

Spelling = Callable[[list[str], str], str]


def _call(fn: str) -> Spelling:
    return lambda a, t: f"{fn}({', '.join(a)})"


def _tcall(fn: str) -> Spelling:
    return lambda a, t: f"{fn}<{t}>({', '.join(a)})"


def _infix(op: str) -> Spelling:
    return lambda a, t: f"({a[0]} {op} {a[1]})"


OPS: dict[str, Spelling] = {
    "add": _infix("+"), "sub": _infix("-"), "mul": _infix("*"), "truediv": _infix("/"),
    "floordiv": _tcall("coil::floordiv"), "truncdiv": _tcall("coil::truncdiv"),
    "remainder": _tcall("coil::remainder"), "fmod": _tcall("coil::fmod_"),
    "neg": lambda a, t: f"(-{a[0]})", "abs": _tcall("coil::abs_"),
    "reciprocal": lambda a, t: f"({t}(1) / {a[0]})", "square": lambda a, t: f"({a[0]} * {a[0]})",
    "sign": _tcall("coil::sign"), "maximum": _tcall("coil::max_nan"), "minimum": _tcall("coil::min_nan"),
    "clamp_min": _tcall("coil::clamp_min"), "clamp_max": _tcall("coil::clamp_max"),
    "pow": _tcall("coil::pow_"), "atan2": _call("std::atan2"), "hypot": _call("std::hypot"),
    "copysign": _call("std::copysign"), "nextafter": _call("std::nextafter"),
    "exp": _tcall("coil::exp_"), "exp2": _call("std::exp2"), "expm1": _call("std::expm1"),
    "log": _call("std::log"), "log2": _call("std::log2"), "log10": _call("std::log10"),
    "log1p": _call("std::log1p"), "sqrt": _call("std::sqrt"),
    "rsqrt": lambda a, t: f"({t}(1) / std::sqrt({a[0]}))",
    "sin": _call("std::sin"), "cos": _call("std::cos"), "tan": _call("std::tan"),
    "asin": _call("std::asin"), "acos": _call("std::acos"), "atan": _call("std::atan"),
    "sinh": _call("std::sinh"), "cosh": _call("std::cosh"), "tanh": _tcall("coil::tanh_"),
    "asinh": _call("std::asinh"), "acosh": _call("std::acosh"), "atanh": _call("std::atanh"),
    "erf": _tcall("coil::erf_"), "erfc": _call("std::erfc"), "erfinv": _tcall("coil::erfinv_"),
    "lgamma": _call("std::lgamma"), "sigmoid": _tcall("coil::sigmoid"),
    "floor": _call("std::floor"), "ceil": _call("std::ceil"), "round": _tcall("coil::round_"),
    "trunc": _call("std::trunc"),
    "eq": _infix("=="), "ne": _infix("!="), "lt": _infix("<"), "le": _infix("<="),
    "gt": _infix(">"), "ge": _infix(">="),
    "isnan": lambda a, t: f"coil::isnan_({a[0]})", "isinf": _call("std::isinf"),
    "signbit": _call("coil::signbit_"),
    "logical_and": _infix("&&"), "logical_or": _infix("||"),
    "logical_xor": lambda a, t: f"(bool({a[0]}) != bool({a[1]}))", "logical_not": lambda a, t: f"(!{a[0]})",
    "bitwise_and": _infix("&"), "bitwise_or": _infix("|"), "bitwise_xor": _infix("^"),
    "bitwise_not": lambda a, t: f"(!{a[0]})" if t == "bool" else f"(~{a[0]})",
    "lshift": _tcall("coil::shift_left"), "rshift": _tcall("coil::shift_right"),
    "where": lambda a, t: f"({a[0]} ? {a[1]} : {a[2]})",
    "rand": _call("coil::philox_rand"), "randn": _call("coil::philox_randn"),
}

#: Ops that call into libm or Coil's inline vector math (tens of cycles per vector): worth a
#: store and a load to not compute twice (see :mod:`.stash`).
COSTLY_OPS = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma",
    "sigmoid", "pow", "atan2", "hypot", "rand", "randn",
})


def literal(value: object, dtype: torch.dtype) -> str:
    """A C++ expression of type ``CTYPES[dtype]`` holding ``value``."""
    t = CTYPES[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            body = "std::numeric_limits<double>::quiet_NaN()"
        elif math.isinf(value):
            body = ("" if value > 0 else "-") + "std::numeric_limits<double>::infinity()"
        else:
            body = repr(value)
    else:
        body = f"INT64_C({int(value)})" if abs(int(value)) > 2**31 - 1 else str(int(value))  # type: ignore[call-overload]
    if t == "double":
        return f"double({body})"
    return f"coil::cast<{t}>({body})"


def integer_division(v: Value) -> bool:
    """Whether ``v`` divides integers (``//``, ``%``, ``fmod``, truncating ``/``): a zero
    divisor returns 0 and sets ``coil::division_by_zero`` (coil_cpu.h), so such an op is not
    moved where it would not have run, and a kernel holding one is checked after it runs."""
    return isinstance(v, Op) and v.name in _INTEGER_DIVISIONS and not v.dtype.is_floating_point


_INTEGER_DIVISIONS = frozenset({"floordiv", "truncdiv", "remainder", "fmod"})
