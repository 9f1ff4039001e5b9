"""Template kernels on the CPU: a matrix-product template (:mod:`coil.sdk.templates`, dialect
``"cpp"``) with the kernel's epilogue in a lambda it calls once per finished output tile.

The lambda walks the tile's rows and columns (an ``omp simd`` loop over columns), binds the
kernel's loop variables (``x0..``: batch, row, column), forms the product's value
(``alpha * acc + beta * bias``, rounded once to the output dtype) as a local that every read
of the product buffer uses, stores it if something outside the kernel reads it, and runs
the epilogue nodes. The template decides the blocking and the threads; each tile reaches
the lambda from one thread, so the lambda's locals are private."""
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from coil.sdk import Load
from coil.sdk.codegen import ValueScope

from .cpp import idx
from .optable import CTYPES

if TYPE_CHECKING:
    from .codegen import KernelWriter

EPILOGUE = "coil_epilogue"


def template_kernel(kw: "KernelWriter") -> None:
    """The body of a template kernel's function (pointers already declared)."""
    call = kw.k.template
    assert call is not None
    problem = call.problem
    w = kw.w
    xs = kw.k.x_vars
    with w.block(f"auto {EPILOGUE} = [&](int64_t b, int64_t m0, int64_t n0, int64_t mt, int64_t nt, "
                 "const float* acc, int64_t ldacc) {", "};"):
        with w.block("for (int64_t i = 0; i < mt; ++i) {", "}"):
            w.line("#pragma omp simd")
            with w.block("for (int64_t j = 0; j < nt; ++j) {", "}"):
                if problem.op == "bmm":
                    w.line(f"int64_t {xs[0].name} = b;")
                w.line(f"int64_t {xs[-2].name} = m0 + i;")
                w.line(f"int64_t {xs[-1].name} = n0 + j;")
                scope = ValueScope()
                _product(kw, scope)
                kw.emit_nodes(kw.k.nodes, scope)
    config = call.template.configs(problem)[0]
    for line in call.template.render(problem, _names(kw), config).splitlines():
        if line.strip():
            w.line(line.rstrip())


def _names(kw: "KernelWriter") -> dict[str, str]:
    problem = kw.k.template.problem  # type: ignore[union-attr]
    names = {"epilogue": EPILOGUE, "B": idx(problem.batch), "M": idx(problem.m),
             "N": idx(problem.n), "K": idx(problem.k)}
    for key, op in (("a", problem.a), ("b", problem.b)):
        names[key] = f"({op.name} + {idx(op.offset)})"
        for i, s in enumerate(op.stride):
            names[f"{key}_stride{i}"] = idx(s)
        names[f"{key}_offset"] = idx(op.offset)
    return names


def _product(kw: "KernelWriter", scope: ValueScope[str]) -> None:
    call = kw.k.template
    assert call is not None
    value = "acc[i * ldacc + j]" if call.alpha == 1 else f"acc[i * ldacc + j] * {float(call.alpha)!r}f"
    if call.bias is not None:
        index = call.bias.offset + sum((v * s for v, s in zip(kw.k.x_vars, call.bias.stride)), sympy.Integer(0))
        bias = kw.value(Load(call.bias.dtype, buffer=call.bias.name, index=index), scope)
        term = f"coil::cast<float>({bias})"
        value = f"{value} + {term}" if call.beta == 1 else f"{value} + {term} * {float(call.beta)!r}f"
    t = CTYPES[call.problem.out_dtype]
    local = f"v_{call.output}"
    kw.w.line(f"{t} {local} = coil::cast<{t}>({value});")
    kw.locals[call.output] = local
    if call.output not in kw.k.internal:
        kw.w.line(f"{call.output}[{kw.idx(call.store_index)}] = {local};")
