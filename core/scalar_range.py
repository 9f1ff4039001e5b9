"""Eager's overflow check of a scalar written into an integer tensor.

``x.masked_fill(m, v)``, ``x.clamp(min=v)``, ``torch.full(size, v, dtype=torch.int8)``,
``x.scatter(d, i, v)`` and their kin convert the scalar ``v`` to the tensor's type with a
check: eager raises ``value cannot be converted to type int8_t without overflow`` where
``v`` does not fit (a signed type's range; an unsigned type accepts ``-max..max``, as its
negative values wrap). Arithmetic (``x + v``) converts without a check, and wraps.

A number in the graph is checked while Dynamo traces, for most of these ops; a symbolic
scalar (``n.shape[0] * 100`` under dynamic shapes) is not, and a kernel would write it
wrapped: a silent wrong result where eager raises. :func:`check_scalar_ranges` puts the check
before each such op as a runtime assertion (``aten._assert_scalar``: the wrapper evaluates it
on the call's sizes and raises eager's message); a number the check rejects (``scatter``'s
value is not checked while tracing) gets an assertion that always raises.
"""
from __future__ import annotations

import operator
from typing import Any

import torch

aten = torch.ops.aten

#: op -> positions of the scalars eager converts to the result's type with a check
CHECKED: dict[Any, tuple[int, ...]] = {
    aten.clamp.default: (1, 2), aten.clamp_min.default: (1,), aten.clamp_max.default: (1,),
    aten.scalar_tensor.default: (0,), aten.full.default: (1,), aten.full_like.default: (1,),
    aten.new_full.default: (2,), aten.fill.Scalar: (1,), aten.fill_.Scalar: (1,),
    aten.masked_fill.Scalar: (2,), aten.masked_fill_.Scalar: (2,),
    aten.scatter.value: (3,), aten.scatter_.value: (3,), aten.scatter.value_reduce: (3,),
    aten.index_fill.int_Scalar: (3,), aten.index_fill_.int_Scalar: (3,),
    aten.constant_pad_nd.default: (2,), aten.threshold.default: (1, 2),
    aten.where.ScalarOther: (2,), aten.where.ScalarSelf: (1,),
}

def _bounds(dtype: torch.dtype) -> tuple[int, int] | None:
    """The scalars ``dtype`` accepts, or ``None`` where every one does (int64 and uint64 hold
    every symbolic size; bool and the floating types never overflow: float16 gives ``inf``)."""
    if dtype in (torch.int64, torch.uint64, torch.bool) or dtype.is_floating_point or dtype.is_complex:
        return None
    info = torch.iinfo(dtype)
    return (-info.max if info.min == 0 else info.min), info.max


#: c10's names for the types, as eager's message spells them
_C10_NAMES = {torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int",
              torch.uint16: "uint16_t", torch.uint32: "uint32_t"}


def _message(dtype: torch.dtype) -> str:
    return f"value cannot be converted to type {_C10_NAMES.get(dtype, dtype)} without overflow"


def _fits(value: int | float, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= value <= bounds[1]  # False for NaN, as eager


def _scalar_args(node: torch.fx.Node) -> list[Any]:
    names = [a.name for a in node.target._schema.arguments]  # type: ignore[union-attr]
    found = []
    for p in CHECKED[node.target]:  # type: ignore[index]
        if p < len(node.args):
            found.append(node.args[p])
        elif names[p] in node.kwargs:
            found.append(node.kwargs[names[p]])
    return found


def check_scalar_ranges(gm: torch.fx.GraphModule) -> int:
    """Put eager's overflow check before every op of :data:`CHECKED` in ``gm`` whose scalar is
    symbolic (or a number that overflows) and whose result is an integer type narrower than
    int64. Returns how many checks were added."""
    graph = gm.graph
    added = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in CHECKED:
            continue
        out = node.meta.get("val")
        bounds = _bounds(out.dtype) if isinstance(out, torch.Tensor) else None
        if bounds is None:
            continue
        for arg in _scalar_args(node):
            conditions: list[Any] = []
            if isinstance(arg, torch.fx.Node):
                value = arg.meta.get("val")
                if not isinstance(value, (torch.SymInt, torch.SymFloat)):
                    continue
                with graph.inserting_before(node):
                    for cmp, bound in ((operator.ge, bounds[0]), (operator.le, bounds[1])):
                        cond = graph.call_function(cmp, (arg, bound))
                        cond.meta["val"] = cmp(value, bound)
                        conditions.append(cond)
            elif isinstance(arg, (int, float)) and not isinstance(arg, bool) and not _fits(arg, bounds):
                conditions.append(False)
            for cond in conditions:
                with graph.inserting_before(node):
                    check = graph.call_function(aten._assert_scalar.default, (cond, _message(out.dtype)))
                    check.meta["val"] = None
                added += 1
    if added:
        graph.lint()
        gm.recompile()
    return added
