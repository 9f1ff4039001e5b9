"""Max-pool indices saved for the backward as one byte per output, not eight.

A training graph saves ``max_pool2d_with_indices``'s int64 indices (``h * W + w``) for the
backward: on ResNet-18 (64x64x56x56) that is 98 MiB live from the forward to the backward,
and it made Coil's training step peak above Inductor's. Every index is a tap of its own
window, so the tap's number in the window (``i * kw + j``, below 128 for any window Coil
unrolls) holds the same information. Before AOTAutograd partitions the joint graph,
:func:`narrow_saved_indices` replaces each such pooling whose indices only feed its backward
with two ops of Coil's own, so the partitioner saves the int8 offsets:

- ``coil::max_pool2d_offsets(x, kernel_size, stride, padding, ceil_mode) -> (values, offsets)``
- ``coil::max_pool2d_offsets_backward(grad, x, kernel_size, stride, padding, ceil_mode,
  offsets) -> grad_input``, and where the input's sizes are static
  ``coil::max_pool2d_offsets_backward_sized(grad, offsets, input_size, input_stride,
  kernel_size, stride, padding, ceil_mode)``, which does not hold the input

Both mean exactly what the ATen pair means (undilated windows only); their eager
implementations call the ATen ops and convert, so a graph that falls back to ATen for either
computes eager's result. Coil lowers them in :mod:`coil.lowering.pool_offsets`."""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
from torch import fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten

#: Most taps of a window whose number fits the int8 offset.
MAX_TAPS = 127


def _window_base(n: int, stride: int, pad: int, dims: int, axis: int, device: torch.device) -> torch.Tensor:
    """Each output position's first tap along ``axis`` (-2 rows, -1 columns), shaped to
    broadcast against a pooling's output of ``dims`` dims."""
    shape = [1] * dims
    shape[axis] = n
    return (torch.arange(n, device=device) * stride - pad).view(shape)


