"""C++ source for one Coil kernel: OpenMP-parallel outer loops, ``omp simd`` inner loops,
reductions with per-thread (and per-lane) partials combined by OpenMP, and locals for
buffers that never leave the kernel."""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from coil.sdk import (Cast, CodeWriter, Const, ExprPrinter, IndexValue, Indirect, Kernel, KernelNode,
                      Load, Loop, Masked, Op, ReductionNode, ScanNode, ScatterNode, Value)

from .optable import CTYPES, INTEGER_IDENTITY, OPS, literal

#: Below this many points a pointwise loop runs on one thread.
PARALLEL_THRESHOLD = 16384
#: Reduction kernels with at most this many (static) output points parallelise over r.
SMALL_X = 32


class CppPrinter(ExprPrinter):
    def floordiv(self, a: str, b: str) -> str:
        return f"({a} / {b})"

    def integer(self, value: int) -> str:
        return f"INT64_C({value})" if abs(value) > 2**31 - 1 else str(value)

    def minimum(self, args: list[str]) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"std::min<int64_t>({out}, {a})"
        return out

    def maximum(self, args: list[str]) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"std::max<int64_t>({out}, {a})"
        return out


PRINTER = CppPrinter()


def idx(e: sympy.Expr) -> str:
    return PRINTER.print(sympy.sympify(e))


@dataclass
class Scope:
    """Values already computed in the current C++ block (common subexpressions)."""

    parent: "Scope | None" = None
    memo: dict[Value, str] = field(default_factory=dict)

    def get(self, v: Value) -> str | None:
        s: Scope | None = self
        while s is not None:
            if v in s.memo:
                return s.memo[v]
            s = s.parent
        return None


@dataclass
class Reduction:
    """How one reduction type accumulates in C++."""

    init: str
    update: str  # format with acc, v, i
    clause: str  # OpenMP reduction identifier
    result: tuple[str, ...]  # expressions of acc for each output


def reduction_spec(rtype: str, acc_t: str, val_t: str) -> Reduction:
    if rtype == "sum":
        return Reduction(f"{acc_t}(0)", "{acc} += {v};", "+", ("{acc}",))
    if rtype == "prod":
        return Reduction(f"{acc_t}(1)", "{acc} *= {v};", "*", ("{acc}",))
    if rtype == "any":
        return Reduction("false", "{acc} = {acc} || {v};", "||", ("{acc}",))
    if rtype == "all":
        return Reduction("true", "{acc} = {acc} && {v};", "&&", ("{acc}",))
    if rtype in ("max", "min"):
        init = f"coil::lowest<{acc_t}>()" if rtype == "max" else f"coil::highest<{acc_t}>()"
        fn = "max_nan" if rtype == "max" else "min_nan"
        return Reduction(init, f"{{acc}} = coil::{fn}<{acc_t}>({{acc}}, {{v}});",
                         f"coil_{rtype}_{_ident(acc_t)}", ("{acc}",))
    if rtype in ("argmax", "argmin"):
        return Reduction(f"coil::ArgAcc<{val_t}>{{{val_t}(0), -1}}",
                         f"{{acc}} = coil::{rtype}_combine<{val_t}>({{acc}}, coil::ArgAcc<{val_t}>{{{{{{v}}, {{i}}}}}});",
                         f"coil_{rtype}_{_ident(val_t)}", ("{acc}.index",))
    if rtype == "welford":
        return Reduction(f"coil::Welford<{acc_t}>{{0, 0, 0}}",
                         f"{{acc}} = coil::welford_update<{acc_t}>({{acc}}, {{v}});",
                         f"coil_welford_{_ident(acc_t)}", ("{acc}.mean", "{acc}.m2"))
    raise NotImplementedError(rtype)


def _ident(t: str) -> str:
    return t.replace("coil::", "").replace(" ", "_")


