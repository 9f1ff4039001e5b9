"""Triton source for one Coil kernel.

Pointwise kernels are 1-D: one program covers ``XBLOCK`` consecutive points of the flat
kept space. Reduction kernels work on ``[XBLOCK, RBLOCK]`` blocks (kept points by reduced
elements) in one of two shapes chosen by the length of the reduced row:

* ``persistent`` — the row fits in one block: every value stays in registers, each r-level
  loop of the kernel is straight-line code over the same block, and inputs are read once;
* ``looped`` — the row is longer: each r-level loop of the kernel becomes a ``for`` over
  blocks of the row with per-lane accumulators (:mod:`.reductions`).

Masks exist only where sizes need them: a kept or reduced extent known to divide by every
block size the autotuner may pick has no mask.

Two strategies write their part of a kernel their own way when their pattern matches: split
reductions (:mod:`.split`) and the online softmax (:mod:`.online_softmax`). They drive the
writer only through its interface to them, :class:`.strategy.Writer`, which
:class:`KernelWriter` implements (the methods under "the strategies' interface" below)."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, Sequence

import sympy
import torch

from coil.sdk import (Cast, CodeWriter, Const, IndexValue, Indirect, Kernel, KernelNode, Load, Loop,
                      Masked, Op, ReductionNode, ScanNode, ScatterNode, Value, loads, walk)
from coil.sdk.codegen import ValueVisitor, is_integer_identity

from . import configs, index_width, indexing, online_softmax, split
from .indexing import IndexWriter, Level, Run
from .optable import HALF, OPS, POINTER, STORAGE, compute, literal
from .reductions import Reduction
from .source import KernelShape, KernelSource
from .strategy import Scope

#: Longest reduced row (elements) kept whole in registers.
PERSISTENT_LIMIT = 8192


def _overhangs(n: int | None, blocks: list[int]) -> bool:
    """Whether some block overhangs an extent of ``n`` (unknown: it may). An empty extent is
    overhung by every block: 0 is a multiple of each, but a block of it loads past the end
    (a sum of a (7, 0) tensor read out of bounds, found by a hunt against eager, session 33)."""
    return n is None or n == 0 or any(n % b for b in blocks)


def _static(e: sympy.Expr) -> int | None:
    e = sympy.sympify(e)
    return int(e) if e.is_number else None


class KernelWriter(ValueVisitor[Scope, str]):
    """Writes a kernel's Triton functions (:meth:`generate`); implements
    :class:`.strategy.Writer` for the strategies it calls."""

    def __init__(self, kernel: Kernel, interpret: bool = False, bounds_check: bool = False) -> None:
        self.k = kernel
        self.interpret = interpret
        self.bounds_check = bounds_check
        self.w = CodeWriter()
        self.counter = 0
        #: Buffers whose current value is a variable (internal buffers, values just stored).
        self.regs: dict[str, str] = {}
        self.reduction = bool(kernel.r_ranges)
        self.xnumel = sympy.Mul(*kernel.x_ranges) if kernel.x_ranges else sympy.Integer(1)
        self.rnumel = sympy.Mul(*kernel.r_ranges) if kernel.r_ranges else sympy.Integer(1)
        self.x_contiguous = self.reduction and _contiguous_along_x(kernel)
        self.shape: KernelShape = "looped"
        if not self.reduction:
            self.shape = "pointwise"
        elif _static(self.rnumel) is not None and _static(self.rnumel) <= PERSISTENT_LIMIT \
                and not self.x_contiguous:  # a column of a row-major matrix is not one block
            self.shape = "persistent"
        self.configs = configs.candidates(self.shape, _static(self.xnumel), _static(self.rnumel),
                                          self.x_contiguous)
        x_syms, x_rng, r_syms, r_rng = kernel.x_vars, kernel.x_ranges, kernel.r_vars, kernel.r_ranges
        cut = None if self.reduction else tile_split(kernel)
        if cut is not None:  # a transpose: [XBLOCK, RBLOCK] tiles of the outer and inner dims
            self.shape, self.reduction = "tile2d", True
            x_syms, x_rng, r_syms, r_rng = x_syms[:cut], x_rng[:cut], x_syms[cut:], x_rng[cut:]
            self.xnumel, self.rnumel = sympy.Mul(*x_rng), sympy.Mul(*r_rng)
            self.configs = list(configs.TILE2D)
        self.xmask = self._needs_xmask()
        self.rmask = self._needs_rmask()
        self.persistent_scope: Scope | None = None
        xshape = "[:, None]" if self.reduction else ""
        levels = [Level("x", x_syms, x_rng, "xindex")]
        if self.reduction:
            levels.append(Level("r", r_syms, r_rng, "rindex"))
        self.levels = {lv.prefix: lv for lv in levels}
        self.ix = IndexWriter(levels)
        self._xshape = xshape
        self.int64 = self._needs_int64()
        # numel as text in expressions (a name assigned in the kernel would become a tensor
        # under the interpreter, which ``range`` cannot take)
        self.xnumel_text = indexing.text(self.xnumel)
        self.rnumel_text = indexing.text(self.rnumel)

    # -- decisions

    def _needs_xmask(self) -> bool:
        return _overhangs(_static(self.xnumel), [c.xblock for c in self.configs])

    def _needs_rmask(self) -> bool:
        return self.reduction and _overhangs(_static(self.rnumel), [c.rblock for c in self.configs])

    def _needs_int64(self) -> bool:
        exprs = [self.xnumel * self.rnumel]
        for kn in self.k.nodes:
            exprs.append(kn.store_index)
            exprs += [ld.index for ld in _loads(kn.body)]
            # indices used as data too: a random op's counter runs past its own extent
            exprs += [v.expr for v in _index_values(kn.body)]
        bounds = {**dict(zip(self.k.x_vars, self.k.x_ranges)), **dict(zip(self.k.r_vars, self.k.r_ranges))}
        return index_width.needs_int64(exprs, bounds)

    # -- the strategies' interface (strategy.Writer; also mask, value, and the attributes
    #    k, w, interpret, xnumel, rnumel, rnumel_text, x_contiguous, rmask)

    def mask(self, level: str) -> str | None:
        """The mask of loads and stores at ``level``, or None."""
        parts = []
        if self.xmask:
            parts.append("xmask")
        if level == "r" and self.rmask:
            parts.append("rmask")
        return " & ".join(parts) or None

    @contextlib.contextmanager
    def loop_values(self) -> Iterator[None]:
        """Values stored inside (an r-level loop's pointwise results) are forgotten after:
        they do not outlive their loop."""
        saved = dict(self.regs)
        yield
        self.regs = saved

    def mask_everything(self) -> None:
        """Mask every later store by ``xmask`` (and ``rmask`` at level r)."""
        self.xmask, self.rmask = True, True

    def begin_kernel(self) -> CodeWriter:
        """Write another function of this kernel into a new code writer (returned); what
        the previous function holds in registers is gone."""
        self.w, self.regs = CodeWriter(), {}
        return self.w

    # -- entry

    def generate(self) -> list[KernelSource]:
        """The kernel's Triton functions, launched in order (two for a split reduction)."""
        if self.reduction:
            parts = split.splits(self)
            if parts > 1:
                return split.generate(self, parts)
        return [self._generate()]

    def _generate(self) -> KernelSource:
        k = self.k
        params = [f"p_{b}" for b in k.inputs + k.outputs] + [s.name for s in k.size_args]
        types = [POINTER[k.dtypes[b]] for b in k.inputs + k.outputs] + ["i64"] * len(k.size_args)  # type: ignore[index]
        constexprs = ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if self.reduction else [])
        self.w.line("@jit")
        with self.w.block(f"def {k.name}({', '.join(params + constexprs)}):"):
            if self.shape == "tile2d":
                self._tile_body()
            elif self.reduction:
                self._prologue()
                self._reduction_body()
            else:
                self._prologue()
                scope = Scope(mask=self.mask("x"))
                self.emit(k.nodes, "x", scope)
        return KernelSource(k.name, self.w.text(), params, types, self.shape, self.xnumel, self.rnumel,
                            self.configs, self.x_contiguous, k.inputs + k.outputs,
                            xmask=self.xmask, rmask=self.rmask)

    def _prologue(self) -> None:
        w = self.w
        pid = "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"
        w.line(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK){self._xshape}")
        if self.xmask:
            w.line(f"xmask = xindex < {self.xnumel_text}")
        if self.reduction:
            w.line("rbase = tl.arange(0, RBLOCK)[None, :]")
        self.define_x()

    def _tile_body(self) -> None:
        """A pointwise kernel on 2-D tiles: rows over the outer dims, columns over the inner
        ones, so accesses contiguous along either stay coalesced (Triton moves the tile
        through shared memory between the two layouts)."""
        w = self.w
        w.line("pid = tl.program_id(0).to(tl.int64)" if self.int64 else "pid = tl.program_id(0)")
        w.line(f"columns = tl.cdiv({self.rnumel_text}, RBLOCK)")
        w.line("xindex = (pid // columns) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        w.line("rindex = (pid % columns) * RBLOCK + tl.arange(0, RBLOCK)[None, :]")
        if self.xmask:
            w.line(f"xmask = xindex < {self.xnumel_text}")
        if self.rmask:
            w.line(f"rmask = rindex < {self.rnumel_text}")
        self.define_x()
        self.define_r(self.k.nodes)
        self.emit(self.k.nodes, "r", Scope(mask=self.mask("r")))

    def define_x(self) -> None:
        """The kept dims' index variables the kernel's accesses use."""
        w = self.w
        runs = set()
        for kn in self.k.nodes:
            for e in node_indices(kn):
                runs |= {r for r in self.ix.split(e)[1] if r.prefix == "x"}
        for run in sorted(runs, key=lambda r: (r.lo, r.hi)):
            w.line(self.levels["x"].definition(run))

    def define_r(self, nodes: Sequence[KernelNode]) -> None:
        """The reduced dims' index variables that ``nodes`` use."""
        runs: set[Run] = set()
        for kn in nodes:
            for e in node_indices(kn):
                runs |= {r for r in self.ix.split(e)[1] if r.prefix == "r"}
        for run in sorted(runs, key=lambda r: (r.lo, r.hi)):
            self.w.line(self.levels["r"].definition(run))

    # -- reduction kernels

    def _reduction_body(self) -> None:
        w = self.w
        if self.shape == "persistent":
            w.line("rindex = rbase")
            if self.rmask:
                w.line(f"rmask = rindex < {self.rnumel_text}")
            self.define_r([kn for loop in self.k.loops if loop.level == "r" for kn in loop.nodes])
        stored_r: set[str] = set()
        loops = list(self.k.loops)
        read: set[str] = set()  # buffers the loops so far load
        i = 0
        while i < len(loops):
            loop = loops[i]
            if self._overwrites(loop) & read:
                # a store over an input (Kernel.inplace) that earlier loops read, maybe in other
                # threads of the program (their layouts may differ): every read comes first
                w.line("tl.debug_barrier()")
            start = i
            if loop.level == "x":
                self.emit(loop.nodes, "x", Scope(mask=self.mask("x")))
            elif self.shape == "persistent":
                self._persistent_loop(loop)
            elif i + 1 < len(loops) and online_softmax.matches(loop, loops[i + 1]):
                online_softmax.emit(self, loop.nodes[0], loops[i + 1].nodes[0])
                i += 1
            else:
                reads = {ld.buffer for kn in loop.nodes for ld in _loads(kn.body)}
                if reads & stored_r:
                    w.line("tl.debug_barrier()")  # values another thread stored in an earlier loop
                self._looped_loop(loop)
            stored_r |= {kn.stores[0] for kn in loop.nodes if loop.level == "r" and not kn.is_reduction}
            read |= {ld.buffer for lp in loops[start:i + 1] for kn in lp.nodes for ld in _loads(kn.body)}
            i += 1

    def _overwrites(self, loop: Loop) -> set[str]:
        """Inputs whose memory a store of ``loop`` writes over (``Kernel.inplace``)."""
        return {self.k.inplace[s] for kn in loop.nodes for s in kn.stores if s in self.k.inplace}

    def _persistent_loop(self, loop: Loop) -> None:
        # one block holds the whole row, so values computed in an earlier loop stay valid
        if self.persistent_scope is None:
            self.persistent_scope = Scope(mask=self.mask("r"))
        scope = self.persistent_scope
        for kn in loop.nodes:
            if isinstance(kn.node, ReductionNode):
                v = self.value(kn.body, scope)
                red = Reduction(kn.node.name, kn.node.reduction_type, kn.node.acc_dtype, kn.body.dtype)
                results = red.persistent(self.w, v, self.mask("r") if self.rmask else None, "rindex",
                                         self.rnumel_text)
                self.store_results(kn, results)
            else:
                self.emit([kn], "r", scope)

    def _looped_loop(self, loop: Loop) -> None:
        w = self.w
        reds = {kn.node.name: Reduction(kn.node.name, kn.node.reduction_type, kn.node.acc_dtype, kn.body.dtype)
                for kn in loop.nodes if isinstance(kn.node, ReductionNode)}
        for red in reds.values():
            red.declare(w)
        bound = self.rnumel_text if self.rnumel.is_number else f"loop_bound({self.rnumel_text})"
        with w.block(f"for roffset in range(0, {bound}, RBLOCK):"):
            w.line("rindex = roffset + rbase")
            if self.rmask:
                w.line(f"rmask = rindex < {self.rnumel_text}")
            self.define_r(loop.nodes)
            scope = Scope(mask=self.mask("r"))
            with self.loop_values():
                for kn in loop.nodes:
                    if isinstance(kn.node, ReductionNode):
                        v = self.value(kn.body, scope)
                        reds[kn.node.name].update(w, v, self.mask("r") if self.rmask else None, "rindex")
                    else:
                        self.emit([kn], "r", scope)
        for kn in loop.nodes:
            if isinstance(kn.node, ReductionNode):
                self.store_results(kn, reds[kn.node.name].finish(w))

    def store_results(self, kn: KernelNode, results: Sequence[str]) -> None:
        """A reduction's finished results (one variable per output) stored at the kept
        points, or kept in registers for internal outputs."""
        node = kn.node
        assert isinstance(node, ReductionNode)
        for i, (out, res) in enumerate(zip(node.outputs(), results)):
            self._store(out, kn.stores[i], kn.store_index, res, node.layout.dtype, "x")

    # -- nodes

    def emit(self, nodes: Sequence[KernelNode], level: str, scope: Scope) -> None:
        """Compute and store each of ``nodes`` at ``level`` (a reduction only where it
        reduces no elements)."""
        for kn in nodes:
            if isinstance(kn.node, ReductionNode):
                self._one_point_reduction(kn, scope)
                continue
            v = self.value(kn.body, scope)
            self._store(kn.node.outputs()[0], kn.stores[0], kn.store_index, v, kn.node.layout.dtype, level)

    def _one_point_reduction(self, kn: KernelNode, scope: Scope) -> None:
        """A reduction over no elements (all reduced dims of size 1): the value itself."""
        node = kn.node
        assert isinstance(node, ReductionNode)
        v = self.value(kn.body, scope)
        kind = node.reduction_type
        if kind == "welford":
            results = [v, literal(0.0, node.acc_dtype, "[1]")]
        elif kind in ("argmax", "argmin"):
            results = [literal(0, torch.int64, "[1]")]
        elif kind in ("any", "all"):
            results = [f"({v} != 0)"]
        else:
            results = [v]
        for i, (out, res) in enumerate(zip(node.outputs(), results)):
            self._store(out, kn.stores[i], kn.store_index, res, node.layout.dtype, "x")

    def _store(self, buf: str, target: str, index: sympy.Expr, value: str, dtype: torch.dtype,
               level: str) -> None:
        name = self._tmp()
        if dtype in HALF:  # round as the stored value would be, for readers in this kernel
            self.w.line(f"{name} = {self.narrow(value, dtype)}")
        else:
            self.w.line(f"{name} = ({value}).to({compute(dtype)})")
        self.regs[buf] = name
        if buf in self.k.internal:
            return
        shape = self._shape(level)
        mask = self.mask(level)
        value_text = f"tl.broadcast_to({name}, {shape}).to({STORAGE[dtype]})"
        self.w.line(f"tl.store({self.pointer(target, index, shape)}, {value_text}{f', {mask}' if mask else ''})")

    def pointer(self, buf: str, index: sympy.Expr, shape: str) -> str:
        """``p_buf + index`` as a block of pointers of ``shape`` (stores need one even where
        the index is the same for every point)."""
        text, _ = self.ix.split(index)
        if not any(self.ix.mentions(index, p) for p in ("x", "r")):
            text = f"{text} + tl.zeros({shape}, tl.int32)"
        return f"p_{buf} + ({text})"

    def _shape(self, level: str) -> str:
        if not self.reduction:
            return "[XBLOCK]"
        return "[XBLOCK, RBLOCK]" if level == "r" else "[XBLOCK, 1]"

    # -- values

    def _tmp(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    def value(self, v: Value, scope: Scope) -> str:
        """The variable holding ``v``, written first unless ``scope`` or a register has it."""
        got = scope.get(v)
        if got is not None:
            return got
        if isinstance(v, Const):
            return literal(v.value, v.dtype, "[1, 1]" if self.reduction else "[1]")
        if isinstance(v, Load) and v.buffer in self.regs:
            for ind in v.indirect:
                self.value(ind, scope)
            return self.regs[v.buffer]
        if isinstance(v, Indirect):
            name = self._tmp()
            self._indirect(v, name, scope)
        elif isinstance(v, Masked):
            name = self._tmp()
            self._masked(v, name, scope)
        else:
            expr = self.visit(v, scope)
            name = self._tmp()
            self.w.line(f"{name} = {expr}")
        scope[v] = name
        return name

    # The rules per node type (ValueVisitor): the Triton expression a new variable is assigned.
    # ``value`` handles the rest itself: constants, loads of registers, and indirect indices and
    # masked values (a few statements each).

    def visit_load(self, v: Load, scope: Scope) -> str:
        return self._load(v, scope)

    def visit_index_value(self, v: IndexValue, scope: Scope) -> str:
        text, runs = self.ix.split(v.expr)
        return f"({text}) + tl.zeros({self._shape('r' if self._mentions_r(v.expr) else 'x')}, tl.int64)"

    def visit_cast(self, v: Cast, scope: Scope) -> str:
        return self._cast(self.value(v.x, scope), v.x.dtype, v.dtype)  # type: ignore[union-attr]

    def visit_op(self, v: Op, scope: Scope) -> str:
        args = [self.value(a, scope) for a in v.args]
        operand = v.dtype if v.name == "where" or not v.args else v.args[0].dtype
        if v.name == "where":
            operand = v.args[1].dtype
        if is_integer_identity(v):
            return args[0]
        out = OPS[v.name](args, operand, self.interpret)
        if v.dtype in HALF:  # an op of a half type rounds its result, as eager does
            out = self.narrow(out, v.dtype)
        return out

    def _mentions_r(self, e: sympy.Expr) -> bool:
        return self.reduction and self.ix.mentions(e, "r")

    def _cast(self, x: str, src: torch.dtype, dst: torch.dtype) -> str:
        if dst == torch.bool:
            return f"({x} != 0)"
        if dst in HALF:  # a float64 through float32, as eager rounds it (once differs at ties)
            return self.narrow(f"({x}).to(tl.float32)" if src == torch.float64 else x, dst)
        if dst == torch.uint8 and src.is_floating_point:  # -1.0 is 255, as eager (through
            return f"{x}.to(tl.int64).to(tl.uint8)"       # int64); LLVM's fptoui gives 0
        return f"{x}.to({compute(dst)})"

    def narrow(self, x: str, dtype: torch.dtype) -> str:
        """``x`` rounded to a half type, kept in float32."""
        if self.interpret and dtype == torch.bfloat16:
            return f"round_bf16(({x}).to(tl.float32))"
        return f"({x}).to({STORAGE[dtype]}).to(tl.float32)"

    def _load(self, v: Load, scope: Scope) -> str:
        for ind in v.indirect:
            self.value(ind, scope)
        text, _ = self.ix.split(v.index)
        loop_free = not any(self.ix.mentions(v.index, p) for p in ("x", "r")) and not v.indirect
        mask = None if loop_free else scope.mask
        dtype = self.k.dtypes[v.buffer]
        args = f"p_{v.buffer} + ({text})"
        if loop_free:  # a one-element block, not a scalar: blocks and scalars mix badly
            args = self.pointer(v.buffer, v.index, "[1, 1]" if self.reduction else "[1]")
        if mask:
            level = "r" if self._mentions_r(v.index) else "x"
            args = f"{self.pointer(v.buffer, v.index, self._shape(level))}, mask={mask}, other=0"
        load = f"tl.load({args})"
        return f"{load}.to(tl.float32)" if dtype in HALF else load

    def _indirect(self, v: Indirect, name: str, scope: Scope) -> None:
        raw = self.value(v.value, scope)  # type: ignore[arg-type]
        size = indexing.text(v.size)
        self.w.line(f"{name} = {raw}.to(tl.int64)")
        # negatives wrap even where eager rejects them (not v.wrap): without the bounds check
        # (off by default: eager's own CUDA check is a device assert), a wrapped index at least
        # stays inside the buffer
        self.w.line(f"{v.symbol.name} = tl.where({name} < 0, {name} + {size}, {name})")
        if self.bounds_check:
            checked = v.symbol.name if v.wrap else name
            cond = f"(0 <= {checked}) & ({checked} < {size})"
            if scope.mask:
                cond = f"{cond} | ~({scope.mask})"
            self.w.line(f'tl.device_assert({cond}, "index out of bounds")')
        scope[v] = v.symbol.name

    def _masked(self, v: Masked, name: str, scope: Scope) -> None:
        cond = self.value(v.mask, scope)  # type: ignore[arg-type]
        inner_mask = f"({cond})" if scope.mask is None else f"({scope.mask}) & ({cond})"
        body = self.value(v.body, Scope(scope, mask=inner_mask))  # type: ignore[arg-type]
        shape = "[1, 1]" if self.reduction else "[1]"
        other = literal(v.other, v.dtype, shape)
        self.w.line(f"{name} = tl.where({cond}, {body}, {other})")


def tile_split(k: Kernel) -> int | None:
    """Where to cut a pointwise kernel's dims into tile rows and columns: after the dim that
    some access walks with unit stride, when another walks the innermost dim with unit stride
    (a transpose); None to stay 1-D. Static sizes, plain pointwise nodes only."""
    d = len(k.x_ranges)
    if d < 2 or any(not n.is_number for n in k.x_ranges) or not k.nodes or \
            any(kn.is_reduction for kn in k.nodes):
        return None
    indices = []
    for kn in k.nodes:
        indices += [sympy.expand(sympy.sympify(ld.index)) for ld in _loads(kn.body) if ld.buffer not in k.internal]
        if kn.node.outputs()[0] not in k.internal:
            indices.append(sympy.expand(sympy.sympify(kn.store_index)))
    outer_unit = _unit_dims(indices, k, lambda e, i: e.coeff(k.x_vars[i]) == 1)
    if outer_unit is None and any(e.atoms(sympy.Function) for e in indices):
        # dims folded by views (a cat of windows' q, k and v, one of them transposed): unit
        # steps in most places, not as coefficients
        outer_unit = _unit_dims(indices, k, lambda e, i: e.coeff(k.x_vars[i]) == 1 or _mostly_unit_step(
            e, tuple(k.x_vars), tuple(int(n) for n in k.x_ranges), i))
    if outer_unit is None:
        return None
    rows, cols = sympy.Mul(*k.x_ranges[:outer_unit + 1]), sympy.Mul(*k.x_ranges[outer_unit + 1:])
    return outer_unit + 1 if int(rows) >= 16 and int(cols) >= 16 else None


def _unit_dims(indices: list[sympy.Expr], k: Kernel, unit: Callable[[sympy.Expr, int], bool]) -> int | None:
    """The innermost dim but the last that some access walks with unit stride (``unit(e,
    dim)``), provided another access walks the last dim so; None otherwise."""
    d = len(k.x_vars)
    inner_unit, outer_unit = False, None
    for e in indices:
        units = [i for i in range(d) if unit(e, i)]
        if d - 1 in units:
            inner_unit = True
        elif units:
            outer_unit = max(units) if outer_unit is None else max(outer_unit, max(units))
    return outer_unit if inner_unit else None


#: Where :func:`_mostly_unit_step` samples a dim: fractions of its range.
_SAMPLES = (0.13, 0.37, 0.61, 0.89)


@functools.lru_cache(maxsize=4096)
def _mostly_unit_step(e: sympy.Expr, xs: tuple[sympy.Symbol, ...], ranges: tuple[int, ...], dim: int) -> bool:
    """Whether stepping dim ``dim`` (of ``xs`` over ``ranges``) by one moves index ``e``, which
    reads it through a division or remainder, by one at most sampled points (the other dims
    at the same fractions of their ranges)."""
    v = xs[dim]
    if ranges[dim] < 2 or not any(v in f.free_symbols for f in e.atoms(sympy.Function)):
        return False
    hits = 0
    for f in _SAMPLES:
        point = {x: sympy.Integer(min(int(n * f), n - 2) if i == dim else int(n * f))
                 for i, (x, n) in enumerate(zip(xs, ranges))}
        here = e.xreplace(point)
        point[v] += 1
        hits += (e.xreplace(point) - here) == 1
    return hits * 4 >= len(_SAMPLES) * 3


def _loads(v: Value) -> list[Load]:
    return loads(v)


def _index_values(v: Value) -> list[IndexValue]:
    return [x for x in walk(v) if isinstance(x, IndexValue)]


def node_indices(kn: KernelNode) -> list[sympy.Expr]:
    """Every index expression a kernel node uses: its store, its loads, indices as data."""
    out = [kn.store_index] + [ld.index for ld in _loads(kn.body)]
    out += [x.expr for x in walk(kn.body) if isinstance(x, IndexValue)]
    return out


def _contiguous_along_x(k: Kernel) -> bool:
    """Whether more accesses have unit stride along the innermost kept dim than along the
    innermost reduced dim (a column reduction such as ``x.sum(0)``). Only tile-shaped reads
    count, those that vary along both levels: a vector broadcast across the kept points (a
    layer norm's per-row statistics in its weight gradient) is read once per tile of them."""
    if not k.x_ranges or not k.r_ranges:
        return False
    x, r = k.x_vars[-1], k.r_vars[-1]
    along_x = along_r = 0
    for kn in k.nodes:
        for e in [ld.index for ld in _loads(kn.body) if ld.buffer not in k.internal]:
            e = sympy.sympify(e)
            if not (e.free_symbols & set(k.x_vars)) or not (e.free_symbols & set(k.r_vars)):
                continue
            dx, dr = sympy.diff(e, x), sympy.diff(e, r)
            along_x += dx == 1 and dr != 1
            along_r += dr == 1
    return along_x > along_r


__all__ = ["KernelWriter", "KernelSource", "ScanNode", "ScatterNode"]
