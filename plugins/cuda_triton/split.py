"""Split reductions: many reduced elements per few kept points (``x.sum(0)`` of a tall
matrix) do not give enough programs to fill the GPU when each program owns whole rows.

The reduced range is cut into ``SPLIT`` chunks; a first kernel reduces every (kept block,
chunk) pair into a float32 (or the accumulator's type) workspace of ``SPLIT x xnumel``
partial states, a second combines the ``SPLIT`` partials of each kept point and stores the
result. Both are plain kernels of this plugin; :class:`SplitLauncher` allocates the
workspace and runs them in order. Only kernels that are one loop of reductions that
combine by themselves (sum, prod, max, min, any, all, and Welford's (mean, m2, count),
three workspaces) split; that loop may also store pointwise values (each (kept point,
chunk) pair is visited once), and an epilogue at the kept points (a mean's division, a
loss's scale) runs in the second kernel after the partials are combined.

Kept points that are contiguous in memory (a column sum of a row-major matrix) are read in
tiles across up to 64 of them (as few as cover them: 32 channels of a channels-last
activation get tiles 32 wide), with up to 1024 chunks. A whole-tensor reduction (one kept
point: ``mse_loss``), and a few kept points that are not contiguous (batch norm's
per-channel statistics of an NCHW tensor: 64 channels of 800 thousand elements each in
ResNet's first layer, where one program per channel took 3.7 ms on the H200), give each
program one kept point and a long row of its chunk instead."""
from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from coil.sdk import ReductionNode

from .configs import Config, pow2_at_least
from .optable import POINTER, STORAGE, literal
from .reductions import Reduction, identity, reduce_block, welford_lanes
from .source import KernelSource
from .strategy import Scope, Writer

SPLITTABLE = ("sum", "prod", "max", "min", "any", "all", "welford")
#: Programs to aim for: a few waves of the H200's 132 SMs.
TARGET_PROGRAMS = 528
#: Contiguous kept points per program at most, and at least (fewer kept points than this
#: leave rows of the tile masked).
XBLOCK, LEAST_XBLOCK = 64, 8
#: Elements and warps of the partial kernel's two candidate tiles (``XBLOCK x RBLOCK``: 64 x 32
#: and 64 x 64 where there are 64 kept points or more; 32 x 64 and 32 x 128 for 32 of them).
PARTIAL_TILES = ((2048, 4), (4096, 8))
#: Chunks at most: with several kept blocks, and with a single kept point (whose only program
#: would otherwise loop over every element alone). A few contiguous kept points (batch norm's
#: 32 channels of a channels-last activation of 800 thousand rows) need the most chunks: 64
#: programs of [64, 64] tiles, half of them masked, ran EfficientNet-B0's first gradient sums
#: at 0.3 TB/s on an H100.
MOST_SPLITS, MOST_SPLITS_ONE_POINT = 1024, 512
#: Elements of the combining kernel's tile (kept points x chunks).
COMBINE_TILE = 4096
#: A single kept point's chunks, and those of kept points not contiguous in memory, are read
#: by one row of long blocks instead.
RBLOCK_ONE_POINT = 2048
ONE_POINT_CONFIGS = [Config(1, 1024, num_warps=4), Config(1, 2048, num_warps=8)]
#: Kept points not contiguous in memory split only when each has at least this many elements.
LEAST_STRIDED_ROW = 16384
WELFORD_FIELDS = ("mean", "m2", "n")


def _rows(kw: Writer) -> bool:
    """Whether each program reduces one kept point's chunk as a row of long blocks."""
    return int(kw.xnumel) == 1 or not kw.x_contiguous


