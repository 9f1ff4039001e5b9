"""A 0-d tensor operand of a half-precision op, cast first where the device's eager casts it.

On CUDA, ``h + z`` with ``h`` a float16 tensor and ``z`` a 0-d float32 tensor on the GPU
(a ``mean()``, a loss, a scale kept as a tensor) is float16 by type promotion, and eager's
kernels cast ``z`` to float16 before computing in float32: they add ``28.421875`` for a ``z``
of ``28.41498``. Eager's CPU kernels read a 0-d CPU tensor as they read a Python number
(unrounded for ``mul`` and ``div``; ``add`` and ``sub`` round it: the core's
``half_add_scalars_rounded``), as CUDA's kernels do a 0-d *CPU* tensor. Coil computed the
float32 operand unrounded on every device (a hunt's probe on an H100, session 37: ``h + z``,
``h - z``, ``h * z`` and ``h + v.mean()`` each differed from eager in the last bit).

:func:`cast_zero_dim_operands` casts such operands in the graph, before lowering, for the
devices whose backend declares ``Capabilities.zero_dim_operands_cast``. Ops that only select
or compare (``where``, ``maximum``, ``eq``...) give eager's result either way and are left.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx

aten = torch.ops.aten

#: Ops whose tensor operands all take part in type promotion and whose value changes when an
#: operand is rounded first.
ARITHMETIC = frozenset({
    aten.add.Tensor, aten.sub.Tensor, aten.rsub.Tensor, aten.mul.Tensor, aten.div.Tensor,
    aten.div.Tensor_mode, aten.true_divide.Tensor, aten.floor_divide.default,
    aten.remainder.Tensor, aten.fmod.Tensor, aten.pow.Tensor_Tensor, aten.atan2.default,
    aten.hypot.default, aten.nextafter.default, aten.logaddexp.default, aten.logaddexp2.default,
    aten.xlogy.Tensor, aten.addcmul.default, aten.addcdiv.default, aten.lerp.Tensor,
})

HALF = (torch.float16, torch.bfloat16)


def cast_zero_dim_operands(gm: torch.fx.GraphModule, casts: Callable[[torch.device], bool]) -> int:
    """Cast every 0-d tensor operand of an :data:`ARITHMETIC` op in ``gm`` whose result is
    float16 or bfloat16 to that type, where the operand is on the op's device, is of another
    type, and ``casts(device)`` says that device's eager casts it. Returns how many."""
    graph = gm.graph
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in ARITHMETIC:
            continue
        out = node.meta.get("val")
        if not isinstance(out, torch.Tensor) or out.dtype not in HALF or not casts(out.device):
            continue

        def cast(arg: Any) -> Any:
            nonlocal done
            val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
            if (not isinstance(val, torch.Tensor) or val.dim() != 0 or val.dtype == out.dtype
                    or val.device != out.device):
                return arg
            with graph.inserting_before(node):
                new = graph.call_function(aten._to_copy.default, (arg,), {"dtype": out.dtype})
            new.meta["val"] = val.to(out.dtype)
            done += 1
            return new

        node.args = tuple(cast(a) for a in node.args)
    if done:
        graph.lint()
        gm.recompile()
    return done
