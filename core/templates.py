"""Matrix products offered to templates (:mod:`coil.sdk.templates`).

Graph lowering calls ``mm``, ``bmm`` and ``addmm`` as library ops. For a device whose
backend speaks a template dialect, :func:`offer` turns such a call into a
:class:`~coil.ir.TemplateNode` that keeps the library call beside it: the scheduler fuses
the pointwise consumers into the template as its epilogue, and runs the library call
instead where nothing fuses (:func:`coil.scheduler`). Whether a fused product then runs as
the template or as the library plus the epilogue in a kernel of its own is measured by the
backend on the first launch (``TemplateCall.measure``) where it tunes, else decided by the
template's :meth:`~coil.sdk.templates.Template.prefer`.

Only exact cases are offered: static sizes, no size-1 dim in the output (its loops would
not match the consumers'), operand dtypes equal, numeric ``alpha``/``beta``, and whatever the
template itself refuses (:meth:`~coil.sdk.templates.Template.supports`)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import sympy
import torch

from . import ir
from .sdk.templates import GemmProblem, Operand

log = logging.getLogger(__name__)
aten = torch.ops.aten

#: Library ops a template may compute, and the product each one is.
TEMPLATE_OPS = {aten.mm.default: "mm", aten.bmm.default: "bmm", aten.addmm.default: "mm"}


@dataclass(frozen=True)
class TemplateOffer:
    """The templates a device's backend takes and how their use is decided (``mode`` is
    the ``templates`` knob; ``tunes``: the backend measures on first launch)."""

    templates: tuple[Any, ...]
    mode: str
    tunes: bool


def offers(registry: Any, mode: str) -> dict[str, TemplateOffer]:
    """Device type -> the templates its backend speaks the dialect of (none with ``off``)."""
    if mode == "off":
        return {}
    out: dict[str, TemplateOffer] = {}
    for device_type, backend in registry.backends.items():
        caps = backend.capabilities
        dialects = getattr(caps, "template_dialects", frozenset())
        chosen = tuple(t for t in registry.templates if t.dialect in dialects)
        if chosen:
            out[device_type] = TemplateOffer(chosen, mode, bool(getattr(caps, "autotune", False)))
    return out


def offer(extern: ir.ExternNode, offered: TemplateOffer) -> ir.TemplateNode | None:
    """``extern`` (an ``mm``/``bmm``/``addmm`` library call) as a template node, or None
    when no template computes it exactly or the heuristic declines it."""
    op = TEMPLATE_OPS.get(extern.op)
    if op is None or len(extern.output_layouts) != 1 or extern.output_layouts[0] is None:
        return None
    out = extern.output_layouts[0]
    bias, alpha, beta = None, 1.0, 1.0
    args = list(extern.args)
    if extern.op is aten.addmm.default:
        if len(args) != 3 or set(extern.kwargs) - {"alpha", "beta"}:
            return None
        alpha, beta = extern.kwargs.get("alpha", 1), extern.kwargs.get("beta", 1)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, beta)):
            return None
        if alpha == 0:  # the library skips the product (an inf in it times 0 would be NaN)
            return None
        bias = _broadcast(args.pop(0), out) if beta != 0 else None
        if beta != 0 and bias is None:
            return None
        args = args[:2]
    elif extern.kwargs:
        return None
    if len(args) != 2 or not all(isinstance(a, ir.BufferRef) for a in args):
        return None
    a, b = args
    if not _static(out.size) or any(int(n) == 1 for n in out.size) or a.layout.dtype != b.layout.dtype:
        return None
    if bias is not None and bias.layout.dtype != out.dtype:
        return None
    problem = GemmProblem(op, _operand(a), _operand(b), out.dtype, out.device.type)
    for template in offered.templates:
        if op not in template.ops:
            continue
        reason = template.supports(problem)
        if reason is not None:
            log.debug("template %s declines %s: %s", template.name, extern.name, reason)
            continue
        measure = offered.mode in ("auto", "tune") and offered.tunes
        asks = offered.mode != "force" and not (offered.mode == "tune" and measure)
        if asks and not template.prefer(problem):  # "tune" on a backend that tunes measures all
            log.debug("template %s prefers the library for %s", template.name, extern.name)
            return None
        ranges = tuple(out.size)
        xs = ir.node_ranges_vars(ranges)
        return ir.TemplateNode(
            extern.name, layout=out, ranges=ranges, store_index=out.index(xs), op=op, a=a, b=b,
            template=template, library=extern, bias=bias, alpha=float(alpha), beta=float(beta),
            measure=measure, force=offered.mode == "force", origins=extern.origins)
    return None


def problem_of(node: ir.TemplateNode, storage: Any = None) -> GemmProblem:
    """The node's product with operands named by their storage buffers (``storage``: name ->
    the buffer whose memory it is)."""
    name = storage or (lambda n: n)
    a = _operand(node.a)
    b = _operand(node.b)
    return GemmProblem(node.op, Operand(name(a.name), a.dtype, a.size, a.stride, a.offset),  # type: ignore[arg-type]
                       Operand(name(b.name), b.dtype, b.size, b.stride, b.offset),
                       node.layout.dtype, node.layout.device.type)


def bias_operand(node: ir.TemplateNode, storage: Any = None) -> Operand | None:
    if node.bias is None:
        return None
    name = storage or (lambda n: n)
    op = _operand(node.bias)
    return Operand(name(op.name), op.dtype, op.size, op.stride, op.offset)


def _operand(ref: ir.BufferRef) -> Operand:
    lay = ref.layout
    return Operand(ref.name, lay.dtype, tuple(lay.size), tuple(lay.stride), lay.offset)


def _static(sizes: Sequence[Any]) -> bool:
    return all(sympy.sympify(s).is_number for s in sizes)


def _broadcast(ref: Any, out: ir.Layout) -> ir.BufferRef | None:
    """``ref`` seen with ``out``'s sizes (broadcast dims get stride 0), or None."""
    if not isinstance(ref, ir.BufferRef) or not _static(ref.layout.size) or not _static(out.size):
        return None  # symbolic sizes: compared as ints below
    size, stride = list(ref.layout.size), list(ref.layout.stride)
    if len(size) > len(out.size):
        return None
    size = [sympy.Integer(1)] * (len(out.size) - len(size)) + size
    stride = [sympy.Integer(0)] * (len(out.size) - len(stride)) + stride
    new_stride = []
    for n, s, target in zip(size, stride, out.size):
        if int(n) == int(target):
            new_stride.append(s)
        elif int(n) == 1:
            new_stride.append(sympy.Integer(0))
        else:
            return None
    layout = ir.Layout(ref.layout.dtype, ref.layout.device, tuple(out.size), tuple(new_stride), ref.layout.offset)
    return ir.BufferRef(ref.name, layout)


__all__ = ["TEMPLATE_OPS", "TemplateOffer", "offers", "offer", "problem_of", "bias_operand"]
