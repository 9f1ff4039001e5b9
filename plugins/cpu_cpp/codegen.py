"""C++ source for one Coil kernel: the function, its pointers, values and stores, and the
pointwise loop nest (OpenMP-parallel outer loops, an ``omp simd`` inner loop). Reduction
kernels are scheduled by :mod:`.reduction_loops`, scans and scatters by :mod:`.special`."""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import sympy
import torch

from coil.sdk import (Cast, CodeWriter, Const, IndexValue, Indirect, Kernel, KernelNode, Load, Masked,
                      Op, ReductionNode, ScanNode, ScatterNode, Value)
from coil.sdk.codegen import ValueScope, ValueVisitor, is_integer_identity
from coil.sdk.symbolic import fold_divmod

from . import reduction_loops, special, streaming, template
from .accumulators import accumulator
from .cpp import for_header, idx, on_one_thread, parallel_for, parallel_if
from .divmod_split import innermost_split
from .half_nan import nan_low_half_clear
from .hoist import hoist_row_invariants, unmasked
from .masked_rows import MaskedRows
from .tables import table_scope
from .tiling import TILE, stride_along, transpose_tiles
from .optable import BUFFER_CTYPES, CTYPES, OPS, literal


class KernelWriter(ValueVisitor[ValueScope[str], str]):
    """Writes one ``extern "C"`` function for a kernel."""

    def __init__(self, kernel: Kernel, fn_name: str, llc: int = 0, *, prefetch: bool = True,
                 tile: int = TILE) -> None:
        self.k = kernel
        #: Bytes of the last-level cache where stores may stream (:mod:`.streaming`); 0: never.
        self.llc = llc
        #: Whether multi-pass reductions prefetch the next row (:mod:`.prefetch`).
        self.prefetch = prefetch
        #: Tile side of tiled transposes (:mod:`.tiling`); 0: never tiled.
        self.tile = tile
        #: (buffer, index) of a load read from a transposed local tile -> the local's
        #: element (see :meth:`_transposed_tiles`).
        self.tile_loads: dict[tuple[str, object], str] = {}
        self.fn_name = fn_name
        self.w = CodeWriter("  ")
        self.counter = 0
        self.locals: dict[str, str] = {}  # internal buffer -> C++ local holding it
        #: Set while emitting code that runs once per SIMD lane over arrays of locals: the
        #: subscript (``[lane]``) that selects the lane's element of each local.
        self.lane = ""
        #: Rewrites of index subexpressions into loop variables (see :mod:`.divmod_split`).
        self.index_subs: dict[sympy.Expr, sympy.Expr] = {}
        #: A line at the top of each lane of the outer reduction schedule (the split
        #: variable's definition, see :mod:`.reduction_loops`).
        self.lane_prelude = ""
        #: Masked loads read through row pointers in the pointwise loop nest (see
        #: :mod:`.masked_rows`); none elsewhere.
        self.rows: MaskedRows | None = None
        #: Set while emitting a loop whose stores stream (see :mod:`.streaming`); ``streamed``:
        #: store name -> the index of the chunk's line, learned from the stores.
        self.streams: streaming.Streams | None = None
        self.streamed: dict[str, str] = {}

    # -- entry

    def generate(self) -> tuple[str, str]:
        params = ", ".join(f"int64_t {a}" for a in self._param_names())
        signature = f'void {self.fn_name}({params})'
        with self.w.block(f'extern "C" {signature} {{', "}"):
            self._pointers()
            if isinstance(self.k.special, ScanNode):
                special.scan(self, self.k.special)
            elif isinstance(self.k.special, ScatterNode):
                special.scatter(self, self.k.special)
            elif self.k.template is not None:
                template.template_kernel(self)
            elif self.k.r_ranges:
                reduction_loops.reduction_kernel(self)
            else:
                self._pointwise_kernel()
        return self.w.text(), signature + ";"

    def _param_names(self) -> list[str]:
        return [f"{b}_addr" for b in self.k.inputs + self.k.outputs] + [s.name for s in self.k.size_args]

    def _pointers(self) -> None:
        for b in self.k.inputs:
            self.w.line(f"auto {b} = reinterpret_cast<const {self.ctype(b)}*>({b}_addr);")
        for b in self.k.outputs:
            self.w.line(f"auto {b} = reinterpret_cast<{self.ctype(b)}*>({b}_addr);")

    def ctype(self, buf: str) -> str:
        """The C++ type a buffer is addressed as (:data:`~.optable.BUFFER_CTYPES`)."""
        return BUFFER_CTYPES[self.k.dtypes[buf]]  # type: ignore[index]

    def idx(self, e: sympy.Expr) -> str:
        """An index expression in C++, in terms of the loop variables of the nest."""
        if not self.index_subs:
            return idx(e)
        return idx(fold_divmod(sympy.sympify(e)).xreplace(self.index_subs))

    def pragma(self, line: str) -> None:
        """A pragma line, if there is one (``cpp.parallel_for`` may give none)."""
        if line:
            self.w.line(line)

    def _tmp(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    # -- loop nests

    @contextlib.contextmanager
    def loops(self, names: Sequence[str], sizes: Sequence[sympy.Expr],
              inner_pragma: str = "") -> Iterator[None]:
        """Nested ``for`` loops over ``names``; ``inner_pragma`` goes before the innermost."""
        with contextlib.ExitStack() as stack:
            for i, (v, n) in enumerate(zip(names, sizes)):
                if inner_pragma and i == len(names) - 1:
                    self.w.line(inner_pragma)
                stack.enter_context(self.w.block(for_header(v, n), "}"))
            yield

    def _pointwise_kernel(self) -> None:
        nodes = [n for loop in self.k.loops for n in loop.nodes]
        if not self.k.x_ranges:
            self.emit_nodes(nodes, ValueScope())
            return
        names, ranges = [v.name for v in self.k.x_vars], list(self.k.x_ranges)
        split = innermost_split(self.k)
        if split is not None:
            names[-1:] = [split.hi.name, split.lo.name]
            ranges[-1:] = [ranges[-1] // split.divisor, sympy.Integer(split.divisor)]
            self.index_subs = split.substitutions()
        else:
            tiles = transpose_tiles(self.k, self.tile)
            if tiles is not None:
                self._tiled_pointwise(nodes, tiles.dim)
                return
        if split is None and len(ranges) > 1:
            self._rows_pointwise(nodes, names, ranges)
            return
        streams = streaming.plan(self, nodes, self.k.x_vars[0], ranges[0]) if split is None and len(ranges) == 1 else None
        if streams is not None:
            self._streamed_flat(nodes, streams)
            return
        self.pragma(parallel_for(sympy.Mul(*self.k.x_ranges), len(ranges) - 1, simd=len(ranges) == 1))
        with self.loops(names, ranges, "#pragma omp simd" if len(ranges) > 1 else ""):
            if split is not None:
                self.w.line(f"int64_t {split.var} = {split.divisor}*{split.hi} + {split.lo};")
            self.emit_nodes(nodes, ValueScope())

    def _streamed_flat(self, nodes: list[KernelNode], streams: streaming.Streams) -> None:
        """A one-dim loop nest whose stores stream (:mod:`.streaming`): the threads share its
        chunks, each fencing after its share."""
        if on_one_thread(self.k.x_ranges[0]):
            with streaming.chunked(self, streams):
                self.emit_nodes(nodes, ValueScope())
            return
        self.w.line(f"#pragma omp parallel {parallel_if(self.k.x_ranges[0])}")
        with self.w.block("{", "}"):
            with streaming.chunked(self, streams, "#pragma omp for nowait"):
                self.emit_nodes(nodes, ValueScope())

    def _rows_pointwise(self, nodes: list[KernelNode], names: list[str], ranges: list[sympy.Expr]) -> None:
        """The loop nest with what changes along the innermost loop and few others computed
        once per call (:mod:`.tables`), what stays the same along it once per row (:mod:`.hoist`),
        and masked loads of whole rows read through row pointers (:mod:`.masked_rows`)."""
        bodies = [kn.body for kn in nodes]
        var = self.k.x_vars[-1]
        self.rows = MaskedRows(self, var, ranges[-1]).plan(bodies)
        self.rows.declare()
        tables = table_scope(self, bodies, dict(zip(self.k.x_vars, ranges)))
        self.pragma(parallel_for(sympy.Mul(*self.k.x_ranges), len(ranges) - 1))
        with self.loops(names[:-1], ranges[:-1]):
            row: ValueScope[str] = ValueScope(tables)
            hoist_row_invariants(self, bodies, var, row)
            self.rows.bind(row)
            streams = streaming.plan(self, nodes, var, ranges[-1])
            if streams is not None:
                with streaming.chunked(self, streams):
                    self.emit_nodes(nodes, ValueScope(row))
                return
            with self.loops(names[-1:], ranges[-1:], "#pragma omp simd"):
                self.emit_nodes(nodes, ValueScope(row))

    def _tiled_pointwise(self, nodes: list[KernelNode], dim: int) -> None:
        """The loop nest over square tiles (``self.tile``) of kept dim ``dim`` and the innermost
        one (see :mod:`.tiling`): the other dims and the two tile loops are shared by the
        threads, the two loops within a tile run inside, the innermost as a vector loop. A
        full tile runs loops of constant length (whole vectors, no remainder), the tiles at
        the ragged edges loops bounded by the sizes; where the sizes are known multiples of
        the tile, only the first."""
        names, ranges = [v.name for v in self.k.x_vars], list(self.k.x_ranges)
        tiled = (dim, len(names) - 1)
        outer = [i for i in range(len(names)) if i not in tiled]
        self.pragma(parallel_for(sympy.Mul(*ranges), len(outer) + 2))
        with contextlib.ExitStack() as stack:
            for i in outer:
                stack.enter_context(self.w.block(for_header(names[i], ranges[i]), "}"))
            for i in tiled:
                stack.enter_context(self.w.block(for_header(f"{names[i]}_tile", ranges[i], step=self.tile), "}"))
            transposed = self._transposed_tiles(nodes, dim)
            if all(ranges[i].is_Integer and int(ranges[i]) % self.tile == 0 for i in tiled):
                self._tile(nodes, dim, transposed, full=True)
                return
            fits = " && ".join(f"{names[i]}_tile + {self.tile} <= {idx(ranges[i])}" for i in tiled)
            with self.w.block(f"if ({fits}) {{", "}"):
                self._tile(nodes, dim, transposed, full=True)
            with self.w.block("else {", "}"):
                self._tile(nodes, dim, transposed, full=False)

    def _tile(self, nodes: list[KernelNode], dim: int, transposed: list[tuple[str, str, str, str]],
              full: bool) -> None:
        """One tile of :meth:`_tiled_pointwise`: its transposed copies, then its two loops
        (``full``: of the tile's length; else up to the sizes)."""
        names, ranges = [v.name for v in self.k.x_vars], list(self.k.x_ranges)
        tiled = (dim, len(names) - 1)
        extent = [str(self.tile) if full else f"std::min<int64_t>({self.tile}, {idx(ranges[i])} - {names[i]}_tile)"
                  for i in tiled]
        for ctype, local, start, stride in transposed:
            self.w.line(f"alignas(64) {ctype} {local}[{self.tile}][{self.tile}];")
            self.w.line(f"coil::transpose_tile(&{start}, {stride}, &{local}[0][0], {self.tile}, "
                        f"{extent[0]}, {extent[1]});")
        with contextlib.ExitStack() as stack:
            for i in tiled:
                if i == tiled[-1]:
                    self.w.line("#pragma omp simd")
                end = (f"{names[i]}_tile + {self.tile}" if full else
                       f"std::min<int64_t>({names[i]}_tile + {self.tile}, {idx(ranges[i])})")
                stack.enter_context(self.w.block(for_header(names[i], end, start=f"{names[i]}_tile"), "}"))
            self.emit_nodes(nodes, ValueScope())

    def _transposed_tiles(self, nodes: list[KernelNode], dim: int) -> list[tuple[str, str, str, str]]:
        """Inside a tile of :meth:`_tiled_pointwise`: each 4-byte tensor the tile reads along
        ``dim`` (unit stride) and across the innermost dim (stride S) is copied into a local
        tile in the loop's order (``coil::transpose_tile``, through registers: see
        ``coil_transpose.h``), and its loads read the local tile instead of gathering.
        Only loads outside masked bodies (they run at every point of the tile, so the tile
        reads nothing the loop would not) and without data-dependent indices. Returns each
        copy's (element type, local, first element read, stride) for :meth:`_tile`."""
        x_dim, x_last = self.k.x_vars[dim], self.k.x_vars[-1]
        tile_of = {v: sympy.Symbol(f"{v.name}_tile", integer=True, nonnegative=True) for v in (x_dim, x_last)}
        out: list[tuple[str, str, str, str]] = []
        for kn in nodes:
            for v in unmasked(kn.body):
                if (not isinstance(v, Load) or v.indirect or v.buffer in self.k.internal
                        or (v.buffer, v.index) in self.tile_loads or self.k.dtypes[v.buffer].itemsize != 4):
                    continue
                e = sympy.sympify(v.index)
                stride = stride_along(e, x_last, {*self.k.x_vars, *self.k.r_vars})
                if sympy.diff(e, x_dim) != 1 or stride is None or (stride.is_number and stride <= 1):
                    continue
                local = f"tt{len(self.tile_loads)}"
                out.append((self.ctype(v.buffer), local, f"{v.buffer}[{self.idx(e.xreplace(tile_of))}]",
                            self.idx(stride)))
                self.tile_loads[(v.buffer, v.index)] = (
                    f"{local}[{x_dim.name} - {x_dim.name}_tile][{x_last.name} - {x_last.name}_tile]")
        return out

    # -- nodes and values

    def emit_nodes(self, nodes: list[KernelNode], scope: ValueScope[str]) -> None:
        for kn in nodes:
            if isinstance(kn.node, ReductionNode):
                self._one_point_reduction(kn, scope)
                continue
            v = self.value(kn.body, scope)
            self.store(kn.node.outputs()[0], kn.store_index, v, kn.node.layout.dtype,
                       store_name=kn.stores[0])

    def _one_point_reduction(self, kn: KernelNode, scope: ValueScope[str]) -> None:
        """A reduction whose reduced dims all have size 1 (it has no r loop): one update."""
        node = kn.node
        assert isinstance(node, ReductionNode)
        acc = accumulator(node.reduction_type, node.name, CTYPES[node.acc_dtype], CTYPES[kn.body.dtype])
        self.w.lines(acc.declare("acc_"))
        self.w.line(acc.update("acc_", "", self.value(kn.body, scope), "0"))
        for i, out in enumerate(node.outputs()):
            self.store(out, kn.store_index, acc.result("acc_", "", i), node.layout.dtype,
                       store_name=kn.stores[i])

    def store(self, buf: str, index: sympy.Expr, value: str, dtype: object,
              store_name: str | None = None) -> None:
        t = CTYPES[dtype] if dtype is not None else "auto"  # type: ignore[index]
        streamed = streaming.store_line(self, store_name or buf, index, value, t) if self.streams else None
        if streamed is not None:
            self.w.line(streamed)
        elif buf not in self.k.internal:
            self.w.line(f"{store_name or buf}[{self.idx(index)}] = coil::cast<{t}>({value});")
        elif self.lane:
            self.w.line(f"v_{buf}{self.lane} = coil::cast<{t}>({value});")
            self.locals[buf] = f"v_{buf}"
        else:
            self.w.line(f"{t} v_{buf} = coil::cast<{t}>({value});")
            self.locals[buf] = f"v_{buf}"

    def value(self, v: Value, scope: ValueScope[str]) -> str:
        got = scope.get(v)
        if got is not None:
            return got
        if isinstance(v, Const):
            return literal(v.value, v.dtype)
        if isinstance(v, Load) and v.buffer in self.locals:
            for ind in v.indirect:
                self.value(ind, scope)
            return self.locals[v.buffer] + self.lane
        if isinstance(v, Indirect):
            return self._indirect(v, scope)
        expr = self.visit(v, scope)
        name = self._tmp()
        self.w.line(f"{CTYPES[v.dtype]} {name} = {expr};")
        scope[v] = name
        return name

    # The rules per node type (ValueVisitor): the C++ expression a new local is initialised
    # with. ``value`` handles what gets no new local itself: constants, indirect indices and
    # loads of internal buffers.

    def visit_load(self, v: Load, scope: ValueScope[str]) -> str:
        for ind in v.indirect:
            self.value(ind, scope)
        tile = self.tile_loads.get((v.buffer, v.index)) if self.tile_loads else None
        return tile if tile is not None else f"{v.buffer}[{self.idx(v.index)}]"

    def visit_index_value(self, v: IndexValue, scope: ValueScope[str]) -> str:
        return f"static_cast<int64_t>({self.idx(v.expr)})"

    def visit_cast(self, v: Cast, scope: ValueScope[str]) -> str:
        inner = v.x
        if (v.dtype == torch.float32 and isinstance(inner, Cast) and inner.dtype == torch.bfloat16
                and inner.x is not None and inner.x.dtype == torch.float32):
            # a float rounded to bf16 and widened again (eager's rounding between two bf16 ops):
            # the same bits without the trip through 16-bit lanes (6-8% on a bf16 chain)
            rounding = "round_bf16_nan_clean" if nan_low_half_clear(inner.x) else "round_bf16"
            return f"coil::{rounding}({self.value(inner.x, scope)})"
        if v.dtype == torch.bfloat16 and inner is not None and inner.dtype == torch.float32 and nan_low_half_clear(inner):
            return f"coil::to_bf16_nan_clean({self.value(inner, scope)})"
        return f"coil::cast<{CTYPES[v.dtype]}>({self.value(v.x, scope)})"  # type: ignore[arg-type]

    def visit_op(self, v: Op, scope: ValueScope[str]) -> str:
        args = [self.value(a, scope) for a in v.args]
        operand_t = CTYPES[v.dtype] if v.name == "where" or not v.args else CTYPES[v.args[0].dtype]
        if is_integer_identity(v):
            return args[0]
        return OPS[v.name](args, operand_t)

    def _indirect(self, v: Indirect, scope: ValueScope[str]) -> str:
        """The index, a negative one counted from the end where ``v.wrap``; one outside
        ``[0, size)`` sets ``coil::INDEX_OUT_OF_BOUNDS`` (raised after the kernel, as eager
        raises) and reads or writes element 0 instead, never memory outside the buffer."""
        raw = self.value(v.value, scope)  # type: ignore[arg-type]
        name, size = v.symbol.name, self.idx(v.size)
        self.w.line(f"int64_t {name} = {raw};")
        if v.wrap:
            self.w.line(f"{name} = {name} < 0 ? {name} + {size} : {name};")
        self.w.line(f"if (__builtin_expect(static_cast<uint64_t>({name}) >= static_cast<uint64_t>({size}), 0)) "
                    f"{name} = coil::index_out_of_bounds();")
        scope[v] = name
        return name

    def visit_masked(self, v: Masked, scope: ValueScope[str]) -> str:
        through_row = self.rows.read(v, scope) if self.rows is not None else None
        if through_row is not None:
            return through_row
        mask = self.value(v.mask, scope)  # type: ignore[arg-type]
        name = self._tmp()
        self.w.line(f"{CTYPES[v.dtype]} {name} = {literal(v.other, v.dtype)};")
        with self.w.block(f"if ({mask}) {{", "}"):
            body = self.value(v.body, scope.child())  # type: ignore[arg-type]
            self.w.line(f"{name} = {body};")
        return name
