"""The catalogue of pointwise operations an IR ``Op`` may name, with their arity.

This is part of the plugin contract: every device backend's op table implements each name
(the conformance kit checks it). Semantics follow ATen; where ATen leaves a choice open, the
comment says what Coil means."""
from __future__ import annotations

#: name -> number of operands
POINTWISE_OPS: dict[str, int] = {
    # arithmetic (integer division ops are guarded: x/0 gives 0 rather than a trap)
    "add": 2, "sub": 2, "mul": 2, "truediv": 2, "floordiv": 2, "truncdiv": 2,
    "remainder": 2,  # Python's modulo: sign follows the divisor
    "fmod": 2,       # C's modulo: sign follows the dividend
    "neg": 1, "abs": 1, "reciprocal": 1, "square": 1, "sign": 1,
    "maximum": 2, "minimum": 2,  # NaN-propagating
    "clamp_min": 2, "clamp_max": 2,  # NaN in the first operand propagates
    "pow": 2, "atan2": 2, "hypot": 2, "copysign": 2, "nextafter": 2,
    # transcendental
    "exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1,
    "sqrt": 1, "rsqrt": 1, "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1,
    "sinh": 1, "cosh": 1, "tanh": 1, "asinh": 1, "acosh": 1, "atanh": 1,
    "erf": 1, "erfc": 1, "erfinv": 1, "lgamma": 1, "sigmoid": 1,
    # rounding
    "floor": 1, "ceil": 1, "round": 1, "trunc": 1,  # round: half to even, as ATen
    # comparison and predicates (result bool)
    "eq": 2, "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
    "isnan": 1, "isinf": 1, "signbit": 1,
    # logical (operands bool) and bitwise (operands integer or bool)
    "logical_and": 2, "logical_or": 2, "logical_xor": 2, "logical_not": 1,
    "bitwise_and": 2, "bitwise_or": 2, "bitwise_xor": 2, "bitwise_not": 1,
    "lshift": 2, "rshift": 2,
    # selection
    "where": 3,
    # counter-based random numbers: (seed, counter), both int64, result float32. Philox4x32-10
    # (Salmon et al., SC'11) keyed by the seed's low and high words, on the counter
    # (low word of counter, high word, 0, 0); ``rand`` is the first output word's top 24 bits
    # times 2^-24, in [0, 1); ``randn`` is Box-Muller on the first two words,
    # sqrt(-2 log(1 - u0)) * cos(2 pi u1), in float32. ``coil.sdk.reference`` is the exact
    # definition. The core emits them only for backends that declare ``Capabilities.random``.
    "rand": 2, "randn": 2,
}

#: ``randint``'s bounds for the seed the ``rand``/``randn`` ops of a graph take: every int64 but
#: the largest (its high end is exclusive). The core draws one seed per device and call,
#: ``torch.randint(SEED_LOW, SEED_HIGH, ())`` on the device's default generator, so a kernel's
#: random numbers are reproducible under ``torch.manual_seed``.
SEED_LOW, SEED_HIGH = -2**63, 2**63 - 1


#: Ops whose result IEEE 754 defines exactly (correctly rounded or exact), so every device and
#: every code path (scalar, vector, a loop's tail) computes the same bits. The others call a
#: math library whose scalar and vector variants may differ in the last place.
EXACT_OPS: frozenset[str] = frozenset({
    "add", "sub", "mul", "truediv", "floordiv", "truncdiv", "remainder", "fmod",
    "neg", "abs", "reciprocal", "square", "sign", "maximum", "minimum", "clamp_min", "clamp_max",
    "copysign", "nextafter", "sqrt", "floor", "ceil", "round", "trunc",
    "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "signbit",
    "logical_and", "logical_or", "logical_xor", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "lshift", "rshift", "where",
    "rand",  # integer arithmetic and an exact conversion
})