def partial_configs(xn: int) -> list[Config]:
    """The partial kernel's candidates for ``xn`` contiguous kept points: every one with the
    same ``XBLOCK`` (the grid depends on it), as few rows as cover the kept points."""
    xblock = min(XBLOCK, max(LEAST_XBLOCK, pow2_at_least(xn)))
    return [Config(xblock, elements // xblock, num_warps=warps) for elements, warps in PARTIAL_TILES]


def _blocking(kw: Writer) -> tuple[int, int, list[Config]]:
    """(XBLOCK, the largest RBLOCK, the candidates) of the partial kernel."""
    if _rows(kw):
        return 1, RBLOCK_ONE_POINT, list(ONE_POINT_CONFIGS)
    configs = partial_configs(int(kw.xnumel))
    return configs[0].xblock, max(c.rblock for c in configs), configs


def splits(kw: Writer) -> int:
    """How many chunks to cut the reduced range into (1: do not split)."""
    k = kw.k
    xn, rn = kw.xnumel, kw.rnumel
    if not (xn.is_number and rn.is_number):
        return 1
    xn, rn = int(xn), int(rn)
    rows = _rows(kw)
    if rows and xn > 1 and rn < LEAST_STRIDED_ROW:
        return 1
    loops = k.loops
    if not loops or loops[0].level != "r" or rn < 1024 or k.inplace:
        return 1
    if len(loops) > 2 or (len(loops) == 2 and loops[1].level != "x"):
        return 1  # one pass over the reduced range, then at most an epilogue at the kept points
    reds = [kn for kn in loops[0].nodes if isinstance(kn.node, ReductionNode)]
    if not reds or any(kn.node.reduction_type not in SPLITTABLE for kn in reds):  # type: ignore[union-attr]
        return 1
    if len(loops) == 2 and any(isinstance(kn.node, ReductionNode) for kn in loops[1].nodes):
        return 1
    xblock, rblock, _ = _blocking(kw)
    blocks = -(-xn // xblock)
    if blocks * 2 > TARGET_PROGRAMS:
        return 1
    if xn == 1:
        return max(2, min(MOST_SPLITS_ONE_POINT, rn // (4 * RBLOCK_ONE_POINT)))
    return max(2, min(MOST_SPLITS, pow2_at_least(TARGET_PROGRAMS // blocks), rn // (4 * rblock)))


def _reductions(kw: Writer) -> list[Any]:
    return [kn for kn in kw.k.loops[0].nodes if isinstance(kn.node, ReductionNode)]


def _workspaces_of(node: ReductionNode) -> list[tuple[str, Any]]:
    """(parameter name, torch dtype) of one reduction's workspaces: its partial states, or
    Welford's mean, m2 and count."""
    if node.reduction_type == "welford":
        return [(f"p_ws_{node.name}_{field}", node.acc_dtype) for field in WELFORD_FIELDS]
    dtype = node.layout.dtype if node.reduction_type in ("any", "all") else node.acc_dtype
    return [(f"p_ws_{node.name}", dtype)]


def workspaces(kw: Writer) -> list[tuple[str, Any]]:
    """(parameter name, torch dtype) of every workspace, reduction by reduction."""
    return [ws for kn in _reductions(kw) for ws in _workspaces_of(kn.node)]


def generate(kw: Writer, split: int) -> list[KernelSource]:
    """The partial and the combining kernel, written through ``kw``."""
    k, w = kw.k, kw.w
    ws = workspaces(kw)
    params = [f"p_{b}" for b in k.inputs + k.outputs] + [p for p, _ in ws] + [s.name for s in k.size_args]
    types = ([POINTER[k.dtypes[b]] for b in k.inputs + k.outputs] + [POINTER[d] for _, d in ws]  # type: ignore[index]
             + ["i64"] * len(k.size_args))
    xn, rn = int(kw.xnumel), int(kw.rnumel)
    xblock, rblock, configs = _blocking(kw)
    chunk = -(-rn // split)
    chunk = -(-chunk // rblock) * rblock
    blocks = -(-xn // xblock)
    constexprs = ["XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]
    # -- partial states
    w.line("@jit")
    with w.block(f"def {k.name}({', '.join(params + constexprs)}):"):
        # int64 where the kernel's indices need it: ``part * chunk`` reaches the reduced extent
        w.line("pid = tl.program_id(0).to(tl.int64)" if kw.int64 else "pid = tl.program_id(0)")
        w.line(f"part = pid // {blocks}")
        w.line(f"xindex = (pid % {blocks}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        w.line(f"xmask = xindex < {xn}")
        w.line("rbase = tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if kw.int64 else ""))
        kw.mask_everything()
        kw.define_x()
        loop = k.loops[0]
        reds = {kn.node.name: Reduction(kn.node.name, kn.node.reduction_type, kn.node.acc_dtype, kn.body.dtype)  # type: ignore[union-attr]
                for kn in loop.nodes if isinstance(kn.node, ReductionNode)}
        for red in reds.values():
            red.declare(w)
        start = f"loop_bound(part * {chunk})"
        with w.block(f"for roffset in range({start}, {start} + {chunk}, RBLOCK):"):
            w.line("rindex = roffset + rbase")
            w.line(f"rmask = rindex < {rn}")
            kw.define_r(loop.nodes)
            scope = Scope(mask="xmask & rmask")
            for kn in loop.nodes:
                if isinstance(kn.node, ReductionNode):
                    v = kw.value(kn.body, scope)
                    reds[kn.node.name].update(w, v, "xmask & rmask", "rindex")
                else:
                    kw.emit([kn], "r", scope)
        for kn, red in zip(_reductions(kw), reds.values()):
            if red.kind == "welford":  # the count too: chunks' counts differ where masks cut them
                n = red.name
                results = welford_lanes(w, n, f"{n}_mean", f"{n}_m2", f"{n}_n")
            else:
                results = red.finish(w)
            for (param, dtype), res in zip(_workspaces_of(kn.node), results):
                w.line(f"tl.store({param} + part * {xn} + xindex, ({res}).to({STORAGE[dtype]}), xmask)")
    first = KernelSource(k.name, w.text(), params, types, "split", sympy.Integer(blocks * xblock * split),
                         kw.rnumel, configs, True,
                         k.inputs + k.outputs + [p[2:] for p, _ in ws], xmask=True, rmask=True,
                         workspaces=[(split * xn, d) for _, d in ws])
    # -- combine the partials, then the epilogue at the kept points
    w2 = kw.begin_kernel()
    name = f"{k.name}_combine"
    sblock = pow2_at_least(split)
    w2.line("@jit")
    with w2.block(f"def {name}({', '.join(params + constexprs)}):"):
        w2.line("xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        w2.line(f"xmask = xindex < {xn}")
        w2.line("sindex = tl.arange(0, RBLOCK)[None, :]")
        w2.line(f"smask = sindex < {split}")
        kw.define_x()
        for i, kn in enumerate(_reductions(kw)):
            node = kn.node
            kind = node.reduction_type  # type: ignore[union-attr]
            spaces = _workspaces_of(node)
            if kind == "welford":  # masked partials are (0, 0, 0): no weight in the combine
                for (param, _), field in zip(spaces, WELFORD_FIELDS):
                    w2.line(f"w_{field} = tl.load({param} + sindex * {xn} + xindex, mask=xmask & smask, other=0)")
                results = welford_lanes(w2, f"r{i}", "w_mean", "w_m2", "w_n")[:2]
            else:
                ((param, dtype),) = spaces
                ident = Reduction(node.name, kind, node.acc_dtype, kn.body.dtype)  # type: ignore[union-attr]
                w2.line(f"v = tl.load({param} + sindex * {xn} + xindex, mask=xmask & smask, other=0)")
                w2.line(f"v = tl.where(smask, v, {_neutral(ident, dtype)})")
                if kind == "sum":
                    w2.line(f"r{i} = tl.sum(v, 1)[:, None]")
                else:
                    w2.line(f"r{i} = {reduce_block(kind, 'v', dtype)}")
                results = [f"r{i}"]
            kw.store_results(kn, results)
        if len(k.loops) == 2:
            kw.emit(k.loops[1].nodes, "x", Scope(mask="xmask"))
    second = KernelSource(name, w2.text(), params, types, "pointwise-2d", sympy.Integer(xn), sympy.Integer(split),
                          [Config(max(1, min(64, COMBINE_TILE // sblock)), sblock, num_warps=4)], False,
                          first.buffers, xmask=True, rmask=True)
    return [first, second]


def _neutral(red: Reduction, dtype: Any) -> str:
    return literal(identity(red.kind, dtype), dtype, "[1, 1]")


class SplitLauncher:
    """Allocates the workspaces and runs the partial and the combining kernel."""

    def __init__(self, partial: Any, combine: Any, n_buffers: int, ws: Sequence[tuple[int, Any]]) -> None:
        self.partial, self.combine = partial, combine
        self.n_buffers = n_buffers
        self.ws = ws  # (elements, dtype) per workspace

    def __call__(self, stream: Any, *args: Any) -> None:
        device = args[0].device
        spaces = [torch.empty(n, dtype=d, device=device) for n, d in self.ws]
        full = (*args[:self.n_buffers], *spaces, *args[self.n_buffers:])
        self.partial(stream, *full)
        self.combine(stream, *full)
