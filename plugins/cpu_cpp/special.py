"""Kernels of the special single-node kinds: scans (cumsum, cumprod) run sequentially along the
scanned dim, in parallel over the others; scatters write the base, then the sources (atomic
adds of integers where threads may share the loop, one thread in order otherwise: float adds
in an order that changes run to run gave other sums on every call, where eager's and
Inductor's are the same each time; found by a hunt, session 38)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import sympy
import torch

from coil.sdk import ScanNode, ScatterNode
from coil.sdk.codegen import ValueScope
from coil.sdk.ir import ScatterAccumulate

from .cpp import for_header, idx, on_one_thread, parallel_for
from .optable import CTYPES, HALF_TYPES

if TYPE_CHECKING:
    from .codegen import KernelWriter


def _vars(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def scan(kw: KernelWriter, node: ScanNode) -> None:
    w = kw.w
    if node.ranges:
        kw.pragma(parallel_for(sympy.Mul(*node.ranges, node.scan_range), len(node.ranges)))
    with kw.loops(_vars("x", len(node.ranges)), node.ranges):
        acc_t = CTYPES[node.acc_dtype]
        op = "+=" if node.combine == "sum" else "*="
        w.line(f"{acc_t} acc = {acc_t}({0 if node.combine == 'sum' else 1});")
        with w.block(for_header("r0", node.scan_range), "}"):
            v = kw.value(node.body, ValueScope())
            w.line(f"acc {op} {v};")
            t = CTYPES[node.layout.dtype]
            w.line(f"{node.name}[{idx(node.store_index)}] = coil::cast<{t}>(acc);")


def scatter(kw: KernelWriter, node: ScatterNode) -> None:
    w = kw.w
    t = CTYPES[node.layout.dtype]
    if node.ranges:
        kw.pragma(parallel_for(sympy.Mul(*node.ranges), len(node.ranges)))
    with kw.loops(_vars("x", len(node.ranges)), node.ranges):
        base = kw.value(node.base, ValueScope())
        w.line(f"{node.name}[{idx(node.store_index)}] = coil::cast<{t}>({base});")
    # Atomic adds only of integers (exact in any order) and only where threads may share the
    # loop; float adds run on one thread in the sources' order, eager's order, so a sum is the
    # same on every call (torch.use_deterministic_algorithms or not)
    atomic = node.accumulate == "add" and node.layout.dtype in (torch.int32, torch.int64) and not on_one_thread(
        sympy.Mul(*node.src_ranges))
    if atomic and node.src_ranges:
        kw.pragma(parallel_for(sympy.Mul(*node.src_ranges), len(node.src_ranges)))
    with kw.loops(_vars("r", len(node.src_ranges)), node.src_ranges):
        scope = ValueScope()
        for ind in node.target_indirect:
            kw.value(ind, scope)
        val = kw.value(node.value, scope)
        target = f"{node.name}[{idx(node.target_index)}]"
        if node.accumulate is None:
            w.line(f"{target} = {val};")
        elif atomic:
            w.line("#pragma omp atomic")
            w.line(f"{target} += {val};")
        else:
            w.line(f"{target} = coil::cast<{t}>({_combined(node.accumulate, target, val, t)});")


def _combined(accumulate: ScatterAccumulate, target: str, val: str, t: str) -> str:
    """The new value of a scatter target; half types combine in float."""
    half = t in HALF_TYPES
    cur = f"coil::cast<float>({target})" if half else target
    vv = f"coil::cast<float>({val})" if half else val
    ct = "float" if half else t
    return {"add": f"{cur} + {vv}", "mul": f"{cur} * {vv}",
            "amax": f"coil::max_nan<{ct}>({cur}, {vv})",
            "amin": f"coil::min_nan<{ct}>({cur}, {vv})"}[accumulate]

