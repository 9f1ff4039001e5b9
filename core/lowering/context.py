"""The lowering context: what one graph's lowering has built so far (buffers, nodes, the
fallbacks it took), passed explicitly to every lowering function."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import sympy
import torch

from .. import ir, plugins
from ..config import Config
from ..errors import LoweringError
from ..ir import Expr, Layout
from ..sdk.versions import parse as parse_version
from .values import Lazy, Realized, TensorValue, to_sympy

if TYPE_CHECKING:
    from .random import RandomStreams


@dataclass
class FallbackRecord:
    op: str
    reason: str
    #: "fallback" | "library" | "template" (a library op a template computes) | "collective"
    kind: str


@dataclass
class LoweringContext:
    config: Config
    nodes: list[ir.Node] = field(default_factory=list)
    buffers: dict[str, ir.Buffer] = field(default_factory=dict)
    fallbacks: list[FallbackRecord] = field(default_factory=list)
    #: The ATen op being lowered (recorded as the origin of every node it creates).
    origin: str = ""
    #: The name of the op AOTAutograd decomposed into the one being lowered
    #: (``aten.native_layer_norm.default`` for a layer norm's ``var_mean``; the op itself
    #: where it was called as such; "None" where it does not say).
    decomposed_from: str = ""
    #: The FakeTensor (or structure) the current FX node produces in eager.
    out_meta: Any = None
    #: The graph's seeds and counters, once a random op is lowered (:mod:`.random`).
    random: "RandomStreams | None" = None
    _counter: int = 0
    #: (id of a lazy value, layout asked for) -> (the value, its buffer, position of the node
    #: that writes it): a value realized twice in one layout is written once.
    _realized: dict[tuple[int, Any], tuple[Any, Realized, int]] = field(default_factory=dict)

    def new_name(self, prefix: str = "buf") -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    def add_buffer(self, name: str, layout: Layout, storage: str | None = None,
                   storage_offset: Expr = sympy.Integer(0)) -> None:
        self.buffers[name] = ir.Buffer(name, layout, storage, storage_offset)

    def add_node(self, node: ir.Node) -> ir.Node:
        if not node.origins and self.origin:
            node.origins = (self.origin,)
        self.nodes.append(node)
        return node

    def realize(self, value: TensorValue, layout: Layout | None = None, *,
                view_ok: bool = False) -> Realized:
        """Write a lazy value into a new buffer (contiguous unless ``layout`` says otherwise).
        A view of a lazy value realizes its base and views that (the buffer keeps the base's
        loop structure) when no ``layout`` is asked for, or, with ``view_ok``, when the view
        has ``layout``'s strides; otherwise the view is copied into ``layout``."""
        if isinstance(value, Realized):
            return value
        assert isinstance(value, Lazy), value
        # no layout asked for means contiguous: one key for both ways of asking
        key = (id(value), layout if layout is not None else
               Layout(value.dtype, value.device, tuple(value.size), ir.contiguous_strides(value.size)))
        known = self._realized.get(key)
        # the node that wrote it may have gone with a lowering that fell back
        if known is not None and known[2] < len(self.nodes) and self.nodes[known[2]].name == known[1].name:
            return known[1]
        out = self._realize(value, layout, view_ok)
        # a new buffer's writer is the node just added (a view of a realized base has none)
        if self.nodes and self.nodes[-1].name == out.name:
            self._realized[key] = (value, out, len(self.nodes) - 1)
        return out

    def source(self, buffer: str) -> tuple[Lazy, Layout] | None:
        """The lazy value this graph wrote into ``buffer`` and the layout it wrote it in, if
        ``buffer`` is such a value's realization and its writer is still in the graph
        (simplifications read through a stored value to what it computes)."""
        for value, out, position in self._realized.values():
            if out.name == buffer and position < len(self.nodes) and self.nodes[position].name == buffer:
                return value, out.layout
        return None

    def _realize(self, value: Lazy, layout: Layout | None, view_ok: bool) -> Realized:
        if value.view_of is not None and (layout is None or view_ok):
            base, rebuild = value.view_of
            view = rebuild(self.realize(base))
            if isinstance(view, Realized) and (layout is None or same_strides(view.layout, layout)):
                return view
            if isinstance(view, Lazy):
                value = view
            else:  # a view of the realized base in other strides: copy it, reading memory
                value = Lazy(view.dtype, view.device, view.size, view.load, origins=value.origins)
        if layout is None or tuple(layout.size) != tuple(value.size) or layout.dtype != value.dtype:
            layout = Layout(value.dtype, value.device, tuple(value.size),
                            ir.contiguous_strides(value.size))
        name = self.new_name()
        ranges, idx = split_unit_dims(value.size)
        body = value.load(idx)
        self.add_buffer(name, layout)
        self.add_node(ir.PointwiseNode(
            name, layout=layout, ranges=ranges, body=body, store_index=layout.index(idx),
            origins=value.origins))
        return Realized(value.dtype, value.device, tuple(value.size), name, layout)