def declare_reduction(clause: str) -> str | None:
    """``#pragma omp declare reduction`` for a user-defined reduction identifier."""
    if clause in ("+", "*", "||", "&&"):
        return None
    _, kind, t = clause.split("_", 2)
    if kind in ("max", "min"):
        fn = "max_nan" if kind == "max" else "min_nan"
        init = f"coil::lowest<{t}>()" if kind == "max" else f"coil::highest<{t}>()"
        return (f"#pragma omp declare reduction({clause} : {t} : omp_out = coil::{fn}<{t}>(omp_out, omp_in)) "
                f"initializer(omp_priv = {init})")
    if kind in ("argmax", "argmin"):
        return (f"#pragma omp declare reduction({clause} : coil::ArgAcc<{t}> : omp_out = "
                f"coil::{kind}_combine<{t}>(omp_out, omp_in)) initializer(omp_priv = coil::ArgAcc<{t}>{{{t}(0), -1}})")
    if kind == "welford":
        return (f"#pragma omp declare reduction({clause} : coil::Welford<{t}> : omp_out = "
                f"coil::welford_combine<{t}>(omp_out, omp_in)) initializer(omp_priv = coil::Welford<{t}>{{0, 0, 0}})")
    raise NotImplementedError(clause)


class KernelWriter:
    """Writes one ``extern "C"`` function for a kernel."""

    def __init__(self, kernel: Kernel, fn_name: str) -> None:
        self.k = kernel
        self.fn_name = fn_name
        self.w = CodeWriter("  ")
        self.counter = 0
        self.locals: dict[str, str] = {}  # internal buffer -> C++ local holding it
        self.reductions_used: set[str] = set()

    # -- entry

    def generate(self) -> tuple[str, str]:
        params = ", ".join(f"int64_t {a}" for a in self._param_names())
        signature = f'void {self.fn_name}({params})'
        with self.w.block(f'extern "C" {signature} {{', "}"):
            self._pointers()
            if isinstance(self.k.special, ScanNode):
                self._scan(self.k.special)
            elif isinstance(self.k.special, ScatterNode):
                self._scatter(self.k.special)
            elif self.k.r_ranges:
                self._reduction_kernel()
            else:
                self._pointwise_kernel()
        return self.w.text(), signature + ";"

    def _param_names(self) -> list[str]:
        return [f"{b}_addr" for b in self.k.inputs + self.k.outputs] + [s.name for s in self.k.size_args]

    def _pointers(self) -> None:
        for b in self.k.inputs:
            self.w.line(f"auto {b} = reinterpret_cast<const {self._ctype(b)}*>({b}_addr);")
        for b in self.k.outputs:
            self.w.line(f"auto {b} = reinterpret_cast<{self._ctype(b)}*>({b}_addr);")

    def _ctype(self, buf: str) -> str:
        return CTYPES[self.k.dtypes[buf]]  # type: ignore[index]

    def _tmp(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    # -- loop nests

    def _for(self, var: str, size: sympy.Expr) -> str:
        return f"for (int64_t {var} = 0; {var} < {idx(size)}; {var}++) {{"

    def _pointwise_kernel(self) -> None:
        xs, ranges = self.k.x_vars, self.k.x_ranges
        if not ranges:
            self._emit_nodes([n for loop in self.k.loops for n in loop.nodes], Scope())
            return
        numel = idx(sympy.Mul(*ranges))
        if len(ranges) == 1:
            self.w.line(f"#pragma omp parallel for simd if(parallel: {numel} > {PARALLEL_THRESHOLD})")
        else:
            self.w.line(f"#pragma omp parallel for collapse({len(ranges) - 1}) "
                        f"if(parallel: {numel} > {PARALLEL_THRESHOLD})")
        depth = 0
        for i, (v, n) in enumerate(zip(xs, ranges)):
            if i == len(ranges) - 1 and len(ranges) > 1:
                self.w.line("#pragma omp simd")
            self.w.line(self._for(v.name, n))
            self.w._depth += 1
            depth += 1
        self._emit_nodes([n for loop in self.k.loops for n in loop.nodes], Scope())
        for _ in range(depth):
            self.w._depth -= 1
            self.w.line("}")

    def _reduction_kernel(self) -> None:
        xs, ranges = self.k.x_vars, self.k.x_ranges
        numel_x = sympy.Mul(*ranges) if ranges else sympy.Integer(1)
        r_parallel = numel_x.is_number and int(numel_x) <= SMALL_X
        if ranges and not r_parallel:
            self.w.line(f"#pragma omp parallel for collapse({len(ranges)})")
        for v, n in zip(xs, ranges):
            self.w.line(self._for(v.name, n))
            self.w._depth += 1
        scope = Scope()
        for loop in self.k.loops:
            if loop.level == "x":
                self._emit_nodes(loop.nodes, scope)
            else:
                self._r_loop(loop, scope, r_parallel)
        for _ in ranges:
            self.w._depth -= 1
            self.w.line("}")

    def _r_loop(self, loop: Loop, outer: Scope, parallel: bool) -> None:
        accs: list[tuple[KernelNode, str, Reduction]] = []
        for kn in loop.nodes:
            if isinstance(kn.node, ReductionNode):
                node = kn.node
                acc_t = CTYPES[node.acc_dtype]
                val_t = CTYPES[kn.body.dtype]
                spec = reduction_spec(node.reduction_type, acc_t, val_t)
                acc = f"acc_{node.name}"
                self.w.line(f"auto {acc} = {spec.init};")
                accs.append((kn, acc, spec))
                self.reductions_used.add(spec.clause)
        clauses = " ".join(f"reduction({spec.clause}:{acc})" for _, acc, spec in accs)
        nr = len(self.k.r_ranges)
        collapse = f" collapse({nr})" if nr > 1 else ""
        pragma = "#pragma omp parallel for simd" if parallel else "#pragma omp simd"
        self.w.line(f"{pragma}{collapse} {clauses}".rstrip())
        for v, n in zip(self.k.r_vars, self.k.r_ranges):
            self.w.line(self._for(v.name, n))
            self.w._depth += 1
        scope = Scope(outer)
        flat = self._flat_r()
        for kn in loop.nodes:
            if isinstance(kn.node, ReductionNode):
                acc, spec = next((a, s) for k2, a, s in accs if k2 is kn)
                v = self._value(kn.body, scope)
                self.w.line(spec.update.format(acc=acc, v=v, i=flat))
            else:
                self._emit_nodes([kn], scope)
        for _ in self.k.r_ranges:
            self.w._depth -= 1
            self.w.line("}")
        for kn, acc, spec in accs:
            for out, expr in zip(kn.node.outputs(), spec.result):
                self._store(out, kn.store_index, expr.format(acc=acc), kn.node.layout.dtype, kn.node)

    def _flat_r(self) -> str:
        flat: sympy.Expr = sympy.Integer(0)
        for v, n in zip(self.k.r_vars, self.k.r_ranges):
            flat = flat * n + v
        return idx(flat)

    # -- nodes and values

    def _emit_nodes(self, nodes: list[KernelNode], scope: Scope) -> None:
        for kn in nodes:
            v = self._value(kn.body, scope)
            self._store(kn.node.outputs()[0], kn.store_index, v, kn.node.layout.dtype, kn.node,
                        store_name=kn.stores[0])

    def _store(self, buf: str, index: sympy.Expr, value: str, dtype: object, node: object,
               store_name: str | None = None) -> None:
        target = store_name or buf
        t = CTYPES[dtype] if dtype is not None else "auto"  # type: ignore[index]
        if buf in self.k.internal:
            local = f"v_{buf}"
            self.w.line(f"{t} {local} = coil::cast<{t}>({value});")
            self.locals[buf] = local
        else:
            self.w.line(f"{target}[{idx(index)}] = coil::cast<{t}>({value});")

    def _value(self, v: Value, scope: Scope) -> str:
        got = scope.get(v)
        if got is not None:
            return got
        if isinstance(v, Const):
            return literal(v.value, v.dtype)
        t = CTYPES[v.dtype]
        if isinstance(v, Load):
            for ind in v.indirect:
                self._value(ind, scope)
            if v.buffer in self.k.internal and v.buffer in self.locals:
                return self.locals[v.buffer]
            expr = f"{v.buffer}[{idx(v.index)}]"
        elif isinstance(v, IndexValue):
            expr = f"static_cast<int64_t>({idx(v.expr)})"
        elif isinstance(v, Indirect):
            raw = self._value(v.value, scope)  # type: ignore[arg-type]
            name = v.symbol.name
            self.w.line(f"int64_t {name} = {raw};")
            self.w.line(f"{name} = {name} < 0 ? {name} + {idx(v.size)} : {name};")
            scope.memo[v] = name
            return name
        elif isinstance(v, Cast):
            expr = f"coil::cast<{t}>({self._value(v.x, scope)})"  # type: ignore[arg-type]
        elif isinstance(v, Op):
            args = [self._value(a, scope) for a in v.args]
            operand_t = CTYPES[v.args[0].dtype] if v.args else t
            if v.name == "where":
                operand_t = t
            if v.name in INTEGER_IDENTITY and not v.dtype.is_floating_point:
                expr = args[0]
            else:
                expr = OPS[v.name](args, operand_t)
        elif isinstance(v, Masked):
            expr = self._masked(v, scope, t)
        else:
            raise NotImplementedError(type(v).__name__)
        name = self._tmp()
        self.w.line(f"{t} {name} = {expr};")
        scope.memo[v] = name
        return name

    def _masked(self, v: Masked, scope: Scope, t: str) -> str:
        mask = self._value(v.mask, scope)  # type: ignore[arg-type]
        name = self._tmp()
        self.w.line(f"{t} {name} = {literal(v.other, v.dtype)};")
        with self.w.block(f"if ({mask}) {{", "}"):
            inner = Scope(scope)
            body = self._value(v.body, inner)  # type: ignore[arg-type]
            self.w.line(f"{name} = {body};")
        return f"{name}"

    # -- special kernels

    def _scan(self, node: ScanNode) -> None:
        xs = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(len(node.ranges))]
        if node.ranges:
            self.w.line(f"#pragma omp parallel for collapse({len(node.ranges)})")
        for v, n in zip(xs, node.ranges):
            self.w.line(self._for(v.name, n))
            self.w._depth += 1
        acc_t = CTYPES[node.acc_dtype]
        op = "+=" if node.combine == "sum" else "*="
        self.w.line(f"{acc_t} acc = {acc_t}({0 if node.combine == 'sum' else 1});")
        with self.w.block(self._for("r0", node.scan_range), "}"):
            v = self._value(node.body, Scope())
            self.w.line(f"acc {op} {v};")
            t = CTYPES[node.layout.dtype]
            self.w.line(f"{node.name}[{idx(node.store_index)}] = coil::cast<{t}>(acc);")
        for _ in node.ranges:
            self.w._depth -= 1
            self.w.line("}")

    def _scatter(self, node: ScatterNode) -> None:
        t = CTYPES[node.layout.dtype]
        xs = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(len(node.ranges))]
        if node.ranges:
            self.w.line(f"#pragma omp parallel for collapse({len(node.ranges)})")
        for v, n in zip(xs, node.ranges):
            self.w.line(self._for(v.name, n))
            self.w._depth += 1
        base = self._value(node.base, Scope())
        self.w.line(f"{node.name}[{idx(node.store_index)}] = coil::cast<{t}>({base});")
        for _ in node.ranges:
            self.w._depth -= 1
            self.w.line("}")
        rs = [sympy.Symbol(f"r{i}", integer=True, nonnegative=True) for i in range(len(node.src_ranges))]
        atomic = node.accumulate == "add" and node.layout.dtype in (
            torch.float32, torch.float64, torch.int32, torch.int64)
        if atomic and node.src_ranges:
            self.w.line(f"#pragma omp parallel for collapse({len(node.src_ranges)})")
        for v, n in zip(rs, node.src_ranges):
            self.w.line(self._for(v.name, n))
            self.w._depth += 1
        scope = Scope()
        for ind in node.target_indirect:
            self._value(ind, scope)
        val = self._value(node.value, scope)
        target = f"{node.name}[{idx(node.target_index)}]"
        acc = node.accumulate
        if acc is None:
            self.w.line(f"{target} = {val};")
        elif atomic:
            self.w.line("#pragma omp atomic")
            self.w.line(f"{target} += {val};")
        else:
            cur = f"coil::cast<float>({target})" if t in ("coil::bf16", "_Float16") else target
            vv = f"coil::cast<float>({val})" if t in ("coil::bf16", "_Float16") else val
            ct = "float" if t in ("coil::bf16", "_Float16") else t
            combined = {"add": f"{cur} + {vv}", "mul": f"{cur} * {vv}",
                        "amax": f"coil::max_nan<{ct}>({cur}, {vv})",
                        "amin": f"coil::min_nan<{ct}>({cur}, {vv})"}[acc]
            self.w.line(f"{target} = coil::cast<{t}>({combined});")
        for _ in node.src_ranges:
            self.w._depth -= 1
            self.w.line("}")
