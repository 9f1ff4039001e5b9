"""Library calls over frozen weights (:mod:`coil.freezing`), packed once by the device's
backend: a 2-D convolution (``DeviceBackend.frozen_convolution``) or a linear layer's matrix
product (``DeviceBackend.frozen_linear``; SDK 1.5.0) whose weight and bias are frozen is
offered to the backend when the graph compiles, and the callable it returns replaces the op.

Why: a library that keeps weights in a layout of its own reorders them on every call; with
the weight frozen the reorder runs once. What each backend packs, and the measurements behind
it, are the backend's (the C++ plugin's are in its ``prepack`` module).

A 1x1 convolution (unstrided, unpadded, one group) over a channels-last input that the
backend declines as a convolution is offered again, to ``frozen_linear``, as the linear
layer it is over each pixel's channels: a backend may run a linear layer faster than its
convolution library runs the same product (the C++ plugin's figures are in its module)."""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
import torch.fx

from .constant_fold import ORIGIN, value_of
from .conv_fold import frozen_operands
from .conv_layout import describe
from .conv_matmul import from_pixel_rows, pixel_rows

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: Which backend method (``frozen_convolution``, ``frozen_linear``), for which device:
#: (method name, device) -> the bound method, or None.
Packers = Callable[[str, torch.device], Any]


class FrozenCall:
    """A call the backend made over its own packed weight: the graph calls it with the input
    alone. ``_schema`` says it returns a new tensor (no alias of its input) and mutates
    nothing, as the memory planner and the reports read an ATen op's schema."""

    _schema = torch._C.parse_schema("coil::frozen_call(Tensor input) -> Tensor")
    #: Reported as a library call by design, not as a fallback.
    coil_library = True

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], name: str, what: object) -> None:
        self.fn = fn
        self._op = fn  # what the wrapper calls (as it calls an OpOverload's bound C++ callable)
        self.__name__ = name
        self.what = what

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def __repr__(self) -> str:
        return f"{self.__name__}({self.what})"


def _offer(pack: Any, what: object, *args: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``pack(*args)``, or None where the backend raised (reported: the op stays the core's)."""
    try:
        return pack(*args)
    except Exception as exc:  # noqa: BLE001 - the library declined: the op stays as it was
        log.warning("coil: a backend could not pack a frozen weight for %s (%s: %s); the op "
                    "stays unpacked", what, type(exc).__name__, exc)
        return None


def _replace(graph: torch.fx.Graph, node: torch.fx.Node, x: torch.fx.Node, fn: Any, name: str,
             what: object, origin: frozenset[int]) -> None:
    with graph.inserting_before(node):
        new = graph.call_function(FrozenCall(fn, name, what), (x,))
    new.meta["val"] = node.meta["val"]
    new.meta[ORIGIN] = origin
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def _static(value: Any, dims: int) -> bool:
    return (isinstance(value, torch.Tensor) and value.dim() == dims
            and all(isinstance(s, int) for s in value.shape))


def prepack_convolutions(gm: torch.fx.GraphModule, packers: Packers) -> tuple[int, int]:
    """Offer each 2-D convolution over frozen operands to its device's backend and call what
    it returns instead; a 1x1 convolution it declines is offered again as a linear layer.
    Returns how many it took, and how many of those as linear layers."""
    graph = gm.graph
    taken = as_linear = 0
    for conv in list(graph.nodes):
        operands = frozen_operands(gm, conv)
        out = conv.meta.get("val")
        x = conv.args[0] if operands is not None else None
        if not isinstance(x, torch.fx.Node) or not _static(out, 4) or not _static(x.meta.get("val"), 4):
            continue
        pack = packers("frozen_convolution", out.device)
        if pack is None:
            continue
        weight, bias, origin = operands
        info = describe(conv, frozen=True)
        fn = _offer(pack, info, info, weight, bias)
        if fn is not None:
            _replace(graph, conv, x, fn, "coil.frozen_convolution", info, origin)
            taken += 1
        elif info.pointwise and x.meta["val"].is_contiguous(memory_format=torch.channels_last):
            linear = _as_linear(packers("frozen_linear", out.device), info, weight, bias)
            if linear is not None:
                _replace(graph, conv, x, linear, "coil.frozen_linear", f"{info} as a linear layer", origin)
                taken += 1
                as_linear += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return taken, as_linear


def _as_linear(pack: Any, info: Any, weight: torch.Tensor,
               bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A 1x1 convolution the backend did not take as one, offered as the linear layer it is
    (``frozen_linear`` over the pixels' channel vectors) where its input is channels-last:
    the call views the input as (pixels, channels) and returns the output channels-last."""
    if pack is None:
        return None
    n, c, h, w = info.input
    what = f"{info} as a linear layer"
    linear = _offer(pack, what, n * h * w, weight.reshape(info.weight[0], c), bias)
    if linear is None:
        return None

    def convolution(x: torch.Tensor) -> torch.Tensor:
        return from_pixel_rows(linear(pixel_rows(x)), info.input)

    return convolution


def prepack_linears(gm: torch.fx.GraphModule, packers: Packers) -> int:
    """Offer each matrix product of a 2-D input by a frozen, transposed 2-D weight (a linear
    layer: ``mm(x, w.t())``, ``addmm(bias, x, w.t())`` with a 1-D bias) to its device's backend
    and call what it returns instead; returns how many it took."""
    graph = gm.graph
    taken = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target is aten.mm.default and len(node.args) == 2:
            bias_node, (x, wt) = None, node.args
        elif node.target is aten.addmm.default and len(node.args) == 3:
            bias_node, x, wt = node.args
        else:
            continue
        weight_t = value_of(gm, wt)
        bias = value_of(gm, bias_node) if bias_node is not None else None
        out = node.meta.get("val")
        if (weight_t is None or weight_t.dim() != 2 or (bias_node is not None and bias is None)
                or not isinstance(x, torch.fx.Node) or not _static(x.meta.get("val"), 2) or not _static(out, 2)):
            continue
        weight = weight_t.t()  # (out features, in features), as a linear layer holds it
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
            continue
        pack = packers("frozen_linear", out.device)
        if pack is None:
            continue
        rows = int(x.meta["val"].shape[0])
        what = f"{rows}x{weight.shape[1]} by {weight.shape[1]}x{weight.shape[0]}, {weight.dtype}"
        fn = _offer(pack, what, rows, weight, bias)
        if fn is not None:
            origin = wt.meta[ORIGIN] | (bias_node.meta[ORIGIN] if bias_node is not None else frozenset())
            _replace(graph, node, x, fn, "coil.frozen_linear", what, origin)
            taken += 1
    graph.eliminate_dead_code()
    gm.recompile()
    return taken
