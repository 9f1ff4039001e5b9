"""C source for one Coil kernel on the emu chip: a function of plain serial loops. The x
loops run over the kept dims; inside them each ``Loop`` of the kernel is one pass (over the
reduced dims for level ``r``). Every value becomes one typed C local, reused within its
block; buffers the kernel keeps ``internal`` are locals too, never memory."""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Sequence

import torch

from coil.sdk import (Cast, CodeWriter, Const, IndexValue, Indirect, Kernel, KernelNode, Load, Loop,
                      Masked, Op, ScanNode, ScatterNode, Value)
from coil.sdk.codegen import ValueScope, ValueVisitor

from . import special
from .accumulators import accumulator
from .optable import VALUE_TYPES, cast, idx, literal, load, memory_type, spell, store

#: Value -> the C local holding it (CSE); a child scope per nested C block.
Scope = ValueScope


class KernelWriter(ValueVisitor[Scope, str]):
    """Writes the C function of one kernel; :meth:`generate` returns its source. ``value``
    memoises; the ``visit_*`` rules spell each node type that becomes a C local."""

    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self.w = CodeWriter()
        self.count = 0
        self.locals: dict[str, str] = {}  # internal buffer -> the C local holding it

    def generate(self) -> str:
        k = self.k
        params = [f"{memory_type(k.dtypes[b])} *{b}" for b in k.inputs + k.outputs]
        params += [f"int64_t {s.name}" for s in k.size_args]
        with self.w.block(f"void {k.name}({', '.join(params) or 'void'}) {{", "}"):
            if isinstance(k.special, ScanNode):
                special.scan(self, k.special)
            elif isinstance(k.special, ScatterNode):
                special.scatter(self, k.special)
            else:
                with self.loops(k.x_vars, k.x_ranges):
                    scope = Scope()
                    for loop in k.loops:
                        self.emit_pass(loop, scope)
        return self.w.text()

    @contextlib.contextmanager
    def loops(self, names: Sequence[object], sizes: Sequence[object]) -> Iterator[None]:
        """Nested ``for`` loops of ``names`` (strings or symbols) over ``sizes`` (index
        expressions)."""
        with contextlib.ExitStack() as stack:
            for v, n in zip(names, sizes):
                stack.enter_context(self.w.block(f"for (int64_t {v} = 0; {v} < {idx(n)}; {v}++) {{", "}"))
            yield

    def emit_pass(self, loop: Loop, scope: Scope) -> None:
        """One pass over a loop's nodes (over the reduced dims for level r; its values stay
        inside it): reductions fold into accumulators declared before it, stored after it."""
        k, on_r = self.k, loop.level == "r"
        accs = {kn.node.name: accumulator(kn.node, kn.body.dtype)  # type: ignore[arg-type]
                for kn in loop.nodes if kn.is_reduction}
        for name, acc in accs.items():
            self.w.lines(acc.declare(f"acc_{name}"))
        flat_r = functools.reduce(lambda f, vn: f * vn[1] + vn[0], zip(k.r_vars, k.r_ranges), 0)
        index = idx(flat_r) if on_r else "0"  # argmax/argmin's position along the reduced dims
        with self.loops(k.r_vars if on_r else [], k.r_ranges):
            inner = scope.child() if on_r else scope
            for kn in loop.nodes:
                value = self.value(kn.body, inner)
                if kn.is_reduction:
                    self.w.line(accs[kn.node.name].fold(f"acc_{kn.node.name}", value, index))
                else:
                    self.store(kn, 0, value)
        for kn in loop.nodes:
            for i, field in enumerate(accs[kn.node.name].results if kn.is_reduction else ()):
                self.store(kn, i, f"acc_{kn.node.name}{field}")

    def store(self, kn: KernelNode, output: int, value: str) -> None:
        buf, dtype = kn.node.outputs()[output], kn.node.layout.dtype  # type: ignore[attr-defined]
        if buf in self.k.internal:
            self.locals[buf] = f"v_{buf}"
            self.w.line(f"{VALUE_TYPES[dtype]} v_{buf} = {value};")
        else:
            self.w.line(f"{kn.stores[output]}[{idx(kn.store_index)}] = {store(dtype, value)};")

    # -- values

    def value(self, v: Value, scope: Scope) -> str:
        """The C local (or literal) holding ``v``, emitting the code that computes it."""
        if v in scope:
            return scope[v]
        if isinstance(v, Const):
            return literal(v.value, v.dtype)
        for ind in v.indirect if isinstance(v, Load) else ():
            self.value(ind, scope)
        if isinstance(v, Load) and v.buffer in self.locals:
            return self.locals[v.buffer]
        if isinstance(v, Masked):  # the body (and its loads) runs only where the mask holds
            mask = self.value(v.mask, scope)  # type: ignore[arg-type]
            name = self._local(v.dtype, literal(v.other, v.dtype))
            with self.w.block(f"if ({mask}) {{", "}"):
                self.w.line(f"{name} = {self.value(v.body, scope.child())};")  # type: ignore[arg-type]
        elif isinstance(v, Indirect):  # wrapped into [0, size) like a Python index
            name = v.symbol.name
            self.w.line(f"int64_t {name} = {self.value(v.value, scope)};")  # type: ignore[arg-type]
            self.w.line(f"if ({name} < 0) {name} += {idx(v.size)};")
        else:
            name = self._local(v.dtype, self.visit(v, scope))
        scope[v] = name
        return name

    def _local(self, dtype: torch.dtype, expr: str) -> str:
        self.count += 1
        self.w.line(f"{VALUE_TYPES[dtype]} t{self.count} = {expr};")
        return f"t{self.count}"

    def visit_load(self, v: Load, scope: Scope) -> str:
        return load(self.k.dtypes.get(v.buffer, v.dtype), f"{v.buffer}[{idx(v.index)}]")

    def visit_index_value(self, v: IndexValue, scope: Scope) -> str:
        return idx(v.expr)

    def visit_cast(self, v: Cast, scope: Scope) -> str:
        return cast(v.dtype, self.value(v.x, scope))  # type: ignore[arg-type]

    def visit_op(self, v: Op, scope: Scope) -> str:
        # the operands' type picks the helper (where: the result's)
        operand_t = VALUE_TYPES[v.args[0].dtype if v.args and v.name != "where" else v.dtype]
        return spell(v.name, [self.value(a, scope) for a in v.args], operand_t)
