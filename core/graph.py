"""Graph lowering: walks a functional ATen FX graph, lowers each op through the registry
(falling back to ATen per op), and collects the IR nodes, buffers, inputs and outputs."""
from __future__ import annotations

import functools
import logging
import operator
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import sympy
import torch
import torch.fx

from . import ir, library_args, output_aliases, symbolic
from .config import Config
from .errors import LoweringError
from .ir import Expr, Layout
from .lowering import LoweringContext, LoweringRegistry, Realized, TensorValue
from .lowering.context import FallbackRecord, layout_from_meta, same_strides
from .lowering.pointwise import SUPPORTED_DTYPES
from .lowering.values import Lazy, cast, check_static_sizes, to_sympy
from .ops import EXACT_OPS
from .templates import TEMPLATE_OPS, TemplateOffer, offer

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: Ops that go to ATen by design (the GEMM template plugin adds choices for them); one with a
#: lowering (``aten.convolution``: depthwise ones, :mod:`coil.lowering.depthwise`) is lowered
#: where that lowering accepts it, and is a library call where it declines.
LIBRARY_OPS = {
    aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_flash_attention_backward.default,
}
for _name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"):
    if hasattr(aten, _name):  # the cuDNN attention ops (torch 2.11 through 2.13 have them)
        LIBRARY_OPS.add(getattr(aten, _name).default)


@dataclass
class GraphInput:
    """One graph argument: a tensor (``name`` is its buffer) or a symbolic int."""

    position: int
    name: str | None
    symbol: Expr | None = None


@dataclass
class GraphOutput:
    """A graph result: a buffer seen through a layout, a symbolic int, or a constant."""

    name: str | None = None
    layout: Layout | None = None
    expr: Expr | None = None
    constant: Any = None


@dataclass
class LoweredGraph:
    inputs: list[GraphInput]
    nodes: list[ir.Node]
    outputs: list[GraphOutput]
    buffers: dict[str, ir.Buffer]
    fallbacks: list[FallbackRecord]
    #: symbol -> (input position, "size"|"stride"|"value", dim) where its value can be read.
    symbol_sources: dict[sympy.Symbol, tuple[int, str, int]] = field(default_factory=dict)
    #: Tensor constants of the graph (``get_attr``), by buffer name.
    constants: dict[str, torch.Tensor] = field(default_factory=dict)


def _target_name(target: Any) -> str:
    if hasattr(target, "_schema") and hasattr(target, "_overloadname"):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _should_realize_on_reuse(body: ir.Value, config: Config) -> bool:
    """Whether a value used more than once costs enough to store rather than recompute. Reads
    count by buffer: a body that reads one buffer at several places (a label compared twice, a
    window's taps) reads it from cache after the first; counting each load stored the one-hot
    gradient of a cross-entropy, a float32 tensor of tokens x vocabulary, to spare two loads
    of the labels."""
    return (len({ld.buffer for ld in ir.loads(body)}) > config.realize_reads_threshold
            or ir.op_count(body) > config.realize_opcount_threshold)


def _stored_where_returned(node: torch.fx.Node, result: Lazy, body: ir.Value,
                           buffers: dict[str, ir.Buffer], inputs: set[str]) -> bool:
    """Whether ``node``'s value is a graph output (stored in any case) that reads a smaller
    buffer computed in the graph (a reduction's result: a norm's mean and ``rsqrt``; a patch
    embedding's convolution output, which a token concatenation reads) together with any
    other buffer (a norm's input, as large as the value). Its other users then read the
    stored value rather than computing it again, which kept the buffers it reads alive until
    the last of them ran: DeiT-tiny's forward saves each layer norm's normalized input for the
    backward, and recomputing it in later kernels kept the norm's float32 input alive (+30
    MiB over Inductor's peak at batch 64); recomputing its token concatenation (class and
    distillation tokens, patch embeddings, position embeddings) kept the patch embedding's
    output alive. Such a value is computed in a pass after its reduction anyway, so storing
    it there costs no kernel. A value whose smaller operands are graph inputs stays inlined:
    a convolution's output plus its bias, stored apart from the batch norm's reductions that
    read it, cost a kernel per layer; nor does a value of one buffer count (a batch norm's
    ``rsqrt`` of its variance; see ``_stored_by_a_user`` for why)."""
    if not any(user.op == "output" for user in node.users):
        return False
    numel = ir.sympy_product(result.size)
    read = [name for name in {ld.buffer for ld in ir.loads(body)} if name in buffers]
    return len(read) > 1 and any(name not in inputs and buffers[name].layout.numel != numel
                                 for name in read)


