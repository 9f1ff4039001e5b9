"""Random ops as kernel IR: ``rand``, ``randn`` (and their ``_like`` forms), ``bernoulli``,
``native_dropout`` and the functional forms of ``uniform_`` and ``normal_`` become pointwise
bodies over the catalogue's counter-based ops ``rand(seed, counter)`` and
``randn(seed, counter)`` (Philox4x32-10, :mod:`coil.ops`; ``coil.sdk.reference`` is the exact
definition), so they fuse with their neighbours like any other pointwise op instead of
splitting a fused region.

Streams. A compiled graph draws one int64 seed per device per call, with one small ATen call
(``randint`` on that device's default generator: reproducible under ``torch.manual_seed``,
different on every call), into a 0-d buffer that kernels read like any other input. Every
random op of the graph owns its own range of counters: its elements' row-major linear index
plus an offset, the number of random elements claimed before it in the graph. A random
value is thus a pure function of (seed, counter): recomputed by another kernel, or by both
outputs of ``native_dropout``, it has the same bits.

The seed is a tensor rather than a Python int so that drawing it never waits for the device
(``.item()`` on a GPU synchronises; a replayed CUDA graph draws it afresh), and so that it
travels through the kernel argument model that exists (buffers and size ints) with no new
argument kind in the SDK.

Where generating would not be what eager means, the op keeps its ATen fallback
(``LoweringError``): an explicit ``generator``, a float64 ``rand``/``randn`` (eager draws 53
bits, the Philox uniform has 24), a probability outside [0, 1] (eager raises), a symbolic
probability, or a backend whose ``Capabilities.random`` is False."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import sympy
import torch

from .. import ir
from ..errors import LoweringError
from ..ir import Expr
from ..ops import SEED_HIGH, SEED_LOW
from .context import LoweringContext, require_capability
from .misc import copy_of
from .pointwise import check_dtype, compute_dtype
from .registry import lowering
from .values import TensorValue, broadcast_to, cast, const, lazy, to_sympy

aten = torch.ops.aten

#: dtypes ``rand``/``randn`` generate; float64 falls back (eager draws 53 bits for it).
GENERATED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Bits of a uniform number a half type holds exactly in [0, 1) (its significand).
_HALF_UNIFORM_BITS = {torch.float16: 11, torch.bfloat16: 8}

Body = Callable[[list[Expr]], ir.Value]


@dataclass
class RandomStreams:
    """One graph's random state while it is lowered: the node drawing each device's seed,
    and the first counter not yet claimed by a random op."""

    seeds: dict[torch.device, ir.ExternNode] = field(default_factory=dict)
    next_counter: Expr = sympy.Integer(0)


def _streams(ctx: LoweringContext) -> RandomStreams:
    if ctx.random is None:
        ctx.random = RandomStreams()
    return ctx.random


def _seed(ctx: LoweringContext, device: torch.device) -> ir.Value:
    """The graph's seed on ``device`` (drawn once per call), as a value kernels load."""
    streams = _streams(ctx)
    node = streams.seeds.get(device)
    # a lowering that fell back after drawing took its nodes with it: draw again
    if node is None or not any(n is node for n in ctx.nodes):
        name = ctx.new_name()
        layout = ir.Layout(torch.int64, device, (), ())
        ctx.add_buffer(name, layout)
        node = ir.ExternNode(
            name, op=aten.randint.low, args=(SEED_LOW, SEED_HIGH, []),
            kwargs={"dtype": torch.int64, "device": device}, output_names=(name,),
            output_layouts=(layout,), output_paths=((),), kind="library")
        ctx.add_node(node)
        streams.seeds[device] = node
    return ir.Load(torch.int64, buffer=node.name, index=sympy.Integer(0))


def _counters(ctx: LoweringContext, size: Sequence[Expr]) -> Body:
    """Claim one counter per element of ``size``: the element's row-major linear index plus
    the graph's running offset."""
    streams = _streams(ctx)
    base = streams.next_counter
    streams.next_counter = base + ir.sympy_product(size)
    strides = ir.contiguous_strides(size)

    def counter(idx: list[Expr]) -> ir.Value:
        linear = sum((i * s for i, s in zip(idx, strides)), sympy.Integer(0))
        return ir.IndexValue(torch.int64, expr=base + linear)

    return counter


