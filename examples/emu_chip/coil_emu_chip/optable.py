"""C spellings for the emu chip: the C type of each dtype (as a value and in memory), loads
and stores (half types convert through float), casts, literals, index expressions, and one
table with a rule per pointwise op of Coil's catalogue. Ops that are more than a C operator or
a ``<tgmath.h>`` call are per-type helpers of the runtime header, ``emu_<op>_<suffix>``."""
from __future__ import annotations

import torch

from coil.sdk.codegen import IndexPrinter, IndexSpelling

#: C type of a computed value; bf16 and fp16 are computed in float, as ATen does.
VALUE_TYPES: dict[torch.dtype, str] = {
    torch.float32: "float", torch.float64: "double", torch.bfloat16: "float",
    torch.float16: "float", torch.int8: "int8_t", torch.int16: "int16_t",
    torch.int32: "int32_t", torch.int64: "int64_t", torch.uint8: "uint8_t", torch.bool: "bool",
}
#: Suffix of the header's helpers for each value type (``emu_remainder_f32``).
SUFFIX = {"float": "f32", "double": "f64", "int8_t": "i8", "int16_t": "i16", "int32_t": "i32",
          "int64_t": "i64", "uint8_t": "u8", "bool": "b8"}
#: Half types live in memory as 16-bit patterns, converted by ``emu_from_*``/``emu_to_*``.
HALVES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def memory_type(dtype: torch.dtype) -> str:
    return "uint16_t" if dtype in HALVES else VALUE_TYPES[dtype]


def load(dtype: torch.dtype, ref: str) -> str:
    return f"emu_from_{HALVES[dtype]}({ref})" if dtype in HALVES else ref


def store(dtype: torch.dtype, value: str) -> str:
    return f"emu_to_{HALVES[dtype]}({value})" if dtype in HALVES else value


def cast(dtype: torch.dtype, value: str) -> str:
    """``value`` converted to ``dtype``; to a half type it rounds, and stays a float."""
    return f"emu_round_{HALVES[dtype]}({value})" if dtype in HALVES else f"({VALUE_TYPES[dtype]})({value})"


def literal(value: object, dtype: torch.dtype) -> str:
    """A constant of the value's own type: ``(float)0.1`` rounds once, as eager does."""
    text = repr(value) if isinstance(value, float) else str(int(value))  # type: ignore[call-overload]
    text = {"nan": "NAN", "inf": "INFINITY", "-inf": "-INFINITY"}.get(text, text)
    return f"(({VALUE_TYPES[dtype]}){text})"


#: An index expression of the kernel IR (a sympy expression) or an int, in C: index values are
#: non-negative, so C's ``/`` is floor division; min/max are the runtime header's macros.
idx = IndexPrinter(IndexSpelling(floordiv="({0} / {1})"))


_INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "eq": "==", "ne": "!=", "lt": "<",
          "le": "<=", "gt": ">", "ge": ">=", "logical_and": "&&", "logical_or": "||",
          "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "lshift": "<<", "rshift": ">>"}
_LIBM = ("atan2 hypot copysign nextafter exp exp2 expm1 log log2 log10 log1p sqrt sin cos tan asin "
         "acos atan sinh cosh tanh asinh acosh atanh erf erfc lgamma").split()
_HELPERS = ("floordiv truncdiv remainder fmod abs sign maximum minimum clamp_min clamp_max pow rsqrt "
            "sigmoid erfinv floor ceil trunc round isnan isinf signbit").split()

#: One rule per op: a format string over the operands ``{0}``, ``{1}``.., all of them ``{args}``,
#: their C type ``{t}`` and its helper suffix ``{s}``.
OPS: dict[str, str] = {
    **{name: f"({{0}} {op} {{1}})" for name, op in _INFIX.items()},
    **{name: f"{name}({{args}})" for name in _LIBM},
    **{name: f"emu_{name}_{{s}}({{args}})" for name in _HELPERS},
    "neg": "(-{0})", "reciprocal": "(({t})1 / {0})", "square": "({0} * {0})", "logical_not": "(!{0})",
    "logical_xor": "(!{0} != !{1})", "bitwise_not": "(~{0})", "where": "({0} ? {1} : {2})",
}


def spell(op: str, args: list[str], t: str) -> str:
    """The C expression of ``op`` on ``args`` (C expressions whose type is ``t``)."""
    rule = "(!{0})" if op == "bitwise_not" and t == "bool" else OPS[op]
    return rule.format(*args, args=", ".join(args), t=t, s=SUFFIX[t])


#: How a scatter combines the old value with a new one, as an op of the table.
SCATTER_COMBINE = {"add": "add", "mul": "mul", "amax": "maximum", "amin": "minimum"}