#: Nodes of one load's index expression above which the value is stored (see
#: ``GraphLowering._maybe_realize``).
INDEX_SIZE_LIMIT = 200


def _index_size(body: ir.Value) -> int:
    """The size of the largest load index of ``body``, in expression nodes."""
    return max((sum(1 for _ in sympy.preorder_traversal(ld.index)) for ld in ir.loads(body)), default=0)


@functools.lru_cache(maxsize=None)
def _overloads(*names: str) -> frozenset[Any]:
    """Every overload of the ATen ops ``names``."""
    packets = [getattr(torch.ops.aten, n) for n in names]
    return frozenset(getattr(p, overload) for p in packets for overload in p.overloads())


#: Ops that pick some of their input's elements by value; their gradients and uses compare
#: the picked values with the input again (``x == amax(x)``).
_SELECTING = ("amax", "amin", "max", "min", "sort", "topk", "kthvalue", "median", "nanmedian",
              "mode", "cummax", "cummin", "argmax", "argmin")
_COMPARING = ("eq", "ne", "lt", "le", "gt", "ge")


#: Views that a stored value gives without a copy: through them a user still reads the store.
_VIEWS = frozenset(getattr(torch.ops.aten, n).default for n in (
    "view", "_unsafe_view", "reshape", "permute", "t", "alias", "unsqueeze", "expand")) | frozenset(
    (torch.ops.aten.transpose.int, torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims,
     torch.ops.aten.squeeze.default))


#: Half-precision types whose values every wider float type holds exactly.
_WIDENS_EXACTLY = {torch.float32: (torch.bfloat16, torch.float16), torch.float64: (torch.bfloat16, torch.float16, torch.float32)}


def _widened_from(body: ir.Value) -> torch.dtype | None:
    """The narrower float type ``body`` widens exactly (its last op a cast from it), if any."""
    if isinstance(body, ir.Cast) and body.x.dtype in _WIDENS_EXACTLY.get(body.dtype, ()):
        return body.x.dtype
    return None


def _recomputed_inexactly(node: torch.fx.Node, body: ir.Value) -> bool:
    """Whether ``node``'s value must be stored once rather than recomputed by each user: a
    selecting op (a max, a sort) reads it, another user compares it with something (what
    was picked, in ``x == amax(x)``, autograd's mask for a max), and its body calls the math
    library, whose scalar and vector variants (one per loop) may differ in the last bit --
    then ``tanh(x) == amax(tanh(x))`` would hold nowhere."""
    targets = {user.target for user in node.users}
    if not targets & _overloads(*_SELECTING) or not targets & _overloads(*_COMPARING):
        return False
    return any(isinstance(v, ir.Op) and v.name not in EXACT_OPS for v in ir.walk(body))