def draws(ctx: LoweringContext, kind: str, device: torch.device, size: Sequence[Expr]) -> Body:
    """A fresh stream of float32 numbers over ``size``: ``kind`` "rand" (uniform in [0, 1))
    or "randn" (standard normal). Call it after every check that may still fall back."""
    require_capability(device, "random", ctx.origin)
    seed = _seed(ctx, device)
    counter = _counters(ctx, size)
    return lambda idx: ir.Op(torch.float32, name=kind, args=(seed, counter(idx)))


def _meta(ctx: LoweringContext) -> torch.Tensor:
    if not isinstance(ctx.out_meta, torch.Tensor):
        raise LoweringError(ctx.origin, "no tensor result")
    return ctx.out_meta


def _size(meta: torch.Tensor) -> tuple[Expr, ...]:
    return tuple(to_sympy(s) for s in meta.size())


def _no_generator(ctx: LoweringContext, generator: Any) -> None:
    if generator is not None:
        raise LoweringError(ctx.origin, "an explicit generator: its own stream is ATen's to draw")


def _probability(ctx: LoweringContext, p: Any) -> float:
    """``p`` as a float in [0, 1]; anything else falls back (eager raises, or decides at run
    time)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise LoweringError(ctx.origin, f"probability {p!r} is not a constant number")
    if not 0.0 <= float(p) <= 1.0:
        raise LoweringError(ctx.origin, f"probability {p} outside [0, 1]: eager raises")
    return float(p)


def _generated_dtype(ctx: LoweringContext, dtype: torch.dtype) -> None:
    if dtype not in GENERATED_DTYPES:
        raise LoweringError(ctx.origin, f"random {dtype} is drawn by ATen (Coil generates "
                                        f"{', '.join(map(str, GENERATED_DTYPES))})")


def _uniform_as(u: ir.Value, dtype: torch.dtype) -> ir.Value:
    """A float32 uniform in [0, 1) as ``dtype``, still below 1: a half type keeps the top bits
    it holds exactly (rounding 0.99999994 to bfloat16 would give 1)."""
    bits = _HALF_UNIFORM_BITS.get(dtype)
    if bits is None:
        return cast(u, dtype)
    f32 = torch.float32
    spread = ir.Op(f32, name="mul", args=(u, const(2.0 ** bits, f32)))
    scaled = ir.Op(f32, name="floor", args=(spread,))
    return cast(ir.Op(f32, name="mul", args=(scaled, const(2.0 ** -bits, f32))), dtype)


@lowering(aten.rand.default, aten.rand_like.default)
def _rand(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    meta = _meta(ctx)
    _generated_dtype(ctx, meta.dtype)
    size = _size(meta)
    draw = draws(ctx, "rand", meta.device, size)
    return lazy(meta.dtype, meta.device, size, lambda idx: _uniform_as(draw(idx), meta.dtype))


@lowering(aten.randn.default, aten.randn_like.default)
def _randn(ctx: LoweringContext, *args: Any, **kwargs: Any) -> TensorValue:
    meta = _meta(ctx)
    _generated_dtype(ctx, meta.dtype)
    size = _size(meta)
    draw = draws(ctx, "randn", meta.device, size)
    return lazy(meta.dtype, meta.device, size, lambda idx: cast(draw(idx), meta.dtype))


@lowering(aten.uniform.default)
def _uniform(ctx: LoweringContext, x: TensorValue, low: Any = 0.0, high: Any = 1.0, *,
             generator: Any = None) -> TensorValue:
    """``Tensor.uniform_(low, high)``, functionalized: ``low + (high - low) * u`` in float32;
    a value that rounds to ``high`` in ``x``'s dtype becomes ``low``, as eager's kernels make
    it (the range is ``[low, high)``). Bounds eager refuses (reversed, not finite, outside
    the dtype's range, a width beyond its largest number) stay with ATen, which raises."""
    _no_generator(ctx, generator)
    _generated_dtype(ctx, x.dtype)
    lo, hi = _number(ctx, low), _number(ctx, high)
    largest = torch.finfo(x.dtype).max
    if not (-largest <= lo <= hi <= largest and hi - lo <= largest):
        raise LoweringError(ctx.origin, f"uniform_({lo}, {hi}) on {x.dtype}: eager raises")
    drawn = _affine_draw(ctx, x, "rand", hi - lo, lo)
    top, bottom = const(hi, x.dtype), const(lo, x.dtype)

    def fn(idx: list[Expr]) -> ir.Value:
        v = drawn.load(idx)
        return ir.Op(x.dtype, name="where", args=(ir.Op(torch.bool, name="eq", args=(v, top)), bottom, v))

    return lazy(x.dtype, x.device, x.size, fn)


@lowering(aten.normal_functional.default)
def _normal(ctx: LoweringContext, x: TensorValue, mean: Any = 0.0, std: Any = 1.0, *,
            generator: Any = None) -> TensorValue:
    """``Tensor.normal_(mean, std)``, functionalized: ``mean + std * z`` in float32."""
    _no_generator(ctx, generator)
    _generated_dtype(ctx, x.dtype)
    if float(_number(ctx, std)) < 0:
        raise LoweringError(ctx.origin, f"std {std} < 0: eager raises")
    return _affine_draw(ctx, x, "randn", std, mean)


def _affine_draw(ctx: LoweringContext, x: TensorValue, op: str, scale: Any, shift: Any) -> TensorValue:
    """``shift + scale * draw`` in float32, in ``x``'s dtype and size (``op``: rand or randn)."""
    draw = draws(ctx, op, x.device, x.size)
    f32 = torch.float32

    def fn(idx: list[Expr]) -> ir.Value:
        scaled = ir.Op(f32, name="mul", args=(draw(idx), const(scale, f32)))
        return cast(ir.Op(f32, name="add", args=(scaled, const(shift, f32))), x.dtype)

    return lazy(x.dtype, x.device, x.size, fn)


def _number(ctx: LoweringContext, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LoweringError(ctx.origin, f"{value!r} is not a constant number")
    return float(value)


#: A probability below this is compared against two draws (:func:`_exactly_below`); one
#: 24-bit draw fires with probability ``ceil(p * 2^24) / 2^24``, off by up to 2^-24.
_ONE_DRAW_FROM = 2.0 ** -8


def _below(ctx: LoweringContext, device: torch.device, size: Sequence[Expr], p: float) -> Body:
    """Per element, whether a uniform draw falls below ``p`` (True with probability ``p``: to
    2^-24 relative from :data:`_ONE_DRAW_FROM` up, exactly below it); no draw at all for
    ``p`` 0 or 1."""
    if p in (0.0, 1.0):
        return lambda idx: ir.Const(torch.bool, value=p == 1.0)
    if p < _ONE_DRAW_FROM:
        return _exactly_below(ctx, device, size, lambda idx: const(p, torch.float32))
    draw = draws(ctx, "rand", device, size)
    return lambda idx: ir.Op(torch.bool, name="lt", args=(draw(idx), const(p, torch.float32)))


def _exactly_below(ctx: LoweringContext, device: torch.device, size: Sequence[Expr], p: Body) -> Body:
    """Per element, True with probability ``p(idx)`` (a float32 in [0, 1]) from two draws: the
    first, ``k / 2^24``, picks one of 2^24 buckets; ``p * 2^24`` has ``n`` whole buckets below
    it and a part ``f`` of one more, so the element fires where ``k < n``, or where ``k == n``
    and the second draw is below ``f``. One draw alone (``u < p``) fires at a rate of 2^-24
    for any ``p`` above 0 (``u`` is 0 that often): a Bernoulli of probability 1e-9 fired 60
    times too often (found by a hunt, session 38)."""
    first, second = draws(ctx, "rand", device, size), draws(ctx, "rand", device, size)
    f32 = torch.float32

    def fn(idx: list[Expr]) -> ir.Value:
        scaled = ir.Op(f32, name="mul", args=(p(idx), const(2.0 ** 24, f32)))
        whole = ir.Op(f32, name="floor", args=(scaled,))
        part = ir.Op(f32, name="sub", args=(scaled, whole))
        k = ir.Op(f32, name="mul", args=(first(idx), const(2.0 ** 24, f32)))
        under = ir.Op(torch.bool, name="lt", args=(k, whole))
        at = ir.Op(torch.bool, name="eq", args=(k, whole))
        within = ir.Op(torch.bool, name="lt", args=(second(idx), part))
        return ir.Op(torch.bool, name="logical_or",
                     args=(under, ir.Op(torch.bool, name="logical_and", args=(at, within))))

    return fn


@lowering(aten.bernoulli.p)
def _bernoulli_p(ctx: LoweringContext, x: TensorValue, p: Any = 0.5, *,
                 generator: Any = None) -> TensorValue:
    """1 with probability ``p`` (a number), else 0, in ``x``'s dtype."""
    _no_generator(ctx, generator)
    meta = _meta(ctx)
    check_dtype(meta.dtype, ctx.origin)
    keep = _below(ctx, x.device, x.size, _probability(ctx, p))
    return lazy(meta.dtype, x.device, x.size, lambda idx: cast(keep(idx), meta.dtype))


@lowering(aten.bernoulli.default)
def _bernoulli(ctx: LoweringContext, p: TensorValue, *, generator: Any = None) -> TensorValue:
    """``torch.bernoulli(p)``: 1 with probability ``p``, in ``p``'s dtype."""
    return _bernoulli_tensor(ctx, p, p, generator=generator)


@lowering(aten.bernoulli.Tensor)
def _bernoulli_tensor(ctx: LoweringContext, x: TensorValue, p: TensorValue, *,
                      generator: Any = None) -> TensorValue:
    """1 with probability ``p`` (a tensor broadcast to ``x``), else 0, in ``x``'s dtype. As
    in every compiled Bernoulli, probabilities outside [0, 1] are not checked."""
    _no_generator(ctx, generator)
    meta = _meta(ctx)
    check_dtype(meta.dtype, ctx.origin)
    if not p.dtype.is_floating_point:
        raise LoweringError(ctx.origin, f"probabilities of dtype {p.dtype}")
    probs = broadcast_to(p, x.size)
    hit = _exactly_below(ctx, x.device, x.size, lambda idx: cast(probs.load(idx), torch.float32))
    return lazy(meta.dtype, x.device, x.size, lambda idx: cast(hit(idx), meta.dtype))


def _scale(keep_prob: float, dtype: torch.dtype) -> float:
    """Dropout's ``1 / keep_prob`` (0 when nothing is kept) rounded to ``dtype``, as the
    backward's ``grad * (mask.to(dtype) * scale)`` rounds it and eager's CPU kernel does
    (CUDA's eager kernel keeps it in float32: half-type results may differ there by an ulp)."""
    scale = 0.0 if keep_prob == 0.0 else 1.0 / keep_prob
    if dtype == torch.float64:
        return scale
    return torch.tensor(scale, dtype=torch.float32).to(dtype).item()


@lowering(aten.native_dropout.default)
def _native_dropout(ctx: LoweringContext, x: TensorValue, p: Any,
                    train: Any = None) -> tuple[TensorValue, TensorValue]:
    """``(x * mask * scale, mask)`` as eager computes it: ``mask`` keeps each element with
    probability ``1 - p``, ``scale`` is ``1 / (1 - p)``; not training, ``(copy of x, ones)``.
    ``p == 1`` stays in ATen, whose CPU and CUDA kernels give different results for it."""
    meta = ctx.out_meta
    if not (isinstance(meta, (tuple, list)) and len(meta) == 2):
        raise LoweringError(ctx.origin, "expected two results")
    mask_dtype = meta[1].dtype
    check_dtype(x.dtype, ctx.origin)
    check_dtype(mask_dtype, ctx.origin)
    if not x.dtype.is_floating_point:
        raise LoweringError(ctx.origin, f"dropout of {x.dtype}")
    if train is False:
        ones = lazy(mask_dtype, x.device, x.size, lambda idx: const(1, mask_dtype))
        return copy_of(x), ones
    if train is not None and train is not True:
        raise LoweringError(ctx.origin, f"train={train!r} is not a constant")
    keep_prob = 1.0 - _probability(ctx, p)
    if keep_prob == 0.0:
        # eager's kernels disagree here: the CPU one multiplies by a scale of 0 (inf and NaN
        # inputs give NaN), the CUDA one writes zeros; the device's own kernel decides
        raise LoweringError(ctx.origin, "p=1 (every element dropped): left to the device's kernel")
    keep = _below(ctx, x.device, x.size, keep_prob)
    opnd = compute_dtype(x.dtype)
    scale = _scale(keep_prob, x.dtype)

    def out(idx: list[Expr]) -> ir.Value:
        kept = ir.Op(opnd, name="mul", args=(cast(x.load(idx), opnd), cast(keep(idx), opnd)))
        return cast(ir.Op(opnd, name="mul", args=(kept, const(scale, opnd))), x.dtype)

    return (lazy(x.dtype, x.device, x.size, out),
            lazy(mask_dtype, x.device, x.size, lambda idx: cast(keep(idx), mask_dtype)))


__all__ = ["RandomStreams", "draws", "SEED_LOW", "SEED_HIGH", "GENERATED_DTYPES"]
