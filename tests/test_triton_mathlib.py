"""The Triton plugin's math library against PyTorch: every op's interpreter spelling runs in a
generated kernel under Triton's interpreter on CPU tensors; every GPU spelling compiles for
sm_90 without a GPU (and, where CUDA exists, runs against torch on the device)."""
from __future__ import annotations

import functools
import math

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from coil.sdk import POINTWISE_OPS  # noqa: E402
from coil_cuda_triton import mathlib, optable  # noqa: E402

OPS = sorted(mathlib.SPELLINGS)
# Exact results: compared bit for bit.
EXACT = {"floor", "ceil", "round", "trunc", "isinf", "isnan", "signbit", "copysign", "nextafter",
         "fmod", "remainder"}
INF, NAN = math.inf, math.nan
F32_MAX = 3.4028234663852886e38
F32_TINY, F64_TINY = 2.0 ** -126, 2.0 ** -1022  # smallest normal numbers

# Other float32 results: within ~2 ulp of torch's float64 result rounded to float32 (the
# helpers measure 0.51 ulp, the interpreter's own exp/log/sin/cos up to 1.96); results
# below the normal range are compared absolutely.
RTOL32, ATOL32 = 2.5e-7, F32_TINY
# float64: the helpers measure 1e-13 or better, but lgamma near its zeros at x < 0 only
# keeps a small absolute error.
RTOL64 = {"lgamma": 1e-8}
ATOL64 = {"lgamma": 1e-14}

SOURCE = """
@triton.jit
def kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask)
    y = tl.load(y_ptr + i, mask=mask)
{stores}
"""


def _store(k: int, op: str, interpret: bool) -> str:
    args = ["x", "y"][:POINTWISE_OPS[op]]
    value = mathlib.call(op, args, interpret)
    return f"    tl.store(out_ptr + {k} * n + i, ({value}).to(out_ptr.dtype.element_ty), mask=mask)"


@functools.lru_cache(maxsize=None)
def _kernel(ops: tuple[str, ...], interpret: bool):
    stores = "\n".join(_store(k, op, interpret) for k, op in enumerate(ops))
    return mathlib.load_source(SOURCE.format(stores=stores), interpret=interpret)["kernel"]


# --- inputs ---------------------------------------------------------------------------------

def _f32(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64).to(torch.float32).flatten()


def _near(points, ulps: int = 3) -> list[float]:
    """Each float32 point and its neighbours ``ulps`` steps either side."""
    out = []
    for p in _f32(points).tolist():
        t = torch.tensor(p, dtype=torch.float32)
        up = down = t
        for _ in range(ulps):
            up = torch.nextafter(up, torch.tensor(INF))
            down = torch.nextafter(down, torch.tensor(-INF))
            out += [up.item(), down.item()]
        out.append(p)
    return out


SPECIAL = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, 1e-45, -1e-45, 1e-40,
           -1e-40, F32_TINY, -F32_TINY, 1e-30, -1e-30, 1e-7, -1e-7, 1e-4, F32_MAX, -F32_MAX, 1e30,
           -1e30, 88.7, -88.7, 89.5, -103.9, 1e4, -1e4, 1e6, 12345.678, 2.0 ** 23 + 1, -(2.0 ** 24)]

LGAMMA_ZEROS = [1.0, 2.0, -2.4570247382, -2.7476826467, -3.1435808883, -3.9552942919]
# Extra inputs where an op's domain or difficulty lies.
DOMAIN = {
    "unit": [torch.linspace(-1, 1, 2001), _near([1.0, -1.0], 24),
             [s * 2.0 ** -k for k in range(1, 60, 3) for s in (1, -1)]],
    "acosh": [1 + torch.logspace(-7, 30, 200), _near([1.0], 8)],
    "log1p": [-1 + torch.logspace(-7, 0, 100), _near([-1.0], 8), torch.logspace(-38, 38, 77)],
    "lgamma": [torch.arange(-20.5, 20, 0.25), _near(LGAMMA_ZEROS, 6), [4e36, 1e37, -1e7 + 0.5]],
    "round": [torch.arange(-10.5, 11), _near([0.5, -0.5, 1.5, 2.5, 2.0 ** 22 + 0.5], 2)],
    "trig": [torch.tensor([k * math.pi / 2 for k in range(-20, 21)]),
             _near([math.pi / 2, math.pi], 2)],
    "erfc": [torch.linspace(-6, 11, 700)],
    "exp": [torch.linspace(-105, 90, 800)],
}
USES = {"asin": "unit", "acos": "unit", "atanh": "unit", "erfinv": "unit", "acosh": "acosh",
        "log1p": "log1p", "lgamma": "lgamma", "round": "round", "trunc": "round", "floor": "round",
        "ceil": "round", "tan": "trig", "sin": "trig", "cos": "trig", "erfc": "erfc", "erf": "erfc",
        "exp": "exp", "expm1": "exp", "sinh": "exp", "cosh": "exp", "exp2": "exp", "sigmoid": "exp"}

