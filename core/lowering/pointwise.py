"""Lowerings of ATen's elementwise ops: type promotion, broadcasting, and one ``Op`` each."""
from __future__ import annotations

import math

from typing import Any, Sequence

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .. import ir
from ..errors import LoweringError
from .context import LoweringContext, capability
from .registry import lowering
from .values import TensorValue, broadcast_shapes, broadcast_to, cast, const, lazy

aten = torch.ops.aten

LOW_PRECISION = (torch.float16, torch.bfloat16)
#: dtypes Coil generates code for; anything else (complex, float8, wide unsigned) falls back.
SUPPORTED_DTYPES = frozenset({
    torch.float32, torch.float64, torch.bfloat16, torch.float16,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
})


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision floats are computed in float32."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def promoted_dtype(args: Sequence[Any]) -> torch.dtype:
    """ATen's type promotion over tensor values and Python scalars."""
    dummies: list[Any] = []
    for a in args:
        if isinstance(a, TensorValue):
            dummies.append(torch.empty((1,) * a.ndim, dtype=a.dtype, device="meta"))
        elif a is not None:
            dummies.append(a)
    _, result = elementwise_dtypes(*dummies, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return result


def check_dtype(dtype: torch.dtype, op: str) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise LoweringError(op, f"dtype {dtype} is not generated natively")


def pointwise(op: str, args: Sequence[Any], out_dtype: torch.dtype,
              operand_dtype: torch.dtype | None = None) -> TensorValue:
    """``op`` applied elementwise over broadcast ``args`` (tensor values or Python scalars).

    Operands are cast to ``operand_dtype`` (default: ``out_dtype``, half types upcast);
    the result is cast to ``out_dtype``."""
    check_dtype(out_dtype, op)
    tensors = [a for a in args if isinstance(a, TensorValue)]
    if not tensors:
        raise LoweringError(op, "no tensor operand")
    for t in tensors:
        check_dtype(t.dtype, op)
    size = broadcast_shapes(*(t.size for t in tensors))
    operands = [broadcast_to(a, size) if isinstance(a, TensorValue) else a for a in args]
    opnd = compute_dtype(operand_dtype or out_dtype)
    result_dtype = torch.bool if out_dtype == torch.bool else opnd

    def fn(idx: list[ir.Expr]) -> ir.Value:
        vals = [cast(a.load(idx), opnd) if isinstance(a, TensorValue) else const(a, opnd)
                for a in operands]
        return cast(ir.Op(result_dtype, name=op, args=tuple(vals)), out_dtype)

    return lazy(out_dtype, tensors[0].device, size, fn)


def _out_dtype(ctx: LoweringContext) -> torch.dtype:
    meta = ctx.out_meta
    if isinstance(meta, torch.Tensor):
        return meta.dtype
    raise LoweringError(ctx.origin, "no tensor result")


def _rounded(a: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """An operand of a comparison in ``dtype``, as eager compares: half types are compared in
    float32 here, so a Python number or a wider tensor is first rounded to the half type
    (``bf16 == 3.3`` compares with 3.296875, the bf16 nearest 3.3). A symbolic size (a
    ``SymInt``, ``x.size(0) + 2102``) is rounded when the kernel runs, by a 0-d value of the
    half type; a ``SymFloat`` (``x.size(0) / 10``) is read as its number, as a constant
    operand is (a guard on it), and rounded now (both were used unrounded: found by a hunt)."""
    if dtype not in (torch.float16, torch.bfloat16):
        return a
    if isinstance(a, torch.SymFloat):
        a = float(a)
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return float(torch.tensor(a, dtype=torch.float64).to(dtype))
    if isinstance(a, torch.SymInt):
        return lazy(dtype, device, (), lambda idx: cast(const(a, torch.float32), dtype))
    if isinstance(a, TensorValue) and a.dtype != dtype:
        return lazy(dtype, a.device, a.size, lambda idx: cast(a.load(idx), dtype))
    return a


#: Ops eager has no bool kernel for (``bool_tensor % True`` raises, on the CPU and CUDA).
BOOL_REFUSED = frozenset({"remainder", "fmod", "pow", "abs"})

#: Ops whose operands eager's kernels round to a half-precision common dtype before computing
#: in float32 (a Python number, a 0-d tensor of a wider float type): ATen converts them to
#: the common dtype, on the CPU and CUDA (a CUDA ``x_fp16 % 0.1`` differed from Coil's
#: float32 one by up to 0.1 on an H100, session 34). ``mul`` and ``div`` read a scalar
#: unrounded on both; ``add`` and ``sub`` (and ``alpha``) round it on the CPU only
#: (:data:`ADD_SUB`, ``Capabilities.half_add_scalars_rounded``).
SCALAR_ROUNDING_OPS = frozenset({"remainder", "fmod", "pow", "atan2"})
ADD_SUB = frozenset({"add", "sub"})


def scalars_rounded(op: str, args: Sequence[Any]) -> list[Any]:
    """``args`` of ``op`` as eager reads them: rounded to a half-precision common dtype for
    :data:`SCALAR_ROUNDING_OPS`, and for :data:`ADD_SUB` where the backend says its eager
    does (``x_fp16 + 1000.7`` adds 1000.5 on the CPU, 1000.7 on CUDA)."""
    tensors = [a for a in args if isinstance(a, TensorValue)]
    if op not in SCALAR_ROUNDING_OPS | ADD_SUB or not tensors:
        return list(args)
    common = promoted_dtype(args[:2])  # add's and sub's alpha does not take part in promotion
    if common not in LOW_PRECISION:
        return list(args)
    if op in ADD_SUB and not capability(tensors[0].device, "half_add_scalars_rounded", False):
        return list(args)
    return [_rounded(a, common, tensors[0].device) for a in args]


def _register(ops: Sequence[Any], name: str, kind: str) -> None:
    def lower(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
        if kwargs:
            raise LoweringError(ctx.origin, f"unsupported arguments {sorted(kwargs)}")
        out = _out_dtype(ctx)
        if name in BOOL_REFUSED and out == torch.bool:
            raise LoweringError(ctx.origin, f"{name} of bools (eager has no kernel for it and raises)")
        if kind == "arith":
            args = tuple(scalars_rounded(name, args))
        if kind == "compare":
            common = promoted_dtype(args)
            device = next(a.device for a in args if isinstance(a, TensorValue))
            return pointwise(name, [_rounded(a, common, device) for a in args], out, operand_dtype=common)
        if kind == "predicate":
            return pointwise(name, args, out, operand_dtype=args[0].dtype)
        if kind == "logical":
            return pointwise(name, args, out, operand_dtype=torch.bool)
        return pointwise(name, args, out)

    for op in ops:
        lowering(op)(lower)


_SIMPLE: list[tuple[str, list[Any], str]] = [
    ("mul", [aten.mul.Tensor, aten.mul.Scalar], "arith"),
    ("truediv", [aten.div.Tensor, aten.div.Scalar], "arith"),
    ("neg", [aten.neg], "arith"), ("abs", [aten.abs], "arith"),
    ("reciprocal", [aten.reciprocal], "arith"), ("sign", [aten.sign, aten.sgn], "arith"),
    ("maximum", [aten.maximum], "arith"), ("minimum", [aten.minimum], "arith"),
    ("pow", [aten.pow.Tensor_Tensor], "arith"),
    ("atan2", [aten.atan2], "arith"), ("hypot", [aten.hypot], "arith"),
    ("copysign", [aten.copysign.Tensor, aten.copysign.Scalar], "arith"),
    ("nextafter", [aten.nextafter], "arith"),
    ("fmod", [aten.fmod.Tensor, aten.fmod.Scalar], "arith"),
    ("remainder", [aten.remainder.Tensor, aten.remainder.Scalar], "arith"),
    ("exp", [aten.exp], "arith"), ("exp2", [aten.exp2], "arith"), ("expm1", [aten.expm1], "arith"),
    ("log", [aten.log], "arith"), ("log2", [aten.log2], "arith"), ("log10", [aten.log10], "arith"),
    ("log1p", [aten.log1p], "arith"), ("sqrt", [aten.sqrt], "arith"), ("rsqrt", [aten.rsqrt], "arith"),
    ("sin", [aten.sin], "arith"), ("cos", [aten.cos], "arith"), ("tan", [aten.tan], "arith"),
    ("asin", [aten.asin], "arith"), ("acos", [aten.acos], "arith"), ("atan", [aten.atan], "arith"),
    ("sinh", [aten.sinh], "arith"), ("cosh", [aten.cosh], "arith"), ("tanh", [aten.tanh], "arith"),
    ("asinh", [aten.asinh], "arith"), ("acosh", [aten.acosh], "arith"), ("atanh", [aten.atanh], "arith"),
    ("erf", [aten.erf], "arith"), ("erfc", [aten.erfc], "arith"), ("erfinv", [aten.erfinv], "arith"),
    ("lgamma", [aten.lgamma], "arith"), ("sigmoid", [aten.sigmoid], "arith"),
    ("floor", [aten.floor], "arith"), ("ceil", [aten.ceil], "arith"),
    ("round", [aten.round.default], "arith"), ("trunc", [aten.trunc], "arith"),
    ("eq", [aten.eq.Tensor, aten.eq.Scalar], "compare"), ("ne", [aten.ne.Tensor, aten.ne.Scalar], "compare"),
    ("lt", [aten.lt.Tensor, aten.lt.Scalar], "compare"), ("le", [aten.le.Tensor, aten.le.Scalar], "compare"),
    ("gt", [aten.gt.Tensor, aten.gt.Scalar], "compare"), ("ge", [aten.ge.Tensor, aten.ge.Scalar], "compare"),
    ("isnan", [aten.isnan], "predicate"), ("isinf", [aten.isinf], "predicate"),
    ("signbit", [aten.signbit], "predicate"),
    ("logical_and", [aten.logical_and], "logical"), ("logical_or", [aten.logical_or], "logical"),
    ("logical_xor", [aten.logical_xor], "logical"), ("logical_not", [aten.logical_not], "logical"),
    ("bitwise_and", [aten.bitwise_and.Tensor, aten.bitwise_and.Scalar], "arith"),
    ("bitwise_or", [aten.bitwise_or.Tensor, aten.bitwise_or.Scalar], "arith"),
    ("bitwise_xor", [aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar], "arith"),
    ("bitwise_not", [aten.bitwise_not], "arith"),
    ("lshift", [aten.bitwise_left_shift.Tensor, aten.__lshift__.Scalar], "arith"),
    ("rshift", [aten.bitwise_right_shift.Tensor, aten.__rshift__.Scalar], "arith"),
]

for _name, _ops, _kind in _SIMPLE:
    _register(_ops, _name, _kind)


@lowering(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar,
          aten.rsub.Tensor)
def _add_sub(ctx: LoweringContext, a: Any, b: Any, alpha: Any = 1) -> TensorValue:
    """``a + alpha * b`` (or minus) computed in the compute dtype and rounded once, as eager's
    kernels do: ``alpha * b`` is not rounded to a half type first. Where eager's kernels round
    scalars (:func:`scalars_rounded`), ``alpha`` and scalar operands are rounded to the half
    type first."""
    out = _out_dtype(ctx)
    name = ctx.origin
    reverse = "rsub" in name
    if reverse:
        a, b = b, a
    op = "add" if "add" in name else "sub"
    if not isinstance(a, TensorValue) and not isinstance(b, TensorValue):
        raise LoweringError(name, "no tensor operand")
    if op == "sub" and any(isinstance(v, bool) or (isinstance(v, TensorValue) and v.dtype == torch.bool)
                           for v in (a, b)):
        raise LoweringError(name, "subtraction with a bool operand (eager raises)")
    if out in LOW_PRECISION:  # eager's CPU kernels convert alpha to the type, checked: past it they raise
        check_scalar_fits(name, alpha, out)
    a, b, alpha = scalars_rounded(op, [a, b, alpha])
    if alpha == 1:
        return pointwise(op, [a, b], out)
    if not isinstance(b, TensorValue):
        return pointwise(op, [a, b * alpha], out)
    tensors = [t for t in (a, b) if isinstance(t, TensorValue)]
    size = broadcast_shapes(*(t.size for t in tensors))
    a_, b_ = (broadcast_to(t, size) if isinstance(t, TensorValue) else t for t in (a, b))
    opnd = compute_dtype(out)

    def fn(idx: list[ir.Expr]) -> ir.Value:
        x, y = (cast(t.load(idx), opnd) if isinstance(t, TensorValue) else const(t, opnd) for t in (a_, b_))
        scaled = ir.Op(opnd, name="mul", args=(y, const(alpha, opnd)))
        return cast(ir.Op(opnd, name=op, args=(x, scaled)), out)

    return lazy(out, tensors[0].device, size, fn)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx: LoweringContext, a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorValue:
    out = _out_dtype(ctx)
    if rounding_mode is None:
        return pointwise("truediv", [a, b], out)
    if out.is_floating_point:
        if rounding_mode == "floor":
            return floor_divide_float(a, b, out)
        if _divides_as_a_scalar(b):
            # eager's CPU kernels divide by a number (or a 0-d CPU tensor) in float32 and
            # round once; by a tensor, a half type's quotient is rounded before ``trunc``
            return pointwise("trunc", [pointwise("truediv", [a, b], compute_dtype(out))], out)
        return pointwise("trunc", [pointwise("truediv", [a, b], out)], out)
    return pointwise("floordiv" if rounding_mode == "floor" else "truncdiv", [a, b], out)


def _divides_as_a_scalar(b: Any) -> bool:
    """Whether eager divides by ``b`` as by a number: a number, or a 0-d tensor of a device
    whose eager kernels read it so (not where ``Capabilities.zero_dim_operands_cast``: CUDA's
    cast it to the other operand's type, as a tensor)."""
    if isinstance(b, TensorValue):
        return len(b.size) == 0 and not capability(b.device, "zero_dim_operands_cast", False)
    return isinstance(b, (int, float)) and not isinstance(b, bool)


@lowering(aten.floor_divide)
def _floor_divide(ctx: LoweringContext, a: Any, b: Any) -> TensorValue:
    out = _out_dtype(ctx)
    return floor_divide_float(a, b, out) if out.is_floating_point else pointwise("floordiv", [a, b], out)


def floor_divide_float(a: Any, b: Any, out: torch.dtype) -> TensorValue:
    """Floating ``a // b`` as eager computes it (c10's ``div_floor_floating``), not as
    ``floor(a / b)``: from ``fmod``, so that ``a == b * (a // b) + a % b`` holds as in Python
    (``1.0 // 0.1`` is 9, where ``floor(1.0 / 0.1)`` is 10), in float32 for half types."""
    tensors = [t for t in (a, b) if isinstance(t, TensorValue)]
    if not tensors:
        raise LoweringError("floor_divide", "no tensor operand")
    size = broadcast_shapes(*(t.size for t in tensors))
    f = compute_dtype(out)
    av, bv = (broadcast_to(v, size) if isinstance(v, TensorValue) else v for v in (a, b))

    def fn(idx: list[ir.Expr]) -> ir.Value:
        x, y = (cast(v.load(idx), f) if isinstance(v, TensorValue) else const(v, f) for v in (av, bv))

        def op(name: str, *args: ir.Value, dtype: torch.dtype = f) -> ir.Value:
            return ir.Op(dtype, name=name, args=args)

        def test(name: str, *args: ir.Value) -> ir.Value:
            return op(name, *args, dtype=torch.bool)

        zero, one = const(0, f), const(1, f)
        mod = op("fmod", x, y)
        div = op("truediv", op("sub", x, mod), y)
        below = test("logical_and", test("ne", mod, zero), test("logical_xor", test("lt", y, zero), test("lt", mod, zero)))
        div = op("where", below, op("sub", div, one), div)
        floor = op("floor", div)
        floor = op("where", test("gt", op("sub", div, floor), const(0.5, f)), op("add", floor, one), floor)
        quotient = op("truediv", x, y)
        result = op("where", test("ne", div, zero), floor, op("copysign", zero, quotient))
        return cast(op("where", test("eq", y, zero), quotient, result), out)

    return lazy(out, tensors[0].device, size, fn)


@lowering(aten.pow.Tensor_Scalar)
def _pow_scalar(ctx: LoweringContext, a: TensorValue, exponent: Any) -> TensorValue:
    out = _out_dtype(ctx)
    if not out.is_floating_point and not out.is_complex and isinstance(exponent, int) and exponent < 0:
        # eager raises "Integers to negative integer powers are not allowed": the library will
        raise LoweringError(ctx.origin, "an integer to a negative integer power")
    if out.is_floating_point:  # eager converts the exponent to the type, checked: past it, it raises
        check_scalar_fits(ctx.origin, exponent, out)
    if exponent == 2:
        return pointwise("square", [a], out)
    if exponent == 1:
        return pointwise("mul", [a, 1], out)
    if exponent == 0.5 and out.is_floating_point:
        return pointwise("sqrt", [a], out)
    if exponent == -1 and out.is_floating_point:
        return pointwise("reciprocal", [a], out)
    if exponent == -0.5 and out.is_floating_point:
        return pointwise("rsqrt", [a], out)
    if exponent in (3, -2) and out.is_floating_point and not out.is_complex:
        return _pow_by_products(a, int(exponent), out)
    return pointwise("pow", scalars_rounded("pow", [a, exponent]), out)


def _pow_by_products(a: TensorValue, exponent: int, out: torch.dtype) -> TensorValue:
    """``a ** 3`` as ``a * a * a`` and ``a ** -2`` as ``1 / (a * a)``: ATen's own special cases
    for these exponents (CPU and CUDA), so no general ``pow`` is evaluated. In the compute
    dtype; bfloat16 rounds the square to bfloat16 first, as ATen's bfloat16 arithmetic does
    (float32 and bfloat16 results are eager's bit for bit on the CPU)."""
    opnd = compute_dtype(out)

    def fn(idx: list[ir.Expr]) -> ir.Value:
        x = cast(a.load(idx), opnd)
        square = ir.Op(opnd, name="mul", args=(x, x))
        if out == torch.bfloat16:
            square = cast(cast(square, out), opnd)
        value = (ir.Op(opnd, name="mul", args=(square, x)) if exponent == 3 else
                 ir.Op(opnd, name="truediv", args=(const(1, opnd), square)))
        return cast(value, out)

    return lazy(out, a.device, a.size, fn)


@lowering(aten.pow.Scalar)
def _pow_scalar_base(ctx: LoweringContext, base: Any, exponent: TensorValue) -> TensorValue:
    out = _out_dtype(ctx)
    if isinstance(base, bool) and exponent.dtype == torch.bool:
        raise LoweringError(ctx.origin, "pow of bools (eager has no kernel for it and raises)")
    return pointwise("pow", scalars_rounded("pow", [base, exponent]), out)


@lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor,
          aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp(ctx: LoweringContext, x: TensorValue, lo: Any = None, hi: Any = None) -> TensorValue:
    out = _out_dtype(ctx)
    if "clamp_max" in ctx.origin:
        lo, hi = None, lo
    operand = promoted_dtype([x, lo, hi])
    for bound in (lo, hi):
        check_scalar_fits(ctx.origin, bound, out)
    result: TensorValue = x
    # a bound that is a tensor or NaN: NaN-propagating maximum / minimum, as eager's clamp
    # returns NaN for a NaN bound (clamp_min and clamp_max propagate only x's NaN)
    if lo is not None:
        result = pointwise("maximum" if _maybe_nan(lo) else "clamp_min", [result, lo], out, operand_dtype=operand)
    if hi is not None:
        result = pointwise("minimum" if _maybe_nan(hi) else "clamp_max", [result, hi], out, operand_dtype=operand)
    if lo is None and hi is None:
        raise LoweringError(ctx.origin, "clamp with neither bound")
    return result


def check_scalar_fits(op: str, value: Any, dtype: torch.dtype) -> None:
    """Raise ``LoweringError`` (the library call then raises as eager) where eager converts
    the scalar ``value`` to ``dtype`` with an overflow check and it does not fit
    (``int8.clamp(-300, 300)``, ``uint8.masked_fill(m, 300)``, ``float16.clamp(min=1e10)``,
    ``torch.full((2,), 1e39)``: eager raises "value cannot be converted to type int8_t without
    overflow"; a kernel would wrap it, or give inf)."""
    if dtype.is_complex or dtype == torch.bool or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if dtype.is_floating_point:  # finite and past the type's range
        if not (isinstance(value, float) and not math.isfinite(value)) and abs(value) > torch.finfo(dtype).max:
            raise LoweringError(op, f"{value!r} overflows {dtype} (eager raises)")
        return
    info = torch.iinfo(dtype)
    if not (info.min <= value <= info.max) or (isinstance(value, float) and not math.isfinite(value)):
        raise LoweringError(op, f"{value!r} does not fit {dtype} (eager raises)")


def _maybe_nan(bound: Any) -> bool:
    if isinstance(bound, TensorValue):
        return bound.dtype.is_floating_point
    return isinstance(bound, float) and math.isnan(bound) and NAN_SCALAR_BOUND_PROPAGATES


#: Whether eager's ``clamp`` returns NaN for a NaN scalar bound: torch 2.13 does, torch 2.11
#: ignores the bound (on the CPU and CUDA alike). Asked of eager itself when this module loads
#: (outside any fake mode a compile may run under).
NAN_SCALAR_BOUND_PROPAGATES = bool(torch.clamp(torch.tensor(0.0), min=float("nan")).isnan().item())


@lowering(aten.relu)
def _relu(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return pointwise("clamp_min", [x, 0], _out_dtype(ctx))


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: LoweringContext, cond: Any, a: Any, b: Any) -> TensorValue:
    out = _out_dtype(ctx)
    tensors = [t for t in (cond, a, b) if isinstance(t, TensorValue)]
    size = broadcast_shapes(*(t.size for t in tensors))
    opnd = compute_dtype(out)
    c = broadcast_to(cond, size)
    av = broadcast_to(a, size) if isinstance(a, TensorValue) else a
    bv = broadcast_to(b, size) if isinstance(b, TensorValue) else b

    def fn(idx: list[ir.Expr]) -> ir.Value:
        def val(v: Any) -> ir.Value:
            return cast(v.load(idx), opnd) if isinstance(v, TensorValue) else const(v, opnd)
        return cast(ir.Op(opnd, name="where", args=(cast(c.load(idx), torch.bool), val(av), val(bv))), out)

    return lazy(out, tensors[0].device, size, fn)
