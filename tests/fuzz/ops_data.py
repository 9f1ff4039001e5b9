"""Op families that move data: views, copies that rearrange (cat, pad, flip, index_select),
and in-place updates into slices of intermediates and inputs. Each family draws one `Step`
over the values of a `Scope` (see `tests/fuzz/ops.py`)."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from .choices import DrawFn, broadcasts_to, dim_of, dims_of, overlaps_itself, partner, pick, scalar
from .programs import Scope, Step, shape_src


# -- views ------------------------------------------------------------------------------------

def _slice_index(draw: DrawFn, t: torch.Tensor, allow_int: bool = True) -> str:
    """A basic index: per leading dim ':', 'a:b', 'a::s' or an int."""
    parts = []
    for size in t.shape[:draw(st.integers(1, t.dim()))]:
        kind = draw(st.sampled_from(["all", "range", "step", "int"] if allow_int else ["all", "range", "step"]))
        start = draw(st.integers(0, size - 1))
        if kind == "range":
            parts.append(f"{start or ''}:{draw(st.integers(start + 1, size))}")
        elif kind == "step":
            parts.append(f"{start or ''}::{draw(st.integers(2, 3))}")
        elif kind == "int":
            parts.append(str(start))
        else:
            parts.append(":")
    return "[" + ", ".join(parts) + "]"


def _factor(n: int, draw: DrawFn) -> tuple[int, int] | None:
    divisors = [d for d in range(2, n) if n % d == 0]
    if not divisors:
        return None
    a = draw(st.sampled_from(divisors))
    return a, n // a


def _reshape(draw: DrawFn, x: str, t: torch.Tensor) -> str:
    shape = list(t.shape)
    kind = draw(st.sampled_from(["flat", "merge", "split", "minus1"]))
    if kind == "merge" and len(shape) >= 2:
        i = draw(st.integers(0, len(shape) - 2))
        shape[i:i + 2] = [shape[i] * shape[i + 1]]
    elif kind == "split" and shape:
        i = draw(st.integers(0, len(shape) - 1))
        parts = _factor(shape[i], draw)
        if parts:
            shape[i:i + 1] = list(parts)
    elif kind == "minus1" and len(shape) >= 2:
        return f"{x}.reshape(-1, {shape[-1]})"
    else:
        shape = [t.numel()]
    method = draw(st.sampled_from(["reshape", "reshape", "view"]))
    return f"{x}.{method}{shape_src(tuple(shape))}"


def _expand(draw: DrawFn, x: str, t: torch.Tensor) -> str:
    ones = [d for d, s in enumerate(t.shape) if s == 1]
    if ones:
        shape = tuple(draw(st.integers(2, 4)) if d in ones and draw(st.booleans()) else s
                      for d, s in enumerate(t.shape))
        return f"{x}.expand{shape_src(shape)}"
    return f"{x}.unsqueeze(0).expand{shape_src((draw(st.integers(2, 3)),) + tuple(t.shape))}"


def view(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, lambda t: t.dim() >= 1, recent=True)
    if x is None:
        return None
    t = scope.tensor(x)
    r = t.dim()
    a, b = dim_of(draw, t), dim_of(draw, t)
    op = draw(st.sampled_from(["permute", "transpose", "slice", "slice", "narrow", "select",
                               "unsqueeze", "squeeze", "expand", "reshape", "reshape", "flatten",
                               "movedim", "diagonal", "chunk", "unbind", "contiguous", "mT"]))
    if op == "permute":
        code = f"{x}.permute{shape_src(tuple(draw(st.permutations(range(r)))))}"
    elif op == "transpose":
        code = f"{x}.transpose({a}, {b})"
    elif op == "slice":
        code = x + _slice_index(draw, t, allow_int=False)
    elif op == "narrow":
        start = draw(st.integers(0, t.shape[a] - 1))
        code = f"{x}.narrow({a}, {start}, {draw(st.integers(1, t.shape[a] - start))})"
    elif op == "select":
        code = f"{x}.select({a}, {draw(st.integers(0, t.shape[a] - 1))})"
    elif op == "unsqueeze":
        code = f"{x}.unsqueeze({draw(st.integers(0, r))})"
    elif op == "squeeze":
        ones = [d for d, s in enumerate(t.shape) if s == 1]
        code = f"{x}.squeeze({draw(st.sampled_from(ones))})" if ones else f"{x}.squeeze()"
    elif op == "expand":
        code = _expand(draw, x, t)
    elif op == "reshape":
        code = _reshape(draw, x, t)
    elif op == "flatten":
        code = f"{x}.flatten({min(a, b)}, {max(a, b)})"
    elif op == "movedim":
        code = f"{x}.movedim({a}, {b})"
    elif op == "diagonal":
        code = f"{x}.diagonal({draw(st.integers(-1, 1))}, {a}, {b})"
    elif op == "chunk":
        n = draw(st.integers(2, 3))
        code = f"{x}.chunk({n}, {a})[{draw(st.integers(0, n - 1))}]"
    elif op == "unbind":
        code = f"{x}.unbind({a})[{draw(st.integers(0, t.shape[a] - 1))}]"
    elif op == "contiguous":
        code = f"{x}.contiguous(memory_format=torch.channels_last)" if r == 4 and draw(st.booleans()) \
            else f"{x}.contiguous()"
    else:
        code = f"{x}.mT"
    return Step(scope.new_name(), code, "view")


# -- other data movement ----------------------------------------------------------------------

def misc(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, lambda t: t.dim() >= 1, recent=True)
    if x is None:
        return None
    t = scope.tensor(x)
    d = dim_of(draw, t)
    op = draw(st.sampled_from(["cat", "stack", "pad", "flip", "roll", "repeat", "tril",
                               "index_select", "index_add", "gather_rows"]))
    same = pick(draw, scope, lambda o: o.shape == t.shape) or x
    rows = draw(st.lists(st.integers(0, t.shape[d] - 1), min_size=1, max_size=4))
    index = shape_src(tuple(rows))
    if op == "cat":
        fits = pick(draw, scope, lambda o: o.dim() == t.dim() and all(
            o.shape[i] == t.shape[i] for i in range(t.dim()) if i != d)) or x
        code = f"torch.cat([{x}, {fits}], dim={d})"
    elif op == "stack":
        code = f"torch.stack([{x}, {same}], dim={draw(st.integers(0, t.dim()))})"
    elif op == "pad":
        n = min(t.dim(), draw(st.integers(1, 2)))
        pads = tuple(draw(st.integers(0, 2)) for _ in range(2 * n))
        mode = draw(st.sampled_from(["", "", ", mode='reflect'", ", mode='replicate'", ", value=1.5"]))
        code = f"F.pad({x}, {shape_src(pads)}{mode})"
    elif op == "flip":
        code = f"{x}.flip({shape_src(dims_of(draw, t))})"
    elif op == "roll":
        code = f"{x}.roll({draw(st.integers(-3, 3))}, {d})"
    elif op == "repeat":
        code = f"{x}.repeat{shape_src(tuple(draw(st.integers(1, 2)) for _ in range(t.dim())))}"
    elif op == "tril":
        code = f"{x}.{draw(st.sampled_from(['tril', 'triu']))}({draw(st.integers(-1, 1))})"
    elif op == "index_select":
        code = f"{x}.index_select({d}, torch.tensor({index}))"
    elif op == "index_add":
        src = f"{x}.narrow({d}, 0, 1).expand_as({x}.narrow({d}, 0, {len(rows)}))"
        code = f"{x}.index_add({d}, torch.tensor({index}), {src}, alpha=0.5)"
    else:
        code = f"{x}[torch.tensor({index})]"
    return Step(scope.new_name(), code, "misc")


# -- in-place updates -------------------------------------------------------------------------

def _source(draw: DrawFn, scope: Scope, region: torch.Tensor, tensor_only: bool = False) -> str:
    """A value to write into ``region``: a broadcastable value, a 0-d reduction, or a scalar."""
    fits = pick(draw, scope, lambda o: broadcasts_to(o, region.shape))
    kind = draw(st.sampled_from(["value", "value", "reduced", "scalar"]))
    if kind == "value" and fits is not None:
        return fits
    if kind == "scalar" and not tensor_only:
        return scalar(draw)
    return f"{pick(draw, scope)}.{draw(st.sampled_from(['sum', 'mean', 'amax']))}()"


def inplace(draw: DrawFn, scope: Scope) -> Step | None:
    # Not into memory that overlaps itself (expanded, unfolded): eager refuses most such
    # writes, and AOTAutograd refuses even the ones eager runs (``x.copy_(x)``).
    target = pick(draw, scope, lambda t: t.dim() >= 1 and not overlaps_itself(t) and scope.writable(t),
                  recent=True)
    if target is None:
        return None
    t = scope.tensor(target)
    op = draw(st.sampled_from(["add_", "mul_", "copy_", "sub_", "setitem", "clamp_", "relu_",
                               "index_put_", "index_put_", "masked_fill_"]))
    region_expr = target + (_slice_index(draw, t) if draw(st.integers(0, 3)) else "")
    if op in ("index_put_", "masked_fill_"):
        region_expr = target
    region = eval(region_expr, dict(scope.env))  # noqa: S307 - our own text, a view
    if op == "setitem":
        index = region_expr[len(target):] or "[...]"
        return Step(None, f"{target}{index} = {_source(draw, scope, region)}", "inplace")
    if op in ("add_", "mul_", "sub_"):
        return Step(None, f"{region_expr}.{op}({_source(draw, scope, region)})", "inplace")
    if op == "copy_":
        return Step(None, f"{region_expr}.copy_({_source(draw, scope, region, tensor_only=True)})", "inplace")
    if op == "clamp_":
        return Step(None, f"{region_expr}.clamp_(-0.5, 0.5)", "inplace")
    if op == "relu_":
        return Step(None, f"{region_expr}.relu_()", "inplace")
    if op == "masked_fill_":
        mask = partner(draw, scope, target)
        return Step(None, f"{target}.masked_fill_({mask} > 0.3, {scalar(draw)})", "inplace")
    rows = draw(st.lists(st.integers(0, t.shape[0] - 1), min_size=1, max_size=3, unique=True))
    sub = t[torch.tensor(rows)]
    src = _source(draw, scope, sub, tensor_only=True)
    dtype = str(t.dtype)
    if eval(src, dict(scope.env)).dtype != t.dtype:  # noqa: S307 - index_put_ needs equal dtypes
        src = f"{src}.to({dtype})"
    accumulate = draw(st.booleans())
    return Step(None, f"{target}.index_put_((torch.tensor({shape_src(tuple(rows))}),), {src}, accumulate={accumulate})", "inplace")