PAIR_VALUES = [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5,
               10.0, -7.25, 1e-30, -1e-40, 1e30, -F32_MAX, 0.1, 100.0, 1 / 3]


def unary_inputs(op: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    scales = 10 ** torch.empty(1500).uniform_(-4, 4, generator=gen)
    scaled = torch.randn(1500, generator=gen) * scales
    parts = [SPECIAL, torch.linspace(-12, 12, 961), torch.logspace(-38, 38, 153),
             -torch.logspace(-38, 38, 153), scaled, *DOMAIN.get(USES.get(op, ""), [])]
    return torch.cat([_f32(p) for p in parts])


def binary_inputs(op: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    grid = _f32(PAIR_VALUES)
    xs, ys = [grid.repeat_interleave(len(grid))], [grid.repeat(len(grid))]
    for values in (xs, ys):
        scales = 10 ** torch.empty(1500).uniform_(-3, 3, generator=gen)
        values.append(torch.randn(1500, generator=gen) * scales)
    if op == "pow":  # negative bases with integral exponents, and results across the range
        base = _f32([-2.0, -3.0, -0.5, -1.5, -10.0, -1.0, -0.0])
        expo = _f32([*range(-4, 6), 31.0, 32.0, 0.5, 1e9, -1e9, 1 / 3])
        xs += [base.repeat_interleave(len(expo)), torch.empty(800).uniform_(0, 5, generator=gen)]
        ys += [expo.repeat(len(base)), torch.empty(800).uniform_(-60, 60, generator=gen)]
    if op == "nextafter":
        xs.append(grid)
        ys.append(grid)
    return _f32(torch.cat(xs)), _f32(torch.cat(ys))


def inputs(op: str) -> tuple[torch.Tensor, torch.Tensor]:
    if POINTWISE_OPS[op] == 2:
        return binary_inputs(op)
    x = unary_inputs(op)
    return x, torch.ones_like(x)


def reference(op: str, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch's result in float64, rounded to ``dtype``: torch's own float32 error stays out of
    the budget (its vectorised float32 fmod even gives NaN for subnormal divisors)."""
    args = (x, y)[:POINTWISE_OPS[op]]
    if op == "nextafter":
        return torch.nextafter(*(a.to(dtype) for a in args))
    out = getattr(torch, op)(*(a.double() for a in args))
    return out if out.dtype == torch.bool else out.to(dtype)


def check(op: str, got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    if op in EXACT:
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    elif dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=RTOL32, atol=ATOL32, equal_nan=True)
    else:
        torch.testing.assert_close(got, ref, rtol=RTOL64.get(op, 1e-12),
                                   atol=ATOL64.get(op, F64_TINY), equal_nan=True)
    if not ref.dtype.is_floating_point:
        return
    zero = ref == 0  # and with the sign torch gives it
    assert torch.equal(torch.signbit(got[zero]), torch.signbit(ref[zero])), f"{op}: sign of zero"


def run(op: str, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype, device: str,
        interpret: bool) -> torch.Tensor:
    x, y = x.to(device, dtype), y.to(device, dtype)
    out_dtype = torch.bool if op in ("isinf", "isnan", "signbit") else dtype
    out = torch.empty(len(x), dtype=out_dtype, device=device)
    block = 1024
    _kernel((op, ), interpret)[(triton.cdiv(len(x), block), )](x, y, out, len(x), BLOCK=block)
    return out.cpu()


# --- tests ----------------------------------------------------------------------------------

def test_every_transcendental_core_op_has_two_spellings():
    # Operators the code generator spells itself.
    unspelled = {"add", "sub", "mul", "truediv", "floordiv", "truncdiv", "neg", "abs",
                 "reciprocal", "square", "sign", "maximum", "minimum", "clamp_min", "clamp_max",
                 "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                 "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                 "lshift", "rshift", "where",
                 "rand", "randn"}  # the mathlib helpers coil_rand/coil_randn, tests/test_random.py
    assert set(mathlib.SPELLINGS) == set(POINTWISE_OPS) - unspelled
    assert mathlib.call("erf", ["t3"], False) == "tl.erf(t3)"
    assert mathlib.call("atan2", ["a", "b"], True) == "coil_atan2(a, b)"
    with pytest.raises(KeyError, match="known: .*acos"):
        mathlib.call("frobnicate", ["x"], False)
    ns = mathlib.namespace(interpret=True)
    for gpu, interp in mathlib.SPELLINGS.values():
        for name in (gpu, interp):
            root, _, attr = name.partition(".")
            assert (getattr(ns[root], attr) if attr else ns[root]) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", OPS)
def test_interpreter_spelling_matches_torch(op, dtype):
    x, y = inputs(op)
    got = run(op, x, y, dtype, "cpu", interpret=True)
    check(op, got, reference(op, x, y, dtype), dtype)


def test_interpreted_kernel_leaves_triton_as_it_found_it():
    """A per-kernel interpreted launch may call JIT functions (tl.sum is one, a helper another)
    and undoes every patch it needs, so later kernels compile for real."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    watched = [(tl, n) for n in ("exp", "where", "load", "sum", "reduce", "static_range")]
    watched += [(tl.core, n) for n in ("where", "load", "arange", "reduce", "static_range")]
    watched += [(tl.tensor, "__add__"), (JITFunction, "__call__")]
    before = [getattr(obj, n) for obj, n in watched]
    kernel = mathlib.load_source(
        "@triton.jit\n"
        "def total(x_ptr, out_ptr, BLOCK: tl.constexpr):\n"
        "    x = tl.load(x_ptr + tl.arange(0, BLOCK))\n"
        "    tl.store(out_ptr, tl.sum(coil_tanh(x), axis=0))\n", interpret=True)["total"]
    x, out = torch.linspace(-2, 2, 64), torch.empty(1)
    kernel[(1, )](x, out, BLOCK=64)
    torch.testing.assert_close(out[0], x.tanh().sum(), atol=1e-5, rtol=1e-6)
    assert [getattr(obj, n) for obj, n in watched] == before


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_gpu_spellings_compile_for_hopper(dtype):
    """One kernel holding every GPU spelling builds to a cubin for sm_90 with no GPU present."""
    kernel = _kernel(tuple(OPS), False)
    sig = {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "n": "i32",
           "BLOCK": "constexpr"}
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs={"BLOCK": 256}),
                              target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"] and ".target sm_90" in compiled.asm["ptx"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["truediv", "floordiv", "truncdiv", "reciprocal"])
def test_float_division_is_ieee_division_on_hopper(op, dtype):
    """Eager's CUDA kernels divide with IEEE rounding; Triton's float32 ``/`` is
    ``div.full.f32``, within 2 ulp, which truncated 2.7% of exact quotients (6.0 / 3.0) one
    below eager's on an H100. The GPU spelling of each division must build to ``div.rn.f32``."""
    args = ["x", "y"] if op != "reciprocal" else ["x"]
    value = optable.OPS[op](args, dtype, False)
    source = ("@triton.jit\n"
              "def kernel(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):\n"
              "    i = tl.arange(0, BLOCK)\n"
              "    x = tl.load(x_ptr + i)\n"
              "    y = tl.load(y_ptr + i)\n"
              f"    tl.store(out_ptr + i, {value})\n")
    kernel = mathlib.load_source(source, interpret=False)["kernel"]
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK": "constexpr"}
    ptx = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs={"BLOCK": 128}),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx, value


# Where libdevice is looser than the helpers (measured on an H200; elsewhere it is within
# 2.6 ulp): near lgamma's zeros at x < 0 its absolute error is 2.4e-7 (float32), 3e-16 (float64).
GPU_ATOL = {"lgamma": {torch.float32: 1e-6, torch.float64: 1e-14}}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", OPS)
def test_gpu_spelling_matches_torch_on_cuda(op, dtype):
    x, y = inputs(op)
    # Triton links libdevice with flush-to-zero: subnormal inputs read as zero there, and
    # subnormal results come out as zero (or, from nextafter, as the smallest normal).
    normal = torch.ones_like(x, dtype=torch.bool)
    for v in (x, y):
        normal &= (v.abs() >= F32_TINY) | (v == 0) | v.isnan()
    x, y = x[normal], y[normal]
    got = run(op, x, y, dtype, "cuda", interpret=False)
    ref = reference(op, x, y, dtype)
    if not ref.dtype.is_floating_point:
        assert torch.equal(got, ref)
        return
    tiny = F32_TINY if dtype == torch.float32 else F64_TINY
    rtol = 0.0 if op in EXACT else 4.8e-7 if dtype == torch.float32 else 1e-14
    atol = max(tiny, GPU_ATOL.get(op, {}).get(dtype, 0.0))
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, equal_nan=True)
