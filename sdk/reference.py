"""A reference executor of Coil's kernel IR in torch operations: the living definition of what
a :class:`~coil.sdk.kernel.Kernel` means, in the spirit of tinygrad's Python emulator.

Every node is evaluated over its whole index grid at once (loop variables become broadcast
``arange`` tensors, index expressions become integer tensors, loads and stores become
gathers and scatters on a flat view of each buffer), so it runs on any device whose tensors
support torch operations. It is slow but correct, and it is what the conformance kit holds a
generated kernel to. :class:`ReferenceBackend` serves a device with it: the backend that
``coil new-plugin`` generates starts from it, and a vendor replaces it with real codegen.

Semantics, matching the reference plugins: an ``Op`` computes in the common type of its
operands and converts to its own dtype; integer division by zero gives 0; ``Masked`` bodies
read memory only where the mask holds; an ``Indirect`` index wraps negative values once;
reductions accumulate in ``acc_dtype`` (``argmax``/``argmin`` give the first extreme index,
NaN counting as extreme; an empty ``argmax`` is -1, an empty ``welford`` is (0, 0)); scans
are inclusive; scatter overwrites keep the last write."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import sympy
import torch

from coil.sdk.ir import (Cast, Const, IndexValue, Indirect, Load, Masked, Op, ReductionNode, ScanNode,
                     ScatterAccumulate, ScatterNode, Value)
from coil.sdk.kernel import Kernel, KernelNode
from coil.sdk.symbolic import FloorDiv, ModIdx

from .backend import Capabilities, DeviceBackend
from .codegen import INTEGER_IDENTITY_OPS, ValueScope, ValueVisitor, highest, lowest

Tensor = torch.Tensor
Index = Any  # a Python int or an int64 tensor

# ----------------------------------------------------------------------------- the op table


def _int_guarded(int_fn: Callable, float_fn: Callable) -> Callable[[Tensor, Tensor], Tensor]:
    """A division-like op: ``float_fn`` for floats; for integers ``int_fn``, with x/0 = 0."""
    def op(a: Tensor, b: Tensor) -> Tensor:
        if a.is_floating_point():
            return float_fn(a, b)
        zero = b == 0
        out = int_fn(a, torch.where(zero, torch.ones_like(b), b))
        return torch.where(zero, torch.zeros_like(out), out)
    return op


def _pow(a: Tensor, b: Tensor) -> Tensor:
    if a.is_floating_point():
        return torch.pow(a, b)
    neg = b < 0  # integer a ** negative b: 1 for a == 1, +-1 for a == -1, else 0
    out = torch.pow(a, torch.where(neg, torch.zeros_like(b), b))
    special = torch.where(a == 1, 1, torch.where(a == -1, torch.where(b % 2 != 0, -1, 1), 0))
    return torch.where(neg, special.to(out.dtype), out)


def _same_for_bool(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    return lambda a: a if a.dtype == torch.bool else fn(a)


def _div(mode: str) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda a, b: torch.div(a, b, rounding_mode=mode)


_truncdiv = _int_guarded(_div("trunc"), _div("trunc"))


def _reciprocal(a: Tensor) -> Tensor:
    return torch.reciprocal(a) if a.is_floating_point() else _truncdiv(torch.ones_like(a), a)


# Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
# SC'11) in int64 tensors holding 32-bit words, so that every product stays exact.
_WORD = 0xFFFFFFFF
_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key increments (Weyl sequence)


def _mulhilo(a: int, b: Tensor) -> tuple[Tensor, Tensor]:
    """The high and low words of the 64-bit product of the words ``a`` and ``b``, computed in
    16-bit halves of ``b`` (int64 would overflow on the whole product)."""
    low_part = a * (b & 0xFFFF)
    s = a * (b >> 16) + (low_part >> 16)
    return s >> 16, ((s & 0xFFFF) << 16) | (low_part & 0xFFFF)


def philox(seed: Tensor, counter: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox4x32-10 keyed by the int64 ``seed``'s (low, high) words, on the 128-bit counter
    (low word of ``counter``, high word, 0, 0): four int64 tensors of 32-bit words."""
    k0, k1 = seed & _WORD, (seed >> 32) & _WORD
    c0, c1 = counter & _WORD, (counter >> 32) & _WORD
    c2 = c3 = torch.zeros_like(c0)
    for _ in range(10):
        hi0, lo0 = _mulhilo(_PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(_PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _PHILOX_W0) & _WORD, (k1 + _PHILOX_W1) & _WORD
    return c0, c1, c2, c3


def _unit(word: Tensor) -> Tensor:
    """A 32-bit word as a float32 in [0, 1): its top 24 bits times 2^-24 (exact)."""
    return (word >> 8).to(torch.float32) * 2.0 ** -24


def philox_rand(seed: Tensor, counter: Tensor) -> Tensor:
    """The catalogue's ``rand``: uniform float32 in [0, 1) from the first Philox word."""
    return _unit(philox(seed, counter)[0])


def philox_randn(seed: Tensor, counter: Tensor) -> Tensor:
    """The catalogue's ``randn``: Box-Muller on the first two words, in float32;
    ``1 - u0`` lies in (0, 1], so the logarithm is finite."""
    w0, w1, _, _ = philox(seed, counter)
    radius = torch.sqrt(-2.0 * torch.log(1.0 - _unit(w0)))
    return radius * torch.cos(_unit(w1) * torch.tensor(2 * math.pi, dtype=torch.float32))


#: The torch spelling of every op of ``coil.sdk.ops.POINTWISE_OPS`` (operands already share a dtype).
OPS: dict[str, Callable[..., Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": _int_guarded(_div("floor"), _div("floor")),
    "truncdiv": _truncdiv,
    "remainder": _int_guarded(torch.remainder, torch.remainder),
    "fmod": _int_guarded(torch.fmod, torch.fmod),
    "neg": torch.neg, "abs": _same_for_bool(torch.abs), "reciprocal": _reciprocal,
    "square": lambda a: a * a, "sign": _same_for_bool(torch.sign),
    "maximum": torch.maximum, "minimum": torch.minimum,
    "clamp_min": lambda a, lo: torch.where(a < lo, lo, a),
    "clamp_max": lambda a, hi: torch.where(a > hi, hi, a),
    "pow": _pow, "atan2": torch.atan2, "hypot": torch.hypot, "copysign": torch.copysign,
    "nextafter": torch.nextafter,
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log,
    "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv,
    "lgamma": torch.lgamma, "sigmoid": torch.sigmoid,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "isnan": torch.isnan, "isinf": torch.isinf, "signbit": torch.signbit,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "logical_not": torch.logical_not,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "bitwise_not": torch.bitwise_not,
    "lshift": torch.bitwise_left_shift, "rshift": torch.bitwise_right_shift,
    "where": torch.where,
    "rand": philox_rand, "randn": philox_randn,
}


def apply_op(name: str, args: list[Tensor], dtype: torch.dtype) -> Tensor:
    """``Op(name, args)`` with result type ``dtype``: computed in the operands' common type."""
    if name == "where":
        a, b = _promoted(args[1:])
        return torch.where(args[0].bool(), a, b).to(dtype)
    args = _promoted(args)
    if name in INTEGER_IDENTITY_OPS and not args[0].is_floating_point():  # rounding an integer
        return args[0].to(dtype)
    return OPS[name](*args).to(dtype)


def _promoted(args: list[Tensor]) -> list[Tensor]:
    common = functools.reduce(torch.promote_types, (a.dtype for a in args))
    return [a.to(common) for a in args]


# ----------------------------------------------------------------------------- index expressions


def eval_index(e: Any, env: Any) -> Index:
    """An index expression (sympy) evaluated with ``env`` (symbol name -> int or tensor)."""
    if isinstance(e, int):
        return e
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return env[e.name]
    args = [eval_index(a, env) for a in e.args]
    if isinstance(e, FloorDiv):
        return args[0] // args[1]
    if isinstance(e, ModIdx):
        return args[0] % args[1]
    if isinstance(e, sympy.Add):
        return functools.reduce(lambda a, b: a + b, args)
    if isinstance(e, sympy.Mul):
        return functools.reduce(lambda a, b: a * b, args)
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        return args[0] ** int(e.exp)
    if isinstance(e, (sympy.Min, sympy.Max)):
        pick = torch.minimum if isinstance(e, sympy.Min) else torch.maximum
        if not any(isinstance(a, Tensor) for a in args):
            return min(args) if isinstance(e, sympy.Min) else max(args)
        tensors = [a for a in args if isinstance(a, Tensor)]
        return functools.reduce(pick, [torch.as_tensor(a, device=tensors[0].device) for a in args])
    raise NotImplementedError(f"reference executor: index expression {e} ({type(e).__name__})")


# ----------------------------------------------------------------------------- values


class _Scope(ValueScope[Tensor]):
    """Values computed so far, bound indirect symbols and the mask in force; a ``Masked``
    body gets a child scope, so values computed under a mask never leak out of it. Values are
    keyed by identity: the executor evaluates a tree exactly as built (``Const(0.0)`` and
    ``Const(-0.0)`` are equal values)."""

    def __init__(self, parent: _Scope | None = None, *, env: dict[str, Index] | None = None,
                 mask: Tensor | None = None) -> None:
        super().__init__(parent)
        self.env: dict[str, Index] = env if env is not None else parent.env  # type: ignore[union-attr]
        self.mask = mask if mask is not None or parent is None else parent.mask
        self.symbols: dict[str, Tensor] = {}

    def key(self, value: Value) -> Hashable:
        return id(value)

    def index_env(self) -> dict[str, Index]:
        chain, s = [], self
        while s is not None:
            chain.append(s.symbols)
            s = s.parent  # type: ignore[assignment]
        out = dict(self.env)
        for symbols in reversed(chain):
            out.update(symbols)
        return out


class _Executor(ValueVisitor[_Scope, Tensor]):
    """Runs one kernel on flat views of its buffers."""

    def __init__(self, kernel: Kernel, buffers: dict[str, Tensor], sizes: dict[str, int],
                 device: torch.device) -> None:
        self.k = kernel
        self.buffers = buffers
        self.sizes = sizes
        self.device = device
        self.locals: dict[str, Tensor] = {}  # internal buffers: values over the grid
        self.x: tuple[int, ...] = ()
        self.r: tuple[int, ...] = ()
        self.env: dict[str, Index] = dict(sizes)

    def set_grid(self, x: Sequence[Any], r: Sequence[Any]) -> None:
        """Loop variables ``x0..`` over ``x`` then ``r0..`` over ``r``, as broadcast aranges."""
        self.x = tuple(int(eval_index(n, self.sizes)) for n in x)
        self.r = tuple(int(eval_index(n, self.sizes)) for n in r)
        dims = len(self.x) + len(self.r)
        self.env = dict(self.sizes)
        for i, n in enumerate(self.x + self.r):
            shape = [1] * dims
            shape[i] = n
            name = f"x{i}" if i < len(self.x) else f"r{i - len(self.x)}"
            self.env[name] = torch.arange(n, device=self.device).view(shape)

    def shape(self, level: str) -> tuple[int, ...]:
        return self.x + (self.r if level == "r" else (1,) * len(self.r))

    def scope(self) -> _Scope:
        return _Scope(env=self.env)

    # -- values

    def value(self, v: Value, scope: _Scope) -> Tensor:
        got = scope.get(v)
        if got is None:
            got = scope[v] = self.visit(v, scope)
        return got

    def visit_const(self, v: Const, scope: _Scope) -> Tensor:
        return torch.full((), v.value, dtype=v.dtype, device=self.device)

    def visit_index_value(self, v: IndexValue, scope: _Scope) -> Tensor:
        return torch.as_tensor(eval_index(v.expr, scope.index_env()), device=self.device).to(v.dtype)

    def visit_load(self, v: Load, scope: _Scope) -> Tensor:
        return self._load(v, scope)

    def visit_op(self, v: Op, scope: _Scope) -> Tensor:
        return apply_op(v.name, [self.value(a, scope) for a in v.args], v.dtype)

    def visit_cast(self, v: Cast, scope: _Scope) -> Tensor:
        return self.value(v.x, scope).to(v.dtype)  # type: ignore[arg-type]

    def visit_masked(self, v: Masked, scope: _Scope) -> Tensor:
        mask = self.value(v.mask, scope).bool()  # type: ignore[arg-type]
        inner = mask if scope.mask is None else mask & scope.mask
        body = self.value(v.body, _Scope(scope, mask=inner))  # type: ignore[arg-type]
        return torch.where(mask, body, torch.full((), v.other, dtype=v.dtype, device=self.device))

    def visit_indirect(self, v: Indirect, scope: _Scope) -> Tensor:
        raw = self.value(v.value, scope).to(torch.int64)  # type: ignore[arg-type]
        wrapped = torch.where(raw < 0, raw + eval_index(v.size, scope.index_env()), raw)
        scope.symbols[v.symbol.name] = wrapped
        return wrapped

    def _load(self, v: Load, scope: _Scope) -> Tensor:
        for ind in v.indirect:
            self.value(ind, scope)
        if v.buffer in self.locals:
            return self.locals[v.buffer]
        flat = self.buffers[v.buffer]
        index = torch.as_tensor(eval_index(v.index, scope.index_env()), device=self.device)
        if scope.mask is not None:  # masked-off points read element 0 (never used)
            if flat.numel() == 0:
                return torch.zeros(torch.broadcast_shapes(index.shape, scope.mask.shape),
                                   dtype=flat.dtype, device=self.device).to(v.dtype)
            index = torch.where(scope.mask, index, 0)
        return flat[index].to(v.dtype)

    # -- stores

    def store(self, buf: str, target: str, index: Any, value: Tensor, dtype: torch.dtype,
              shape: tuple[int, ...]) -> None:
        """Write ``value`` over the grid of ``shape`` at ``index``; internal buffers stay values."""
        value = value.to(dtype)
        if buf in self.k.internal:
            self.locals[buf] = value
            return
        idx = torch.as_tensor(eval_index(index, self.env), device=self.device)
        idx, value = (t.expand(shape).reshape(-1) for t in torch.broadcast_tensors(idx, value))
        self.buffers[target][idx] = value

    # -- nodes

    def run(self) -> None:
        special = self.k.special
        if isinstance(special, ScanNode):
            self._scan(special)
        elif isinstance(special, ScatterNode):
            self._scatter(special)
        else:
            self.set_grid(self.k.x_ranges, self.k.r_ranges)
            for loop in self.k.loops:
                for kn in loop.nodes:
                    self._node(kn, loop.level)

    def _node(self, kn: KernelNode, level: str) -> None:
        node = kn.node
        body = self.value(kn.body, self.scope())
        if not isinstance(node, ReductionNode):
            self.store(node.outputs()[0], kn.stores[0], kn.store_index, body, node.layout.dtype,
                       self.shape(level))
            return
        points = self.x + ((_numel(self.r),) if level == "r" else (1,))
        values = body.expand(self.shape(level)).reshape(points)
        results = REDUCTIONS[node.reduction_type](values, node.acc_dtype)
        x_shape = self.shape("x")
        for out, target, result in zip(node.outputs(), kn.stores, results):
            self.store(out, target, kn.store_index, result.reshape(x_shape), node.layout.dtype, x_shape)

    def _scan(self, node: ScanNode) -> None:
        self.set_grid(node.ranges, (node.scan_range,))
        body = self.value(node.body, self.scope()).to(node.acc_dtype).expand(self.shape("r"))
        combine = torch.cumsum if node.combine == "sum" else torch.cumprod
        self.store(node.name, node.name, node.store_index, combine(body, -1), node.layout.dtype,
                   self.shape("r"))

    def _scatter(self, node: ScatterNode) -> None:
        self.set_grid(node.ranges, ())
        base = self.value(node.base, self.scope())
        self.store(node.name, node.name, node.store_index, base, node.layout.dtype, self.shape("x"))
        self.set_grid((), node.src_ranges)
        scope = self.scope()
        for ind in node.target_indirect:
            self.value(ind, scope)
        value = self.value(node.value, scope).to(node.layout.dtype)
        index = torch.as_tensor(eval_index(node.target_index, scope.index_env()), device=self.device)
        index, value = (t.expand(self.r).reshape(-1) for t in torch.broadcast_tensors(index, value))
        _scatter_into(self.buffers[node.name], index, value, node.accumulate)


def _scatter_into(flat: Tensor, index: Tensor, value: Tensor,
                  accumulate: ScatterAccumulate | None) -> None:
    if accumulate == "add":
        flat.index_put_((index,), value, accumulate=True)
    elif accumulate is not None:
        reduce = {"mul": "prod", "amax": "amax", "amin": "amin"}[accumulate]
        flat.scatter_reduce_(0, index, value, reduce)
    elif index.numel():  # overwrite in order: the last write to each element wins
        unique, inverse = torch.unique(index, return_inverse=True)
        order = torch.arange(index.numel(), device=index.device)
        last = torch.full(unique.shape, -1, dtype=torch.int64, device=index.device)
        last.scatter_reduce_(0, inverse, order, "amax")
        flat[unique] = value[last]


def _numel(sizes: Sequence[int]) -> int:
    return functools.reduce(lambda a, b: a * b, sizes, 1)


# ----------------------------------------------------------------------------- reductions


def _extreme(fn: Callable[..., Tensor], empty: Callable[[torch.dtype], Any]) -> Callable:
    def reduce(v: Tensor, acc: torch.dtype) -> tuple[Tensor]:
        v = v.to(acc)
        if v.shape[-1] == 0:
            return (torch.full(v.shape[:-1], empty(acc), dtype=acc, device=v.device),)
        return (fn(v, -1),)
    return reduce


def _arg(fn: Callable[..., Tensor]) -> Callable:
    def reduce(v: Tensor, acc: torch.dtype) -> tuple[Tensor]:
        if v.shape[-1] == 0:
            return (torch.full(v.shape[:-1], -1, dtype=torch.int64, device=v.device),)
        return (fn(v.to(torch.uint8) if v.dtype == torch.bool else v, -1),)
    return reduce


def _welford(v: Tensor, acc: torch.dtype) -> tuple[Tensor, Tensor]:
    v = v.to(acc)
    if v.shape[-1] == 0:
        zero = torch.zeros(v.shape[:-1], dtype=acc, device=v.device)
        return zero, zero
    mean = v.mean(-1, keepdim=True)
    return mean.squeeze(-1), ((v - mean) ** 2).sum(-1)


#: Reduction type -> fn(values with the reduced points last, acc dtype) -> one tensor per output.
REDUCTIONS: dict[str, Callable[[Tensor, torch.dtype], tuple[Tensor, ...]]] = {
    "sum": lambda v, acc: (v.to(acc).sum(-1, dtype=acc),),
    "prod": lambda v, acc: (v.to(acc).prod(-1, dtype=acc),),
    "max": _extreme(torch.amax, lowest),
    "min": _extreme(torch.amin, highest),
    "argmax": _arg(torch.argmax),
    "argmin": _arg(torch.argmin),
    "any": lambda v, acc: (v.bool().any(-1),),
    "all": lambda v, acc: (v.bool().all(-1),),
    "welford": _welford,
}


# ----------------------------------------------------------------------------- running kernels


def flat_view(t: Tensor) -> Tensor:
    """A 1-D view of ``t``'s memory from its first element to the end of its storage (what a
    kernel's index expressions address, like a raw ``data_ptr()``)."""
    span = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return t.as_strided((max(span, 0),), (1,), t.storage_offset())


def run_kernel(kernel: Kernel, args: Sequence[Any]) -> None:
    """Run ``kernel`` on ``args`` (tensors then size ints, in ``kernel.args`` order)."""
    names = [*kernel.inputs, *kernel.outputs]
    tensors = list(args[:len(names)])
    sizes = {s.name: int(a) for s, a in zip(kernel.size_args, args[len(names):])}
    device = tensors[0].device if tensors else torch.device("cpu")
    _Executor(kernel, {n: flat_view(t) for n, t in zip(names, tensors)}, sizes, device).run()


@dataclass
class ReferenceModule:
    """A graph's kernels, "compiled": kept as IR, run by :func:`run_kernel` at each launch."""

    kernels: dict[str, Kernel]
    #: The kernels as text (for reports and ``COIL_DEBUG_DIR``).
    source: str = ""

    def launch(self, name: str, *args: Any) -> None:
        run_kernel(self.kernels[name], args)


class ReferenceBackend(DeviceBackend[ReferenceModule]):
    """A device backend that runs every kernel with the reference executor. Register it for
    any device whose tensors support torch operations:
    ``coil.register_backend_for_device("cpu", ReferenceBackend())``."""

    name = "reference"
    capabilities = Capabilities(random=True)

    def compile(self, kernels: Sequence[Kernel], graph_name: str) -> ReferenceModule:
        return ReferenceModule({k.name: k for k in kernels}, "\n".join(map(format_kernel, kernels)))

    def call_line(self, module_var: str, kernel: Kernel, args: Sequence[str]) -> str:
        return f"{module_var}.launch({kernel.name!r}, {', '.join(args)})"

    def kernel_source(self, compiled: ReferenceModule, kernel: Kernel) -> str:
        return format_kernel(kernel)

    def synchronize(self) -> None:
        module = getattr(torch, self.device_type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()


# ----------------------------------------------------------------------------- text


def format_value(v: Value) -> str:
    """A value tree as one line: ``add(arg0[x0], 1.0)``."""
    if isinstance(v, Const):
        return repr(v.value)
    if isinstance(v, IndexValue):
        return f"index({v.expr})"
    if isinstance(v, Load):
        binds = "".join(f"{i.symbol}={format_value(i)}; " for i in v.indirect)
        return f"{binds}{v.buffer}[{v.index}]"
    if isinstance(v, Indirect):
        return f"wrap({format_value(v.value)}, {v.size})"  # type: ignore[arg-type]
    if isinstance(v, Op):
        return f"{v.name}({', '.join(format_value(a) for a in v.args)})"
    if isinstance(v, Cast):
        return f"{str(v.dtype).replace('torch.', '')}({format_value(v.x)})"  # type: ignore[arg-type]
    if isinstance(v, Masked):
        return f"({format_value(v.mask)} ? {format_value(v.body)} : {v.other!r})"  # type: ignore[arg-type]
    return repr(v)


def format_kernel(k: Kernel) -> str:
    """A kernel as text: its grid, arguments and one line per node."""
    lines = [f"kernel {k.name} x{list(k.x_ranges)} r{list(k.r_ranges)} "
             f"in({', '.join(k.inputs)}) out({', '.join(k.outputs)})"]
    if k.special is not None:
        lines.append(f"  {type(k.special).__name__} {k.special.name}")
    for loop in k.loops:
        for kn in loop.nodes:
            node, body = kn.node, format_value(kn.body)
            if isinstance(node, ReductionNode):
                body = f"{node.reduction_type}({body})"
            lines.append(f"  [{loop.level}] {', '.join(kn.stores)}[{kn.store_index}] = {body}")
    return "\n".join(lines) + "\n"


__all__ = ["ReferenceBackend", "ReferenceModule", "run_kernel", "flat_view", "eval_index",
           "apply_op", "OPS", "REDUCTIONS", "format_kernel", "format_value", "philox",
           "philox_rand", "philox_randn"]