def indices_to_offsets(indices: torch.Tensor, kernel_size: list[int], stride: list[int],
                       padding: list[int], width: int) -> torch.Tensor:
    rows = _window_base(indices.shape[-2], stride[0], padding[0], indices.dim(), -2, indices.device)
    cols = _window_base(indices.shape[-1], stride[1], padding[1], indices.dim(), -1, indices.device)
    out = torch.empty_like(indices, dtype=torch.int8)  # the indices' layout, as the fake's
    out.copy_((indices // width - rows) * kernel_size[1] + (indices % width - cols))
    return out


def offsets_to_indices(offsets: torch.Tensor, kernel_size: list[int], stride: list[int],
                       padding: list[int], width: int) -> torch.Tensor:
    rows = _window_base(offsets.shape[-2], stride[0], padding[0], offsets.dim(), -2, offsets.device)
    cols = _window_base(offsets.shape[-1], stride[1], padding[1], offsets.dim(), -1, offsets.device)
    taps = offsets.to(torch.int64)
    out = torch.empty_like(offsets, dtype=torch.int64)
    out.copy_((rows + taps // kernel_size[1]) * width + cols + taps % kernel_size[1])
    return out


@torch.library.custom_op("coil::max_pool2d_offsets", mutates_args=())
def max_pool2d_offsets(x: torch.Tensor, kernel_size: list[int], stride: list[int],
                       padding: list[int], ceil_mode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = aten.max_pool2d_with_indices(x, kernel_size, stride, padding, [1, 1], ceil_mode)
    return values, indices_to_offsets(indices, kernel_size, stride, padding, x.shape[-1])


@max_pool2d_offsets.register_fake
def _(x: torch.Tensor, kernel_size: list[int], stride: list[int], padding: list[int],
      ceil_mode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = aten.max_pool2d_with_indices(x, kernel_size, stride, padding, [1, 1], ceil_mode)
    return values, torch.empty_like(indices, dtype=torch.int8)


@torch.library.custom_op("coil::max_pool2d_offsets_backward", mutates_args=())
def max_pool2d_offsets_backward(grad: torch.Tensor, x: torch.Tensor, kernel_size: list[int],
                                stride: list[int], padding: list[int], ceil_mode: bool,
                                offsets: torch.Tensor) -> torch.Tensor:
    indices = offsets_to_indices(offsets, kernel_size, stride, padding, x.shape[-1])
    return aten.max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, [1, 1], ceil_mode, indices)


@max_pool2d_offsets_backward.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, kernel_size: list[int], stride: list[int],
      padding: list[int], ceil_mode: bool, offsets: torch.Tensor) -> torch.Tensor:
    indices = torch.empty_like(offsets, dtype=torch.int64)
    return aten.max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, [1, 1], ceil_mode, indices)


@torch.library.custom_op("coil::max_pool2d_offsets_backward_sized", mutates_args=())
def max_pool2d_offsets_backward_sized(grad: torch.Tensor, offsets: torch.Tensor, input_size: list[int],
                                      input_stride: list[int], kernel_size: list[int], stride: list[int],
                                      padding: list[int], ceil_mode: bool) -> torch.Tensor:
    """``max_pool2d_offsets_backward`` given the input's size and strides instead of the input,
    which the gradient does not read: a backward that takes the input keeps it alive (the
    partitioner saves it, or cannot recompute it), and ResNet's stem saved its ReLU output
    for this alone (12 MiB at batch 8) where Inductor recomputes it."""
    x = grad.new_empty_strided(input_size, input_stride)
    return max_pool2d_offsets_backward(grad, x, kernel_size, stride, padding, ceil_mode, offsets)


@max_pool2d_offsets_backward_sized.register_fake
def _(grad: torch.Tensor, offsets: torch.Tensor, input_size: list[int], input_stride: list[int],
      kernel_size: list[int], stride: list[int], padding: list[int], ceil_mode: bool) -> torch.Tensor:
    x = grad.new_empty_strided(input_size, input_stride)
    indices = torch.empty_like(offsets, dtype=torch.int64)
    return aten.max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, [1, 1], ceil_mode, indices)


# ----------------------------------------------------------------------------- the joint-graph pass


def _pooling_args(args: Sequence[Any], kw: dict[str, Any]) -> tuple[Any, ...] | None:
    """``(x, kernel, stride, padding, ceil_mode)`` of an undilated 2-D max pool (its
    ``max_pool2d_with_indices`` arguments) whose tap numbers fit the offsets, with lists of
    two ints; None otherwise."""
    x, kernel, stride, padding, dilation, ceil_mode = (list(args) + [None] * 6)[:6]
    stride = kw.get("stride", stride) or kernel  # [] means the kernel's
    padding = kw.get("padding", padding) or 0
    dilation = kw.get("dilation", dilation) or 1
    ceil_mode = bool(kw.get("ceil_mode", ceil_mode))

    def pair(v: Any) -> list[int] | None:
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        v = v * 2 if len(v) == 1 else v
        return v if len(v) == 2 and all(type(i) is int for i in v) else None

    kernel, stride, padding, dilation = pair(kernel), pair(stride), pair(padding), pair(dilation)
    if None in (kernel, stride, padding) or dilation != [1, 1] or kernel[0] * kernel[1] > MAX_TAPS:
        return None
    return x, kernel, stride, padding, ceil_mode


def narrow_saved_indices(gm: fx.GraphModule) -> int:
    """Rewrite every max pool of the joint graph ``gm`` whose indices feed only its own
    backward to Coil's offset ops; returns how many were rewritten."""
    graph, done = gm.graph, 0
    for node in list(graph.nodes):
        if node.target is not aten.max_pool2d_with_indices.default:
            continue
        args = _pooling_args(node.args, dict(node.kwargs))
        users = list(node.users)
        if args is None or any(u.target is not operator.getitem for u in users):
            continue
        by_index = {u.args[1]: u for u in users}
        indices = by_index.get(1)
        if indices is None or len(by_index) != len(users):
            continue
        backwards = list(indices.users)
        if not backwards or not all(_is_own_backward(b, indices, args) for b in backwards):
            continue
        x, kernel, stride, padding, ceil_mode = args
        fake = detect_fake_mode([x.meta.get("val")])
        if fake is None:
            continue
        with graph.inserting_after(node):
            pooled = graph.call_function(torch.ops.coil.max_pool2d_offsets.default, (x, kernel, stride, padding, ceil_mode))
        with fake:
            pooled.meta["val"] = torch.ops.coil.max_pool2d_offsets.default(x.meta["val"], kernel, stride, padding, ceil_mode)
        _copy_meta(node, pooled)
        with graph.inserting_after(pooled):
            offsets = graph.call_function(operator.getitem, (pooled, 1))
            values = graph.call_function(operator.getitem, (pooled, 0))
        _copy_meta(by_index.get(0, indices), values)
        _copy_meta(indices, offsets)
        values.meta["val"], offsets.meta["val"] = pooled.meta["val"]
        for b in backwards:
            op, op_args = _backward_call(b.args[0], x, kernel, stride, padding, ceil_mode, offsets)
            with graph.inserting_after(b):
                new = graph.call_function(op, op_args)
            with fake:
                new.meta["val"] = op(*(a.meta["val"] if isinstance(a, fx.Node) else a for a in op_args))
            _copy_meta(b, new)
            b.replace_all_uses_with(new)
            graph.erase_node(b)
        if 0 in by_index:
            by_index[0].replace_all_uses_with(values)
            graph.erase_node(by_index[0])
        graph.erase_node(indices)
        graph.erase_node(node)
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done


def _backward_call(grad: fx.Node, x: fx.Node, kernel: list[int], stride: list[int], padding: list[int],
                   ceil_mode: bool, offsets: fx.Node) -> tuple[Any, tuple[Any, ...]]:
    """The offset backward's op and arguments: with the input's size and strides where they
    are plain ints (so the backward does not hold the input), with the input otherwise."""
    val = x.meta.get("val")
    if isinstance(val, torch.Tensor) and all(type(v) is int for v in (*val.shape, *val.stride())):
        return (torch.ops.coil.max_pool2d_offsets_backward_sized.default,
                (grad, offsets, list(val.shape), list(val.stride()), kernel, stride, padding, ceil_mode))
    return (torch.ops.coil.max_pool2d_offsets_backward.default,
            (grad, x, kernel, stride, padding, ceil_mode, offsets))


def _is_own_backward(b: fx.Node, indices: fx.Node, args: tuple[Any, ...]) -> bool:
    """Whether ``b`` is the ``max_pool2d_with_indices_backward`` of the pooling with ``args``
    and ``indices``: its input, its window, its indices (and nothing else of them)."""
    if b.target is not aten.max_pool2d_with_indices_backward.default or b.kwargs or len(b.args) != 8:
        return False
    if b.args[7] is not indices or b.args[1] is not args[0] or any(a is indices for a in b.args[:7]):
        return False
    return _pooling_args(b.args[1:7], {}) == args


def _copy_meta(old: fx.Node, new: fx.Node) -> None:
    """Carry what the partitioner and Coil read from node meta (stack trace, sequence number,
    tags), except the value, which the new op computes."""
    for key, value in old.meta.items():
        if key not in ("val", "tensor_meta") and key not in new.meta:
            new.meta[key] = value
