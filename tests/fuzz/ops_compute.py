"""Op families that compute: pointwise ops and casts, reductions, normalisations and scans
(all lowered to Coil kernels), ops that fall back to ATen, and library calls. Each family
draws one `Step` over the values of a `Scope` (see `tests/fuzz/ops.py`)."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from .choices import DrawFn, dim_of, dims_of, partner, pick, scalar
from .programs import Scope, Step, shape_src


# -- pointwise --------------------------------------------------------------------------------

UNARY = ["torch.exp({x})", "torch.tanh({x})", "torch.sigmoid({x})", "torch.relu({x})",
         "{x}.neg()", "{x}.abs()", "torch.sin({x})", "{x} * 0.5", "{x}.clamp(-1.0, 1.0)",
         "torch.log1p({x}.abs())", "torch.rsqrt({x}.abs() + 1)", "{x}.square()", "F.gelu({x})",
         "F.silu({x})", "torch.erf({x})", "F.softplus({x})", "F.leaky_relu({x}, 0.1)",
         "F.hardtanh({x})"]
BINARY = ["{x} + {y}", "{x} * {y}", "{x} - {y}", "torch.maximum({x}, {y})",
          "{x} / ({y}.abs() + 1)", "torch.add({x}, {y}, alpha=0.5)", "torch.lerp({x}, {y}, 0.3)"]
SCALAR_BINARY = ["{x} + {s}", "{x} * {s}", "{s} - {x}", "{x} / {s}"]
CASTS = ["{x}.to(torch.bfloat16)", "{x}.float()", "{x}.double()", "{x}.to(torch.float16)",
         "{x}.to(torch.bfloat16).float()"]


def pointwise(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, recent=True)
    if x is None:
        return None
    kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "scalar", "where", "cast"]))
    if kind == "unary":
        code = draw(st.sampled_from(UNARY)).format(x=x)
    elif kind == "binary":
        code = draw(st.sampled_from(BINARY)).format(x=x, y=partner(draw, scope, x))
    elif kind == "scalar":
        code = draw(st.sampled_from(SCALAR_BINARY)).format(x=x, s=scalar(draw))
    elif kind == "where":
        y, z = partner(draw, scope, x), partner(draw, scope, x)
        cond = draw(st.sampled_from([f"{x} > {y}", f"{x} > 0", f"{y}.abs() < 0.5"]))
        other = draw(st.sampled_from([z, scalar(draw)]))
        code = f"torch.where({cond}, {x}, {other})"
    else:
        code = draw(st.sampled_from(CASTS)).format(x=x)
    return Step(scope.new_name(), code, "pointwise")


# -- reductions, normalisations, scans ---------------------------------------------------------

def reduction(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, lambda t: t.dim() >= 1, recent=True)
    if x is None:
        return None
    t = scope.tensor(x)
    op = draw(st.sampled_from(["sum", "amax", "amin", "mean", "var", "std", "logsumexp", "prod"]))
    if draw(st.integers(0, 4)) == 0 and op not in ("logsumexp", "prod"):
        return Step(scope.new_name(), f"{x}.{op}()", "reduction")
    keep = draw(st.booleans())
    dims = shape_src(dims_of(draw, t))
    if op in ("amax", "amin", "logsumexp"):
        code = f"torch.{op}({x}, dim={dims}, keepdim={keep})"
    elif op in ("var", "std"):
        code = f"{x}.{op}(dim={dims}, correction={draw(st.integers(0, 1))}, keepdim={keep})"
    elif op == "prod":
        code = f"{x}.prod(dim={dim_of(draw, t)}, keepdim={keep})"
    else:
        code = f"{x}.{op}(dim={dims}, keepdim={keep})"
    return Step(scope.new_name(), code, "reduction")


def normalize(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, lambda t: t.dim() >= 1, recent=True)
    if x is None:
        return None
    t = scope.tensor(x)
    op = draw(st.sampled_from(["softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm",
                               "batch_norm"]))
    if op in ("softmax", "log_softmax"):
        code = f"torch.{op}({x}, dim={dim_of(draw, t)})"
    elif op in ("layer_norm", "rms_norm"):
        k = draw(st.integers(1, t.dim()))
        shape = tuple(t.shape[-k:])
        args = [x, shape_src(shape)]
        if draw(st.booleans()):
            args.append(scope.add_input(shape))
            if op == "layer_norm" and draw(st.booleans()):
                args.append(scope.add_input(shape))
        code = f"F.{op}({', '.join(args)})"
    elif op == "group_norm":
        if t.dim() < 2:
            return None
        c = t.shape[1]
        groups = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
        code = f"F.group_norm({x}, {groups})"
    else:
        code = f"F.batch_norm({x}, None, None, training=True)"
    return Step(scope.new_name(), code, "normalize")


def scan(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, lambda t: t.dim() >= 1, recent=True)
    if x is None:
        return None
    op = draw(st.sampled_from(["cumsum", "cumprod"]))
    return Step(scope.new_name(), f"{x}.{op}({dim_of(draw, scope.tensor(x))})", "scan")


# -- ATen fallbacks ---------------------------------------------------------------------------

def _pool(draw: DrawFn, x: str, t: torch.Tensor) -> str | None:
    if t.dim() not in (3, 4):
        return None
    small = min(t.shape[-2:])
    k = draw(st.integers(1, min(3, small)))
    stride = draw(st.integers(1, k))
    pad = draw(st.integers(0, k // 2))
    op = draw(st.sampled_from(["max", "avg", "adaptive"]))
    if op == "adaptive":
        oh, ow = draw(st.integers(1, t.shape[-2])), draw(st.integers(1, t.shape[-1]))
        return f"F.adaptive_avg_pool2d({x}, ({oh}, {ow}))"
    ceil = draw(st.booleans())
    return f"F.{op}_pool2d({x}, {k}, stride={stride}, padding={pad}, ceil_mode={ceil})"


def fallback(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, lambda t: t.dim() >= 1, recent=True)
    if x is None:
        return None
    t = scope.tensor(x)
    d = dim_of(draw, t)
    size = t.shape[d]
    op = draw(st.sampled_from(["pool", "pool", "sort", "topk", "cummax", "logcumsumexp",
                               "kthvalue", "median", "vector_norm", "unfold", "digamma",
                               "grid_sample"]))
    if op == "pool":
        code = _pool(draw, x, t)
    elif op == "sort":
        code = f"torch.sort({x}, dim={d}, descending={draw(st.booleans())}).values"
    elif op == "topk":
        code = f"torch.topk({x}, {draw(st.integers(1, size))}, dim={d}, largest={draw(st.booleans())}).values"
    elif op == "cummax":
        code = f"torch.{draw(st.sampled_from(['cummax', 'cummin']))}({x}, dim={d}).values"
    elif op == "logcumsumexp":
        code = f"torch.logcumsumexp({x}, dim={d})"
    elif op == "kthvalue":
        code = f"torch.kthvalue({x}, {draw(st.integers(1, size))}, dim={d}).values"
    elif op == "median":
        code = f"torch.median({x}, dim={d}).values"
    elif op == "vector_norm":
        code = f"torch.linalg.vector_norm({x}, dim={shape_src(dims_of(draw, t))})"
    elif op == "unfold":
        width = draw(st.integers(1, size))
        code = f"{x}.unfold({d}, {width}, {draw(st.integers(1, 2))})"
    elif op == "digamma":
        code = f"torch.digamma({x}.abs() + 1)"
    else:
        if t.dim() != 4:
            return None
        grid = scope.add_input((t.shape[0], draw(st.integers(1, 4)), draw(st.integers(1, 4)), 2))
        code = f"F.grid_sample({x}, {grid}.tanh(), align_corners={draw(st.booleans())})"
    return None if code is None else Step(scope.new_name(), code, "fallback")


# -- library calls ----------------------------------------------------------------------------

def _matmul(draw: DrawFn, scope: Scope, x: str, t: torch.Tensor) -> str:
    k = t.shape[-1]
    fits = pick(draw, scope, lambda o: o.dim() >= 2 and o.shape[-2] == k)
    if fits is not None and draw(st.booleans()):
        return f"{x} @ {fits}"
    return f"{x} @ {scope.add_input((k, draw(st.integers(1, 7))))}"


def _conv(draw: DrawFn, scope: Scope, x: str, t: torch.Tensor) -> str | None:
    spatial = 2 if t.dim() in (3, 4) and draw(st.booleans()) else 1
    if t.dim() not in (spatial + 1, spatial + 2):
        return None
    c = t.shape[-spatial - 1]
    groups = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    cout = groups * draw(st.integers(1, 3))
    pad = draw(st.integers(0, 1))
    kernel = tuple(draw(st.integers(1, min(3, s + 2 * pad))) for s in t.shape[-spatial:])
    weight = scope.add_input((cout, c // groups) + kernel)
    bias = f", {scope.add_input((cout,))}" if draw(st.booleans()) else ""
    stride = draw(st.integers(1, 2))
    return f"F.conv{spatial}d({x}, {weight}{bias}, stride={stride}, padding={pad}, groups={groups})"


def _attention(draw: DrawFn, scope: Scope, x: str, t: torch.Tensor) -> str | None:
    if t.dim() not in (3, 4):
        return None
    lead, e = tuple(t.shape[:-2]), t.shape[-1]
    source = draw(st.sampled_from(["self", "values", "new"]))
    if source == "self":
        k = v = x
    elif source == "values":
        k = pick(draw, scope, lambda o: tuple(o.shape[:-2]) == lead and o.shape[-1] == e and o.dim() == t.dim())
        if k is None:
            return None
        lk = scope.tensor(k).shape[-2]
        v = pick(draw, scope, lambda o: tuple(o.shape[:-1]) == lead + (lk,)) or k
    else:
        lk = draw(st.integers(1, 7))
        k = scope.add_input(lead + (lk, e))
        v = scope.add_input(lead + (lk, draw(st.integers(1, 7))))
    extra = ", is_causal=True" if draw(st.booleans()) else ""
    if draw(st.integers(0, 3)) == 0:
        extra += ", scale=0.3"
    return f"F.scaled_dot_product_attention({x}, {k}, {v}{extra})"


def library(draw: DrawFn, scope: Scope) -> Step | None:
    x = pick(draw, scope, lambda t: t.dim() >= 1, recent=True)
    if x is None:
        return None
    t = scope.tensor(x)
    op = draw(st.sampled_from(["matmul", "bmm", "linear", "addmm", "conv", "conv", "attention",
                               "attention"]))
    if op == "matmul":
        code = _matmul(draw, scope, x, t)
    elif op == "bmm":
        if t.dim() != 3:
            return None
        other = draw(st.sampled_from([f"{x}.transpose(1, 2)", "new"]))
        if other == "new":
            other = scope.add_input((t.shape[0], t.shape[2], draw(st.integers(1, 7))))
        code = f"torch.bmm({x}, {other})"
    elif op == "linear":
        n = draw(st.integers(1, 7))
        bias = f", {scope.add_input((n,))}" if draw(st.booleans()) else ""
        code = f"F.linear({x}, {scope.add_input((n, t.shape[-1]))}{bias})"
    elif op == "addmm":
        if t.dim() != 2:
            return None
        n = draw(st.integers(1, 7))
        bias = scope.add_input((n,))
        code = f"torch.addmm({bias}, {x}, {scope.add_input((t.shape[1], n))}, beta=0.5)"
    elif op == "conv":
        code = _conv(draw, scope, x, t)
    else:
        code = _attention(draw, scope, x, t)
    return None if code is None else Step(scope.new_name(), code, "library")