def split_unit_dims(size: Sequence[Expr], prefix: str = "x",
                    start: int = 0) -> tuple[tuple[Expr, ...], list[Expr]]:
    """Loop ranges without the size-1 dims, and one index per dim (0 for size-1 dims)."""
    ranges: list[Expr] = []
    idx: list[Expr] = []
    for n in size:
        if n == 1:
            idx.append(sympy.Integer(0))
        else:
            idx.append(sympy.Symbol(f"{prefix}{start + len(ranges)}", integer=True, nonnegative=True))
            ranges.append(n)
    return tuple(ranges), idx


def same_strides(a: Layout, b: Layout) -> bool:
    """Whether two layouts of one size address memory alike (size-1 dims' strides aside)."""
    return tuple(a.size) == tuple(b.size) and all(
        n == 1 or sympy.expand(sa - sb) == 0 for n, sa, sb in zip(a.size, a.stride, b.stride))


def layout_from_meta(meta: Any) -> Layout | None:
    """The eager layout of a FakeTensor, if it is dense (no overlap, no gaps)."""
    if not isinstance(meta, torch.Tensor):
        return None
    size = tuple(to_sympy(s) for s in meta.size())
    stride = tuple(to_sympy(s) for s in meta.stride())
    layout = Layout(meta.dtype, meta.device, size, stride, sympy.Integer(0))
    if not _is_dense(size, stride):
        return None
    return layout


def _is_dense(size: Sequence[Expr], stride: Sequence[Expr]) -> bool:
    """Whether the strides are a permutation of contiguous ones, symbolic strides included:
    from the innermost dim out, some dim's stride must equal the product of the sizes within.
    A stride's ``Max(1, n)`` (eager's channels-last strides of symbolic sizes) counts as ``n``:
    they differ only where a size is 0, and nothing is stored there."""
    dims = [(_at_least_one_dropped(st), n) for n, st in zip(size, stride) if n != 1]
    expected: Expr = sympy.Integer(1)
    while dims:
        for i, (st, n) in enumerate(dims):
            if sympy.expand(st - expected) == 0:
                break
        else:
            return False
        dims.pop(i)
        expected = expected * n
    return True


def _at_least_one_dropped(e: Expr) -> Expr:
    """``e`` with each ``Max(1, n)`` in it replaced by ``n``."""
    return sympy.sympify(e).replace(
        lambda a: isinstance(a, sympy.Max) and len(a.args) == 2 and sympy.Integer(1) in a.args,
        lambda a: next(x for x in a.args if x != 1))


def require_capability(device: torch.device, feature: str, op: str) -> None:
    """Raise ``LoweringError`` (so the op falls back to ATen) when the backend serving
    ``device`` declares it lacks ``feature`` (a boolean field of its ``Capabilities``, such
    as ``scans`` or ``scatter``). Devices with no backend are left to the scheduler."""
    if not capability(device, feature, True):
        raise LoweringError(op, f"the {device.type} backend declares {feature}=False")


def capability(device: torch.device, feature: str, default: Any, reg: Any = None) -> Any:
    """The value of ``feature`` in the ``Capabilities`` of the backend serving ``device`` (in
    ``reg``, else the process's registry); ``default`` where no backend serves it."""
    backend = (reg if reg is not None else plugins.registry()).backends.get(device.type)
    return default if backend is None else getattr(backend.capabilities, feature, default)


def require_api(device: torch.device, version: tuple[int, int, int], op: str) -> None:
    """Raise ``LoweringError`` when the plugin serving ``device`` declares an SDK version
    before ``version``: it was written before the core generated this op for it."""
    reg = plugins.registry()
    declared = reg.api_version(device.type) if device.type in reg.backends else None
    if declared is not None and parse_version(declared) < version:
        raise LoweringError(op, f"the {device.type} plugin declares SDK {declared} (this needs "
                                f"{'.'.join(map(str, version))})")
