"""Kernels of the special single-node kinds.

* Scans (cumsum, cumprod): ``[XBLOCK, RBLOCK]`` blocks, a loop over blocks of the scanned
  dim with ``tl.cumsum``/``tl.cumprod`` inside each block and a running carry between them.
* Scatters: two launches in order — copy the base over the output, then write the sources.
  Accumulating scatters use atomics where Triton has them (add for float and 32/64-bit
  integers, max/min for 32/64-bit integers and float32); the others run on one program,
  in order, which is slow but exact (last write wins for plain overwrites, as on the CPU)."""
from __future__ import annotations

import sympy
import torch

from coil.sdk import IndexValue, Kernel, ScanNode, ScatterNode, Value, loads, walk
from coil.sdk.ir import ScatterAccumulate

from .codegen import KernelSource, KernelWriter, Scope
from .configs import Config, pow2_at_least
from .indexing import IndexWriter, Level, text
from .optable import POINTER, STORAGE, compute
from .source import KernelShape

_ATOMIC = {
    "add": (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64),
    "amax": (torch.int32, torch.int64),
    "amin": (torch.int32, torch.int64),
}
_ATOMIC_FN = {"add": "tl.atomic_add", "amax": "tl.atomic_max", "amin": "tl.atomic_min"}


def special_kernel(kernel: Kernel, interpret: bool) -> list[KernelSource]:
    node = kernel.special
    if isinstance(node, ScanNode):
        return [_ScanWriter(kernel, interpret, node).source()]
    assert isinstance(node, ScatterNode)
    return [_ScatterBaseWriter(kernel, interpret, node).source(), _ScatterWriter(kernel, interpret, node).source()]


def _vars(prefix: str, n: int) -> list[sympy.Symbol]:
    return [sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True) for i in range(n)]


def _numel(ranges: tuple) -> sympy.Expr:
    return sympy.Mul(*ranges) if ranges else sympy.Integer(1)


class _SpecialWriter(KernelWriter):
    """A KernelWriter whose levels come from one special node rather than fused nodes."""

    suffix = ""

    def __init__(self, kernel: Kernel, interpret: bool, x_ranges: tuple, r_ranges: tuple) -> None:
        super().__init__(kernel, interpret)
        self.x_ranges, self.r_ranges = tuple(x_ranges), tuple(r_ranges)
        self.reduction = bool(r_ranges)
        self.xnumel, self.rnumel = _numel(self.x_ranges), _numel(self.r_ranges)
        self.xnumel_text = _text(self.xnumel)
        self.rnumel_text = _text(self.rnumel)
        levels = [Level("x", _vars("x", len(x_ranges)), self.x_ranges, "xindex")]
        if self.reduction:
            levels.append(Level("r", _vars("r", len(r_ranges)), self.r_ranges, "rindex"))
        self.levels = {lv.prefix: lv for lv in levels}
        self.ix = IndexWriter(levels)
        self._xshape = "[:, None]" if self.reduction else ""
        self.int64 = True
        self.xmask = self.rmask = True

    def as_stored(self, x: str, dtype: torch.dtype) -> str:
        """``x`` in ``dtype``'s storage type; to bf16 rounded to nearest under the interpreter,
        whose own conversion truncates where the GPU's rounds (as ``KernelWriter.narrow``)."""
        if self.interpret and dtype == torch.bfloat16:
            return f"{self.narrow(x, dtype)}.to(tl.bfloat16)"
        return f"({x}).to({STORAGE[dtype]})"

    def header(self, name: str) -> None:
        k = self.k
        params = [f"p_{b}" for b in k.inputs + k.outputs] + [s.name for s in k.size_args]
        constexprs = ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if self.reduction else [])
        self.w.line("@jit")
        self.w.line(f"def {name}({', '.join(params + constexprs)}):")

    def define_all(self, exprs: list[sympy.Expr]) -> None:
        runs = set()
        for e in exprs:
            runs |= self.ix.split(e)[1]
        for run in sorted(runs, key=lambda r: (r.prefix, r.lo, r.hi)):
            self.w.line(self.levels[run.prefix].definition(run))

    def make(self, shape: KernelShape, configs: list[Config]) -> KernelSource:
        k = self.k
        params = [f"p_{b}" for b in k.inputs + k.outputs] + [s.name for s in k.size_args]
        types = [POINTER[k.dtypes[b]] for b in k.inputs + k.outputs] + ["i64"] * len(k.size_args)  # type: ignore[index]
        return KernelSource(k.name + self.suffix, self.w.text(), params, types, shape, self.xnumel,
                            self.rnumel, configs, False, k.inputs + k.outputs, xmask=True, rmask=True)