class GraphLowering:
    """Lowers one FX graph. Use :meth:`run`."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 registry: LoweringRegistry, config: Config,
                 templates: "dict[str, TemplateOffer] | None" = None, *,
                 eager_outputs: Sequence[Any] | None = None,
                 free_outputs: frozenset[int] = frozenset()) -> None:
        self.gm = gm
        #: The outputs' values as traced, before graph passes rewrote them (a padded
        #: product's slice has the padded strides in its own metadata); by default, the
        #: output nodes' metadata.
        self.eager_outputs = list(eager_outputs) if eager_outputs is not None else None
        #: Output positions that may keep the layout the lowering gives them (a training
        #: forward's saved activations, whose strides are reported to AOTAutograd); every
        #: other output is returned in eager's strides (:meth:`_output`).
        self.free_outputs = free_outputs
        #: Device type -> the templates its backend takes (:mod:`coil.templates`).
        self.templates = templates or {}
        self.example_inputs = list(example_inputs)
        self.registry = registry
        self.ctx = LoweringContext(config)
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[GraphInput] = []
        #: Names of the tensor inputs' buffers (``_stored_where_returned`` asks per value).
        self.input_names: set[str] = set()
        self.symbol_sources: dict[sympy.Symbol, tuple[int, str, int]] = {}
        self.constants: dict[str, torch.Tensor] = {}
        #: (value, its broadcast dims, aligned rows) -> the library argument written for it
        #: (:meth:`_broadcast_ref`), so one mask read by every layer is written once.
        self._broadcasts: dict[tuple[int, tuple[int, ...], bool], tuple[Lazy, ir.BufferRef]] = {}

    def run(self) -> LoweredGraph:
        position = 0
        outputs: list[GraphOutput] = []
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, position)
                position += 1
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                flat = _flat_outputs(node.args[0])
                metas = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in flat]
                eager = (self.eager_outputs if self.eager_outputs is not None
                         and len(self.eager_outputs) == len(flat) else metas)
                views = {**self._aliased_outputs(flat), **self._input_views(flat)}
                outputs = [views[i] if i in views else
                           self._output(self.env[n] if isinstance(n, torch.fx.Node) else n, meta,
                                        eager=None if i in self.free_outputs else eager[i])
                           for i, (n, meta) in enumerate(zip(flat, metas))]
            elif node.op == "get_attr":
                self.env[node] = self._get_attr(node)
        return LoweredGraph(self.inputs, self.ctx.nodes, outputs, self.ctx.buffers,
                            self.ctx.fallbacks, self.symbol_sources, self.constants)

    # -- placeholders and attributes

    def _placeholder(self, node: torch.fx.Node, position: int) -> Any:
        example = node.meta.get("val", self.example_inputs[position] if position < len(self.example_inputs) else None)
        if isinstance(example, torch.SymInt):
            expr = example.node.expr
            if isinstance(expr, sympy.Symbol):
                self.symbol_sources.setdefault(expr, (position, "value", 0))
            self.inputs.append(GraphInput(position, None, expr))
            return example
        if not isinstance(example, torch.Tensor):
            self.inputs.append(GraphInput(position, None))
            return example
        name = f"arg{position}"
        size = tuple(to_sympy(s) for s in example.size())
        stride = tuple(to_sympy(s) for s in example.stride())
        for dim, (n, st) in enumerate(zip(size, stride)):
            if isinstance(n, sympy.Symbol):
                self.symbol_sources.setdefault(n, (position, "size", dim))
            if isinstance(st, sympy.Symbol):
                self.symbol_sources.setdefault(st, (position, "stride", dim))
        layout = Layout(example.dtype, example.device, size, stride, sympy.Integer(0))
        self.ctx.add_buffer(name, layout, storage_offset=to_sympy(example.storage_offset()))
        self.inputs.append(GraphInput(position, name))
        self.input_names.add(name)
        return Realized(example.dtype, example.device, size, name, layout)

    def _get_attr(self, node: torch.fx.Node) -> Any:
        """A tensor constant of the graph: a buffer the wrapper holds by name."""
        value = getattr(self.gm, str(node.target))
        if not isinstance(value, torch.Tensor):
            return value
        name = f"const{len(self.constants)}"
        self.constants[name] = value
        size = tuple(sympy.Integer(s) for s in value.size())
        stride = tuple(sympy.Integer(s) for s in value.stride())
        layout = Layout(value.dtype, value.device, size, stride, sympy.Integer(0))
        self.ctx.add_buffer(name, layout)
        return Realized(value.dtype, value.device, size, name, layout)

    # -- calls

    def _call(self, node: torch.fx.Node) -> Any:
        if node.target is operator.getitem:
            base = self.env[node.args[0]]
            return base[node.args[1]]
        args = torch.fx.node.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n])
        self.ctx.origin, self.ctx.decomposed_from = _target_name(node.target), str(node.meta.get("original_aten"))
        self.ctx.out_meta = node.meta.get("val")
        device_type = _device_type(args, kwargs, self.ctx.out_meta)
        # by design, unless its lowering takes it; or a backend's own call (coil.prepack)
        library = _is_library(node.target)
        fn = self.registry.lookup(node.target, device_type)
        unsupported = _unsupported_dtype(args, kwargs, self.ctx.out_meta)
        if fn is not None and unsupported is not None:
            if not library:
                return self._fallback(node, args, kwargs, "fallback", f"dtype {unsupported}")
            fn = None
        result: Any = None
        body: ir.Value | None = None
        mark = len(self.ctx.nodes)
        if fn is not None:
            try:
                result = check_static_sizes(fn(self.ctx, *args, **kwargs), self.ctx.out_meta)
                body = _trial_load(result)
            except (LoweringError, NotImplementedError, TypeError, AssertionError) as exc:
                del self.ctx.nodes[mark:]
                reason = str(exc) or type(exc).__name__
                log.debug("falling back for %s: %s", self.ctx.origin, reason)
                kind, why = ("library", "by design") if library else ("fallback", reason)
                result = self._fallback(node, args, kwargs, kind, why)
        else:
            kind, why = ("library", "by design") if library else ("fallback", "no lowering")
            result = self._fallback(node, args, kwargs, kind, why)
            offered = self.templates.get(device_type or "")
            if offered is not None and node.target in TEMPLATE_OPS:
                extern = self.ctx.nodes[-1]
                template = offer(extern, offered) if isinstance(extern, ir.ExternNode) else None
                if template is not None:
                    template.record = self.ctx.fallbacks[-1]
                    self.ctx.nodes[-1] = template
        self._track_origins(args, kwargs, result, mark)
        return self._maybe_realize(node, result, body)

    def _track_origins(self, args: Any, kwargs: Any, result: Any, mark: int) -> None:
        """Lazy results and new nodes remember every ATen op inlined into them."""
        inlined: list[str] = []
        for a in ir._flatten(list(args) + list(kwargs.values())):
            if isinstance(a, Lazy):
                inlined.extend(a.origins)
        origins = tuple(dict.fromkeys([*inlined, self.ctx.origin]))
        for value in ir._flatten(result if isinstance(result, (list, tuple)) else [result]):
            if isinstance(value, Lazy):
                value.origins = tuple(dict.fromkeys([*value.origins, *origins]))
        for new in self.ctx.nodes[mark:]:
            # nodes this op built around its inputs' bodies (realized inputs keep their own)
            if isinstance(new, (ir.ReductionNode, ir.ScanNode, ir.ScatterNode)) or getattr(new, "mutates", None):
                new.origins = tuple(dict.fromkeys([*inlined, *new.origins]))

    def _maybe_realize(self, node: torch.fx.Node, result: Any, body: ir.Value | None) -> Any:
        if not isinstance(result, Lazy) or body is None:
            return result
        if len(node.users) > 1 and (_should_realize_on_reuse(body, self.ctx.config)
                                    or _recomputed_inexactly(node, body) or self._stored_by_a_user(node)
                                    or _stored_where_returned(node, result, body, self.ctx.buffers,
                                                              self.input_names)):
            return self._store(node, result, body)
        index_size = _index_size(body)
        if index_size > INDEX_SIZE_LIMIT:
            # chained views (channel shuffles) compose index expressions that grow with every
            # link; past this size simplifying and compiling them costs more than a copy
            log.debug("storing %s: an index expression of %d nodes", node.name, index_size)
            return self.ctx.realize(result, layout_from_meta(node.meta.get("val")))
        return result

    def _store(self, node: torch.fx.Node, result: Lazy, body: ir.Value) -> Any:
        """``result`` written to memory for its users. A value that is an exact widening of a
        half-precision one (autocast's batch-norm backward upcasts every bf16 gradient it
        reads twice) is stored in the narrow type, and its users widen what they load:
        the same values in half the bytes, where only generated kernels read it."""
        dims = library_args.expanded_dims(node.meta.get("val"))
        if dims:  # a broadcast in eager: written once along it (in rows an attention bias can take)
            ref = self._broadcast_ref(result, dims, align=True)
            return Realized(result.dtype, result.device, tuple(result.size), ref.name, ref.layout)
        layout = layout_from_meta(node.meta.get("val"))
        narrow = _widened_from(body)
        if narrow is None or layout is None or not all(self._inlines(u) for u in node.users):
            return self.ctx.realize(result, layout)

        def inner(idx: list[Any]) -> ir.Value:
            v = result.load(idx)
            assert isinstance(v, ir.Cast) and v.x.dtype == narrow, v  # the body's structure
            return v.x
        stored = self.ctx.realize(Lazy(narrow, result.device, result.size, inner, origins=result.origins),
                                  replace(layout, dtype=narrow))
        return Lazy(result.dtype, result.device, result.size,
                    lambda idx: cast(stored.load(idx), result.dtype), origins=result.origins)

    def _stored_by_a_user(self, node: torch.fx.Node) -> bool:
        """Whether a library call or a fallback reads ``node``'s value from memory, directly or
        through views. The value is then written once, and every other user reads it, rather
        than each computing it again: GPT-2's forward wrote each GELU twice, for the next linear
        and, transposed, as the tensor its backward saves (and each weight's bf16 cast twice).
        A graph output alone does not count: storing a batch norm's ``rsqrt`` because the graph
        returns it made GCC 12 drop a Welford sum from the kernel (``tests/repros_open``)."""
        users = list(node.users)
        while users:
            user = users.pop()
            if user.op == "call_function" and not self._inlines(user):
                return True
            if user.target in _VIEWS:
                users.extend(user.users)
        return False

    def _inlines(self, user: torch.fx.Node) -> bool:
        """Whether ``user`` has a lowering (so it inlines a lazy input rather than needing it
        in memory in its own dtype)."""
        if user.op != "call_function" or user.target in LIBRARY_OPS:
            return False
        device = _device_type([], {}, user.meta.get("val"))
        return user.target is operator.getitem or self.registry.lookup(user.target, device) is not None

    def _broadcast_ref(self, v: Lazy, dims: tuple[int, ...], align: bool) -> ir.BufferRef:
        """``v`` written once along ``dims`` (where eager's argument has stride 0) and passed
        as a view that broadcasts it there, as eager passes it (:func:`library_args.expanded_dims`);
        once per value, however many calls read it."""
        known = self._broadcasts.get((id(v), dims, align))
        if known is not None and known[0] is v:
            return known[1]
        size = tuple(sympy.Integer(1) if d in dims else n for d, n in enumerate(v.size))
        one = Lazy(v.dtype, v.device, size,
                   lambda idx: v.load([sympy.Integer(0) if d in dims else i for d, i in enumerate(idx)]),
                   origins=v.origins)
        layout = Layout(v.dtype, v.device, size, ir.contiguous_strides(size), sympy.Integer(0))
        if align and not library_args.rows_aligned(layout):
            layout = library_args.padded_layout(layout)
        r = self.ctx.realize(one, layout)
        stride = tuple(sympy.Integer(0) if d in dims else st for d, st in enumerate(r.layout.stride))
        ref = ir.BufferRef(r.name, Layout(r.dtype, r.device, tuple(v.size), stride, r.layout.offset))
        self._broadcasts[(id(v), dims, align)] = (v, ref)  # v kept: its id is not reused
        return ref

    def _fallback(self, node: torch.fx.Node, args: Any, kwargs: Any, kind: str, reason: str) -> Any:
        """Call the op itself at run time, on realized buffers."""
        if not callable(node.target):
            raise LoweringError(str(node.target), "not callable")
        self.ctx.fallbacks.append(FallbackRecord(self.ctx.origin, reason, kind))

        def to_ref(v: Any, meta: Any, align: bool = False) -> Any:
            dims = library_args.expanded_dims(meta) if isinstance(v, Lazy) else ()
            if dims:
                return self._broadcast_ref(v, dims, align)
            if isinstance(v, TensorValue):
                # the layout eager gives this value, so the op sees (and returns) what it
                # would in eager; the wrapper still checks what comes back
                r = self.ctx.realize(v, layout_from_meta(meta), view_ok=True)
                if align and not library_args.rows_aligned(r.layout):
                    source = v if isinstance(v, Lazy) else Lazy(r.dtype, r.device, r.size, r.load)
                    r = self.ctx.realize(source, library_args.padded_layout(r.layout))
                return ir.BufferRef(r.name, r.layout)
            if isinstance(v, torch.SymBool):  # a runtime check's condition (u0 <= 2), unsimplified
                return symbolic.from_torch(v.node.expr)
            if isinstance(v, (list, tuple)):
                metas = meta if isinstance(meta, (list, tuple)) and len(meta) == len(v) else [None] * len(v)
                return type(v)(to_ref(i, m) for i, m in zip(v, metas))
            return v

        def meta_of(a: Any) -> Any:
            return torch.fx.node.map_arg(a, lambda n: n.meta.get("val"))

        aligned = library_args.aligned_positions(node.target)
        ref_args = tuple(to_ref(a, meta_of(fa), i in aligned.values())
                         for i, (a, fa) in enumerate(zip(args, node.args)))
        ref_kwargs = {k: to_ref(v, meta_of(node.kwargs[k]), k in aligned) for k, v in kwargs.items()}
        meta = node.meta.get("val")
        names: list[str] = []
        layouts: list[Layout | None] = []
        paths: list[tuple[int, ...]] = []
        if (symbol := symbolic.defined_symbol(meta)) is not None:  # item(): the wrapper binds it
            names, layouts, paths = [symbol], [None], [()]
        for path, m in _tensor_leaves(meta):
            name = self.ctx.new_name()
            size = tuple(to_sympy(s) for s in m.size())
            stride = tuple(to_sympy(s) for s in m.stride())
            layout = Layout(m.dtype, m.device, size, stride, sympy.Integer(0))
            self.ctx.add_buffer(name, layout)
            names.append(name)
            layouts.append(layout)
            paths.append(path)
        aliases = _aliased_inputs(node.target, ref_args)
        self.ctx.add_node(ir.ExternNode(
            names[0] if names else self.ctx.new_name(), op=node.target, args=ref_args,
            kwargs=ref_kwargs, output_names=tuple(names), output_layouts=tuple(layouts),
            output_paths=tuple(paths), kind=kind, aliases=aliases))
        values = {path: Realized(lay.dtype, lay.device, lay.size, n, lay)
                  for path, n, lay in zip(paths, names, layouts) if lay is not None}
        return _rebuild(meta, values, ())

    # -- outputs

    def _aliased_outputs(self, flat: list[Any]) -> dict[int, GraphOutput]:
        """Outputs eager returns as views of one storage (:mod:`coil.output_aliases`): their
        base written once in its traced layout, each returned as a view of that buffer with
        its traced sizes, strides and offset."""
        views: dict[int, GraphOutput] = {}
        for group in output_aliases.groups(flat, skip=self.free_outputs):
            value = self.env.get(group.base)
            base = group.base.meta["val"]
            wanted = layout_from_meta(base)
            if not isinstance(value, TensorValue) or value.dtype != base.dtype or wanted is None \
                    or tuple(value.size) != tuple(wanted.size):
                continue
            if isinstance(value, Realized) and (value.name in self.input_names or value.layout.offset != 0
                                                or not same_strides(value.layout, wanted)):
                value = _reread(value)  # copied
            r = self.ctx.realize(value, wanted)
            for i in group.members:
                meta = flat[i].meta["val"]
                layout = Layout(meta.dtype, meta.device, tuple(to_sympy(n) for n in meta.size()),
                                tuple(to_sympy(st) for st in meta.stride()), to_sympy(meta.storage_offset()))
                views[i] = GraphOutput(r.name, layout)
        return views

    def _input_views(self, flat: list[Any]) -> dict[int, GraphOutput]:
        """Outputs eager returns as views of a graph input (:func:`coil.output_aliases.input_views`)."""
        names = {node: value.name for node in self.gm.graph.find_nodes(op="placeholder")
                 if isinstance(value := self.env.get(node), Realized)}
        skip = self.free_outputs | {i for i, n in enumerate(flat) if isinstance(n, torch.fx.Node) and isinstance(
            self.env.get(n), Realized) and self.env[n].name in self.input_names}  # already views of an input
        return {i: GraphOutput(name, layout) for i, (name, layout) in
                output_aliases.input_views(self.gm.graph, flat, names, skip).items()}

    def _output(self, value: Any, meta: Any, *, eager: Any = None) -> GraphOutput:
        """A graph output (``meta``: its node's value). A lazy value is written in that
        layout. A buffer already written (a library call's result, a view of one) is
        returned as it is, unless its strides differ from the dense ones of ``eager`` (the
        value as traced): a product padded to the GEMM alignment (:mod:`coil.pad_gemm`) is a
        view of a wider buffer, and a user's ``logits.view(-1)`` would raise on it where
        eager's would not. Then it is copied into eager's layout. Graph inputs are returned
        as they are: AOTAutograd rebuilds an output that aliases an input from its strides."""
        wanted = layout_from_meta(eager)
        if isinstance(value, Realized) and wanted is not None and value.name not in self.input_names \
                and tuple(value.layout.size) == tuple(wanted.size) and not same_strides(value.layout, wanted):
            r = self.ctx.realize(_reread(value), wanted)
            return GraphOutput(r.name, r.layout)
        if isinstance(value, TensorValue):
            r = self.ctx.realize(value, layout_from_meta(meta))
            return GraphOutput(r.name, r.layout)
        if isinstance(value, torch.SymInt):
            return GraphOutput(expr=to_sympy(value))
        return GraphOutput(constant=value)


def generated_here(node: torch.fx.Node, device: torch.device, registry: LoweringRegistry) -> bool:
    """Whether ``node`` has a lowering of its own on ``device`` (a library op or one without
    a lowering runs in ATen)."""
    return not _is_library(node.target) and registry.lookup(node.target, device.type) is not None


def _is_library(target: Any) -> bool:
    """A library op by design, or a backend's own call (coil.prepack)."""
    return target in LIBRARY_OPS or getattr(target, "coil_library", False)


def _reread(value: Realized) -> Lazy:
    """A written buffer read back as a lazy value: realizing it copies it into a new layout."""
    return Lazy(value.dtype, value.device, tuple(value.layout.size), value.load)


def _trial_load(result: Any) -> ir.Value | None:
    """Build each lazy result's body once, so a lowering that cannot handle its inputs fails
    here (and falls back) rather than when a later op inlines it. Returns the body of a single
    lazy result (the reuse heuristic reads it)."""
    body = None
    for value in ir._flatten(result if isinstance(result, (list, tuple)) else [result]):
        if isinstance(value, Lazy):
            body = value.load([sympy.Symbol(f"q{i}", integer=True, nonnegative=True)
                               for i in range(value.ndim)])
    return body if isinstance(result, Lazy) else None


def _flat_outputs(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def _tensor_leaves(meta: Any, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    if isinstance(meta, torch.Tensor):
        return [(path, meta)]
    if isinstance(meta, (list, tuple)):
        out = []
        for i, m in enumerate(meta):
            out.extend(_tensor_leaves(m, path + (i,)))
        return out
    return []


def _rebuild(meta: Any, values: dict[tuple[int, ...], Any], path: tuple[int, ...]) -> Any:
    if isinstance(meta, torch.Tensor):
        return values[path]
    if isinstance(meta, (list, tuple)):
        return type(meta)(_rebuild(m, values, path + (i,)) for i, m in enumerate(meta))
    return meta


def _device_type(args: Any, kwargs: Any, meta: Any) -> str | None:
    if isinstance(meta, torch.Tensor):
        return meta.device.type
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, TensorValue):
            return a.device.type
    return None


def _unsupported_dtype(args: Any, kwargs: Any, meta: Any) -> torch.dtype | None:
    for v in ir._flatten(list(args) + list(kwargs.values())):
        if isinstance(v, TensorValue) and v.dtype not in SUPPORTED_DTYPES:
            return v.dtype
    for _, m in _tensor_leaves(meta):
        if m.dtype not in SUPPORTED_DTYPES:
            return m.dtype
    return None


def _aliased_inputs(op: Any, args: Sequence[Any]) -> tuple[str, ...]:
    """Buffers an op's outputs may alias (view ops without a lowering; any non-ATen call)."""
    schema = getattr(op, "_schema", None)
    if schema is not None and not any(r.alias_info is not None for r in schema.returns):
        return ()
    return tuple(a.name for a in ir._flatten(list(args)) if isinstance(a, ir.BufferRef))
