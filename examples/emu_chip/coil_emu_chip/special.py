"""Kernels of the special single-node kinds, as serial loops: a scan (cumsum, cumprod) runs
along the scanned dim ``r0`` for every point of the other dims; a scatter copies the base,
then writes (or combines) every source element at its target in order, as eager does."""
from __future__ import annotations

from typing import TYPE_CHECKING

from coil.sdk import ScanNode, ScatterNode
from coil.sdk.codegen import ValueScope

from .optable import SCATTER_COMBINE, VALUE_TYPES, idx, load, spell, store

if TYPE_CHECKING:
    from .codegen import KernelWriter


def scan(kw: KernelWriter, node: ScanNode) -> None:
    op = "+=" if node.combine == "sum" else "*="
    with kw.loops([f"x{i}" for i in range(len(node.ranges))], node.ranges):
        kw.w.line(f"{VALUE_TYPES[node.acc_dtype]} acc = {0 if op == '+=' else 1};")
        with kw.loops(["r0"], [node.scan_range]):
            kw.w.line(f"acc {op} {kw.value(node.body, ValueScope())};")
            kw.w.line(f"{node.name}[{idx(node.store_index)}] = {store(node.layout.dtype, 'acc')};")


def scatter(kw: KernelWriter, node: ScatterNode) -> None:
    dtype = node.layout.dtype
    with kw.loops([f"x{i}" for i in range(len(node.ranges))], node.ranges):
        base = kw.value(node.base, ValueScope())
        kw.w.line(f"{node.name}[{idx(node.store_index)}] = {store(dtype, base)};")
    with kw.loops([f"r{i}" for i in range(len(node.src_ranges))], node.src_ranges):
        scope: ValueScope[str] = ValueScope()
        for ind in node.target_indirect:
            kw.value(ind, scope)
        value, target = kw.value(node.value, scope), f"{node.name}[{idx(node.target_index)}]"
        if node.accumulate is not None:
            old = load(dtype, target)
            value = spell(SCATTER_COMBINE[node.accumulate], [old, value], VALUE_TYPES[dtype])
        kw.w.line(f"{target} = {store(dtype, value)};")
