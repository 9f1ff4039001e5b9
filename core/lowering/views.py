"""Lowerings of view ops as index remapping. A view of a realized buffer that strides can
express stays a ``Realized`` value over the same storage (no copy, and ATen can be handed
it directly); any other view becomes a ``Lazy`` value whose loads remap their indices."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from .. import ir
from ..errors import LoweringError
from ..ir import Expr, Layout
from ..symbolic import FloorDiv, ModIdx
from .context import LoweringContext
from .registry import lowering
from .values import Lazy, Realized, TensorValue, broadcast_to, lazy, to_sympy

aten = torch.ops.aten


def _same(a: Expr, b: Expr) -> bool:
    return sympy.expand(a - b) == 0


def _with_layout(v: Realized, size: Sequence[Expr], stride: Sequence[Expr], offset: Expr) -> Realized:
    layout = Layout(v.dtype, v.device, tuple(size), tuple(stride), offset)
    return Realized(v.dtype, v.device, tuple(size), v.name, layout)


def _remap(v: TensorValue, size: Sequence[Expr], index_map: Any,
           rebuild: Callable[[TensorValue], TensorValue] | None = None) -> TensorValue:
    out = lazy(v.dtype, v.device, size, lambda idx: v.load(index_map(idx)))
    if rebuild is not None and isinstance(v, Lazy):
        out.view_of = (v, rebuild)
        out.origins = v.origins
    return out


def permute(v: TensorValue, dims: Sequence[int]) -> TensorValue:
    nd = v.ndim
    dims = [d % nd for d in dims] if nd else []
    size = [v.size[d] for d in dims]
    if isinstance(v, Realized):
        return _with_layout(v, size, [v.layout.stride[d] for d in dims], v.layout.offset)

    def index_map(idx: list[Expr]) -> list[Expr]:
        src: list[Expr] = [sympy.Integer(0)] * nd
        for out_pos, d in enumerate(dims):
            src[d] = idx[out_pos]
        return src

    return _remap(v, size, index_map, lambda b: permute(b, dims))


def expand(v: TensorValue, size: Sequence[Any]) -> TensorValue:
    lead = len(size) - v.ndim
    new_size = [v.size[i - lead] if (s == -1 and i >= lead) else to_sympy(s) for i, s in enumerate(size)]
    if isinstance(v, Realized):
        stride = [sympy.Integer(0)] * lead + [
            sympy.Integer(0) if (v.size[j] == 1 and new_size[j + lead] != 1) else v.layout.stride[j]
            for j in range(v.ndim)]
        return _with_layout(v, new_size, stride, v.layout.offset)
    return broadcast_to(v, new_size)


def slice_dim(v: TensorValue, dim: int, start: Any, end: Any, step: Any, length: Expr | None = None) -> TensorValue:
    """``v[..., start:end:step, ...]`` along ``dim``; ``length``: the slice's length as the
    graph's metadata has it, where known. Under dynamic shapes Dynamo's guards may settle a
    length the bounds only spell symbolically: ``x[:, 1:2]`` of ``s`` columns is
    ``Min(2, s) - Min(1, s)`` here, 1 there (``s >= 2`` guarded); a size 1 must read as 1, or
    broadcasting and squeeze take the dim for a real one (found by a hunt)."""
    dim = dim % max(v.ndim, 1)
    n = v.size[dim]
    lo, hi = _clamp_bounds(n, start, end)
    step = to_sympy(step)  # a symbolic step (``x[::max(n // 3, 1)]``) in Coil's own functions
    if length is None:
        length = sympy.Max(0, FloorDiv(hi - lo + step - 1, step)) if not (hi - lo + step).is_number \
            else sympy.Integer(max(0, (int(hi - lo) + int(step) - 1) // int(step)))
    size = list(v.size)
    size[dim] = length
    if isinstance(v, Realized):
        stride = list(v.layout.stride)
        offset = v.layout.offset + lo * stride[dim]
        stride[dim] = stride[dim] * step
        return _with_layout(v, size, stride, offset)

    def index_map(idx: list[Expr]) -> list[Expr]:
        src = list(idx)
        src[dim] = lo + idx[dim] * step
        return src

    return _remap(v, size, index_map, lambda b: slice_dim(b, dim, start, end, step, length))


def _clamp_bounds(n: Expr, start: Any, end: Any) -> tuple[Expr, Expr]:
    """``start`` and ``end`` of a slice of a dim of size ``n`` as Python takes them: a negative
    bound counts from the end, and both are clamped to ``[0, n]``. Under dynamic shapes either
    may be symbolic: ``x[:10]`` of n rows is ``Min(10, n)`` rows, ``x[-10:]`` starts at
    ``Max(n - 10, 0)`` (unclamped, a slice longer than the tensor read memory before or past
    it: found by hunts against eager, sessions 30 and 31)."""
    def norm(x: Any, default: Expr) -> Expr:
        if x is None:
            return default
        e = to_sympy(x)
        if e.is_number and n.is_number:
            val, size = int(e), int(n)
            return sympy.Integer(min(max(val + size if val < 0 else val, 0), size))
        if e.is_number and int(e) >= 2**62:  # ``x[a:]`` traced with a huge end
            return n
        if e.is_negative:
            return sympy.Max(n + e, 0)
        if e.is_nonnegative:
            return sympy.Min(e, n)
        # unknown sign (``-(n // 3)`` is 0 for n < 3, and ``x[-0:]`` is all of x): ATen's slice
        raise LoweringError("aten.slice", f"a bound of unknown sign ({e})")

    return norm(start, sympy.Integer(0)), norm(end, n)


def select(v: TensorValue, dim: int, index: Any) -> TensorValue:
    dim = dim % v.ndim
    i = to_sympy(index)
    if i.is_negative:  # counts from the end, symbolic or not
        i = v.size[dim] + i
    elif not i.is_nonnegative:  # ``x[m - n]``: ATen's select wraps it at run time
        raise LoweringError("aten.select", f"an index of unknown sign ({i})")
    size = [n for d, n in enumerate(v.size) if d != dim]
    if isinstance(v, Realized):
        stride = [s for d, s in enumerate(v.layout.stride) if d != dim]
        return _with_layout(v, size, stride, v.layout.offset + i * v.layout.stride[dim])

    def index_map(idx: list[Expr]) -> list[Expr]:
        return list(idx[:dim]) + [i] + list(idx[dim:])

    return _remap(v, size, index_map, lambda b: select(b, dim, index))


def unsqueeze(v: TensorValue, dim: int) -> TensorValue:
    dim = dim % (v.ndim + 1)
    size = list(v.size[:dim]) + [sympy.Integer(1)] + list(v.size[dim:])
    if isinstance(v, Realized):
        st = v.layout.stride
        inner = st[dim] * v.size[dim] if dim < v.ndim else sympy.Integer(1)
        stride = list(st[:dim]) + [inner] + list(st[dim:])
        return _with_layout(v, size, stride, v.layout.offset)
    return _remap(v, size, lambda idx: list(idx[:dim]) + list(idx[dim + 1:]), lambda b: unsqueeze(b, dim))


def squeeze(v: TensorValue, dims: Sequence[int] | None) -> TensorValue:
    if dims is None:
        dims = list(range(v.ndim))
    drop = {d % max(v.ndim, 1) for d in dims if v.ndim and v.size[d % v.ndim] == 1}
    keep = [d for d in range(v.ndim) if d not in drop]
    size = [v.size[d] for d in keep]
    if isinstance(v, Realized):
        return _with_layout(v, size, [v.layout.stride[d] for d in keep], v.layout.offset)

    def index_map(idx: list[Expr]) -> list[Expr]:
        src: list[Expr] = [sympy.Integer(0)] * v.ndim
        for pos, d in enumerate(keep):
            src[d] = idx[pos]
        return src

    return _remap(v, size, index_map, lambda b: squeeze(b, dims))


def _groups(old: Sequence[Expr], new: Sequence[Expr]) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of old dims with runs of new dims of equal product (a reshape's structure)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        go, gn = [], []
        po: Expr = sympy.Integer(1)
        pn: Expr = sympy.Integer(1)
        if i < len(old):
            go.append(i); po = po * old[i]; i += 1
        if j < len(new):
            gn.append(j); pn = pn * new[j]; j += 1
        while not _same(po, pn):
            if _smaller(po, pn) and i < len(old):
                go.append(i); po = po * old[i]; i += 1
            elif j < len(new):
                gn.append(j); pn = pn * new[j]; j += 1
            elif i < len(old):
                go.append(i); po = po * old[i]; i += 1
            else:
                return None
        # absorb trailing size-1 dims into this group
        while i < len(old) and old[i] == 1 and (j >= len(new) or new[j] != 1):
            go.append(i); i += 1
        while j < len(new) and new[j] == 1 and (i >= len(old) or old[i] != 1):
            gn.append(j); j += 1
        groups.append((go, gn))
    return groups


def _smaller(a: Expr, b: Expr) -> bool:
    d = sympy.expand(b - a)
    if d.is_number:
        return bool(d > 0)
    # symbolic: a divides b with a factor left over
    q = sympy.cancel(b / a)
    return not q.is_number or q > 1


def _inferred(numel: Expr, known: Expr) -> Expr:
    """The size of a view's ``-1`` dim: ``numel / known`` where that cancels to a polynomial
    (``s0*s1 / s0``: ``s1``), else the exact integer quotient (``view(s0 // 2, 2, -1)`` of an
    [s0, s1] tensor: ``s0*s1 // (2*(s0 // 2))``, which is s1 wherever the view is valid, as
    eager and the guards check, but cancels to a fraction that no index can hold)."""
    q = sympy.cancel(numel / known)
    _, denominator = sympy.fraction(q)
    return q if denominator == 1 else FloorDiv(numel, known)


def reshape(v: TensorValue, shape: Sequence[Any]) -> TensorValue:
    new = [to_sympy(s) for s in shape]
    numel = ir.sympy_product(v.size)
    if any(s == -1 for s in new):
        known = ir.sympy_product([s for s in new if s != -1])
        new = [_inferred(numel, known) if s == -1 else s for s in new]
    if tuple(new) == tuple(v.size):
        return v
    groups = _groups(list(v.size), new)
    if groups is None:
        groups = [(list(range(v.ndim)), list(range(len(new))))]
    if isinstance(v, Realized):
        strides = _view_strides(v, groups, new)
        if strides is not None:
            return _with_layout(v, new, strides, v.layout.offset)
    old = list(v.size)

    def index_map(idx: list[Expr]) -> list[Expr]:
        src: list[Expr] = [sympy.Integer(0)] * len(old)
        for go, gn in groups:
            flat: Expr = sympy.Integer(0)
            for j in gn:
                flat = flat * new[j] + idx[j]
            for k, i in enumerate(go):
                if old[i] == 1:
                    continue
                q = _div_all(flat, old, go, i)
                first_live = all(old[p] == 1 for p in go[:k])
                src[i] = q if first_live else ModIdx(q, old[i])
        return src

    return _remap(v, new, index_map, lambda b: reshape(b, shape))


def _div_all(flat: Expr, old: Sequence[Expr], group: Sequence[int], dim: int) -> Expr:
    inner = ir.sympy_product([old[k] for k in group if k > dim])
    return FloorDiv(flat, inner) if inner != 1 else flat


def _view_strides(v: Realized, groups: list[tuple[list[int], list[int]]],
                  new: Sequence[Expr]) -> list[Expr] | None:
    st = v.layout.stride
    out: list[Expr] = [sympy.Integer(0)] * len(new)
    for go, gn in groups:
        live = [i for i in go if v.size[i] != 1]
        for a, b in zip(live, live[1:]):
            if not _same(st[a], st[b] * v.size[b]):
                return None
        base = st[live[-1]] if live else sympy.Integer(1)
        acc = base
        for j in reversed(gn):
            out[j] = acc
            acc = acc * new[j]
    return out


# ----------------------------------------------------------------------------- registrations


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(ctx: LoweringContext, x: TensorValue, shape: Sequence[Any]) -> TensorValue:
    return reshape(x, shape)


@lowering(aten.permute.default)
def _permute(ctx: LoweringContext, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    return permute(x, dims)


@lowering(aten.t.default)
def _t(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return permute(x, [1, 0]) if x.ndim == 2 else x


@lowering(aten.transpose.int)
def _transpose(ctx: LoweringContext, x: TensorValue, a: int, b: int) -> TensorValue:
    if x.ndim == 0:
        return x
    dims = list(range(x.ndim))
    a, b = a % x.ndim, b % x.ndim
    dims[a], dims[b] = dims[b], dims[a]
    return permute(x, dims)


@lowering(aten.expand.default)
def _expand(ctx: LoweringContext, x: TensorValue, size: Sequence[Any], *, implicit: bool = False) -> TensorValue:
    return expand(x, size)


@lowering(aten.slice.Tensor)
def _slice(ctx: LoweringContext, x: TensorValue, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> TensorValue:
    meta = ctx.out_meta
    length = to_sympy(meta.shape[dim]) if isinstance(meta, torch.Tensor) and meta.dim() == x.ndim else None
    return slice_dim(x, dim, start, end, step, length)


@lowering(aten.select.int)
def _select(ctx: LoweringContext, x: TensorValue, dim: int, index: Any) -> TensorValue:
    return select(x, dim, index)


@lowering(aten.unsqueeze.default)
def _unsqueeze(ctx: LoweringContext, x: TensorValue, dim: int) -> TensorValue:
    return unsqueeze(x, dim)


@lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(ctx: LoweringContext, x: TensorValue, dim: Any = None) -> TensorValue:
    if isinstance(dim, int):
        dim = [dim]
    return squeeze(x, dim)


@lowering(aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default)
def _alias(ctx: LoweringContext, x: TensorValue) -> TensorValue:
    return x


@lowering(aten.as_strided.default)
def _as_strided(ctx: LoweringContext, x: TensorValue, size: Sequence[Any], stride: Sequence[Any],
                storage_offset: Any = None) -> TensorValue:
    buf = ctx.buffers.get(x.name) if isinstance(x, Realized) else None
    if buf is None:
        raise LoweringError(ctx.origin, "as_strided of a value that is not a buffer")
    # as_strided counts from the storage's start; loads count from the buffer's data pointer
    offset = to_sympy(storage_offset) - buf.storage_offset if storage_offset is not None else x.layout.offset
    return _with_layout(x, [to_sympy(s) for s in size], [to_sympy(s) for s in stride], offset)


@lowering(aten.diagonal.default)
def _diagonal(ctx: LoweringContext, x: TensorValue, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorValue:
    if not isinstance(x, Realized):
        raise LoweringError(ctx.origin, "diagonal of a lazy value")
    nd = x.ndim
    d1, d2 = dim1 % nd, dim2 % nd
    n1, n2 = x.size[d1], x.size[d2]
    if not (n1.is_number and n2.is_number):
        raise LoweringError(ctx.origin, "diagonal with symbolic sizes")
    n1, n2 = int(n1), int(n2)
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    st = x.layout.stride
    base = x.layout.offset + (offset * st[d2] if offset >= 0 else -offset * st[d1]) if length else x.layout.offset
    keep = [d for d in range(nd) if d not in (d1, d2)]
    size = [x.size[d] for d in keep] + [sympy.Integer(length)]
    stride = [st[d] for d in keep] + [st[d1] + st[d2]]
    return _with_layout(x, size, stride, base)


@lowering(aten.split_with_sizes.default, aten.split.Tensor)
def _split(ctx: LoweringContext, x: TensorValue, sizes: Any, dim: int = 0) -> list[TensorValue]:
    dim = dim % x.ndim
    n = x.size[dim]
    if isinstance(sizes, (int, torch.SymInt)):
        chunk = to_sympy(sizes)
        if not n.is_number or not chunk.is_number:
            raise LoweringError(ctx.origin, "split of a symbolic size")
        sizes = [min(int(chunk), int(n) - s) for s in range(0, int(n), int(chunk))] or [0]
    out: list[TensorValue] = []
    start: Expr = sympy.Integer(0)
    for s in sizes:
        end = start + to_sympy(s)
        out.append(slice_dim(x, dim, start, end, 1))
        start = end
    return out


@lowering(aten.unbind.int)
def _unbind(ctx: LoweringContext, x: TensorValue, dim: int = 0) -> list[TensorValue]:
    dim = dim % x.ndim
    if not x.size[dim].is_number:
        raise LoweringError(ctx.origin, "unbind of a symbolic size")
    return [select(x, dim, i) for i in range(int(x.size[dim]))]


@lowering(aten.flip.default)
def _flip(ctx: LoweringContext, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    flipped = {d % x.ndim for d in dims} if x.ndim else set()

    def index_map(idx: list[Expr]) -> list[Expr]:
        return [x.size[d] - 1 - i if d in flipped else i for d, i in enumerate(idx)]

    return _remap(x, x.size, index_map)


@lowering(aten.repeat.default)
def _repeat(ctx: LoweringContext, x: TensorValue, repeats: Sequence[Any]) -> TensorValue:
    reps = [to_sympy(r) for r in repeats]
    lead = len(reps) - x.ndim
    size = [r * (x.size[d - lead] if d >= lead else 1) for d, r in enumerate(reps)]

    def index_map(idx: list[Expr]) -> list[Expr]:
        return [ModIdx(idx[d + lead], x.size[d]) for d in range(x.ndim)]

    return _remap(x, size, index_map)