def _text(e: sympy.Expr) -> str:
    return text(e)


class _ScanWriter(_SpecialWriter):
    def __init__(self, kernel: Kernel, interpret: bool, node: ScanNode) -> None:
        super().__init__(kernel, interpret, node.ranges, (node.scan_range,))
        self.node = node

    def source(self) -> KernelSource:
        node, w = self.node, self.w
        self.header(self.k.name)
        acc_t = compute(node.acc_dtype)
        with w.indent():
            w.line("xindex = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
            w.line(f"xmask = xindex < {self.xnumel_text}")
            w.line("rbase = tl.arange(0, RBLOCK)[None, :]")
            w.line(f"carry = tl.full([XBLOCK, 1], {0 if node.combine == 'sum' else 1}, {acc_t})")
            bound = self.rnumel_text if self.rnumel.is_number else f"loop_bound({self.rnumel_text})"
            with w.block(f"for roffset in range(0, {bound}, RBLOCK):"):
                w.line("rindex = roffset + rbase")
                w.line(f"rmask = rindex < {self.rnumel_text}")
                self.define_all([node.store_index] + _index_exprs(node.body))
                v = self.value(node.body, Scope(mask="xmask & rmask"))
                neutral = "0" if node.combine == "sum" else "1"
                w.line(f"v = tl.where(xmask & rmask, tl.broadcast_to(({v}).to({acc_t}), [XBLOCK, RBLOCK]), {neutral})")
                if node.combine == "sum":
                    w.line("s = tl.cumsum(v, 1) + carry")
                    w.line("carry = carry + tl.sum(v, 1)[:, None]")
                else:
                    w.line("s = tl.cumprod(v, 1) * carry")
                    w.line("carry = carry * tl.reduce(v, 1, mul_combine)[:, None]")
                # a scan of one row has a store index without x: widened to the mask's shape by
                # adding zeros (Triton's interpreter cannot store through a broadcast view)
                ptr = f'{self.pointer(node.name, node.store_index, "[XBLOCK, RBLOCK]")} + tl.zeros([XBLOCK, RBLOCK], tl.int32)'
                w.line(f"tl.store({ptr}, {self.as_stored('s', node.layout.dtype)}, xmask & rmask)")
        n = int(self.rnumel) if self.rnumel.is_number else 1024
        rblock = min(pow2_at_least(n), 1024)
        return self.make("scan", [Config(max(1, min(64, 4096 // rblock)), rblock, num_warps=4)])


class _ScatterBaseWriter(_SpecialWriter):
    suffix = "_base"

    def __init__(self, kernel: Kernel, interpret: bool, node: ScatterNode) -> None:
        super().__init__(kernel, interpret, node.ranges, ())
        self.node = node

    def source(self) -> KernelSource:
        node, w = self.node, self.w
        self.header(self.k.name + self.suffix)
        with w.indent():
            w.line("xindex = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK)")
            w.line(f"xmask = xindex < {self.xnumel_text}")
            self.define_all([node.store_index] + _index_exprs(node.base))
            v = self.value(node.base, Scope(mask="xmask"))
            ptr = self.pointer(node.name, node.store_index, "[XBLOCK]")
            w.line(f"tl.store({ptr}, {self.as_stored(f'tl.broadcast_to({v}, [XBLOCK])', node.layout.dtype)}, xmask)")
        return self.make("pointwise", [Config(1024, num_warps=4)])


class _ScatterWriter(_SpecialWriter):
    """Writes the sources over ``src_ranges`` (the ``x`` level of this launch)."""

    def __init__(self, kernel: Kernel, interpret: bool, node: ScatterNode) -> None:
        super().__init__(kernel, interpret, node.src_ranges, ())
        # the node's value and target are written over r variables: read them as x here
        self.node = node
        self.ix = IndexWriter([Level("r", _vars("r", len(node.src_ranges)), tuple(node.src_ranges), "xindex")])
        self.levels = {"r": self.ix.levels[0]}
        dtype, acc = node.layout.dtype, node.accumulate
        self.atomic = acc is not None and dtype in _ATOMIC.get(acc, ())
        self.serial = acc is not None and not self.atomic

    def source(self) -> KernelSource:
        node, w = self.node, self.w
        self.header(self.k.name)
        dtype = node.layout.dtype
        with w.indent():
            if self.serial:  # one program walks the sources in order
                bound = self.xnumel_text if self.xnumel.is_number else f"loop_bound({self.xnumel_text})"
                loop = w.block(f"for i in range(0, {bound}):")
                loop.__enter__()
                w.line("xindex = i + tl.zeros([XBLOCK], tl.int64)")
                w.line("xmask = xindex < xindex + 1")
            else:
                w.line("xindex = tl.program_id(0).to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK)")
                w.line(f"xmask = xindex < {self.xnumel_text}")
            self.define_all([node.target_index] + _index_exprs(node.value, *node.target_indirect))
            scope = Scope(mask="xmask")
            for ind in node.target_indirect:
                self.value(ind, scope)
            v = self.value(node.value, scope)
            target = self.pointer(node.name, node.target_index, "[XBLOCK]")
            value = f"tl.broadcast_to({v}, [XBLOCK])"
            if node.accumulate is None:
                w.line(f"tl.store({target}, {self.as_stored(value, dtype)}, xmask)")
            elif self.atomic:
                if self.interpret:  # the interpreter's atomics read a broadcast value as if laid out
                    value = f"tl.where(xmask, {value}, 0)"  # (a constant's stride 0): a new array
                w.line(f"{_ATOMIC_FN[node.accumulate]}({target}, {self.as_stored(value, dtype)}, xmask)")
            else:
                w.line(f"cur = tl.load({target}, mask=xmask, other=0).to({compute(dtype)})")
                w.line(f"tl.store({target}, {self.as_stored(_combined(node.accumulate, 'cur', value, dtype), dtype)}, xmask)")
            if self.serial:
                loop.__exit__(None, None, None)
        if self.serial:
            return self.make("serial", [Config(1, num_warps=1)])
        return self.make("pointwise", [Config(1024, num_warps=4)])


def _combined(accumulate: ScatterAccumulate, cur: str, val: str, dtype: torch.dtype) -> str:
    fp = dtype.is_floating_point
    return {"add": f"({cur} + {val})", "mul": f"({cur} * {val})",
            "amax": f"max_nan({cur}, {val})" if fp else f"tl.maximum({cur}, {val})",
            "amin": f"min_nan({cur}, {val})" if fp else f"tl.minimum({cur}, {val})"}[accumulate]


def _index_exprs(*values: Value) -> list[sympy.Expr]:
    """The index expressions of ``values`` whose loop variables the kernel must define: every
    load's index, and every index value (``arange``'s position, a scatter's computed target:
    a position embedding's backward reads its token position as a value)."""
    out: list[sympy.Expr] = []
    for v in values:
        out += [ld.index for ld in loads(v)] + [x.expr for x in walk(v) if isinstance(x, IndexValue)]
    return out
