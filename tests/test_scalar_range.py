"""A scalar written into an integer tensor that cannot hold it: eager raises (``value cannot be
converted to type int8_t without overflow``); under dynamic shapes the scalar can be a size
Dynamo does not check, and Coil wrote it wrapped (a hunt, session 36). Coil against eager, on
the default device (``COIL_TEST_DEVICE``)."""
from __future__ import annotations

import pytest
import torch

from coil.scalar_range import check_scalar_ranges

OPS = {
    "clamp_min": lambda x, k: x.clamp(min=k),
    "clamp_max": lambda x, k: x.clamp(max=-k),
    "where": lambda x, k: torch.where(x > 0, x, k),
    "masked_fill": lambda x, k: x.masked_fill(x > 0, k),
    "full_like": lambda x, k: torch.full_like(x, k),
    "fill_": lambda x, k: x.clone().fill_(k),
    "index_fill": lambda x, k: x.index_fill(0, torch.tensor([1], device=x.device), k),
    "scatter": lambda x, k: x.scatter(0, torch.tensor([1], device=x.device), k),
    "full": lambda x, k: x + torch.full((3,), k, dtype=x.dtype, device=x.device),
}


def _outcome(fn, *args):
    try:
        return fn(*args).tolist()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_a_symbolic_scalar_that_overflows_raises_as_eager(name, dtype):
    op = OPS[name]

    def fn(x, n):
        return op(x, n.shape[0] * 100)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", dynamic=True)
    x = torch.tensor([1, 3, 5], dtype=dtype)
    # 100 fits both types, 200 only uint8, 300 neither (uint8 takes -255..255: negatives wrap)
    for rows in (2, 1, 3, 2):
        n = torch.zeros(rows)
        want = _outcome(fn, x, n)
        assert _outcome(compiled, x, n) == want, (rows, want)
    torch._dynamo.reset()


def test_a_number_scatter_does_not_check_while_tracing_raises_as_eager():
    """Dynamo's trace checks the number of ``full`` or ``masked_fill``, not ``scatter``'s."""
    def fn(x):
        return x.scatter(0, torch.tensor([1], device=x.device), 300)
    torch._dynamo.reset()
    x = torch.tensor([1, 3, 5], dtype=torch.int8)
    with pytest.raises(RuntimeError, match="without overflow"):
        fn(x)
    with pytest.raises(RuntimeError, match="int8_t without overflow"):
        torch.compile(fn, backend="coil")(x)
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bool])
def test_types_that_hold_every_size_get_no_check(dtype):
    """int64 holds every symbolic size; a float16 overflow is inf in eager, bool any number."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    n = graph.placeholder("n")
    fill = graph.call_function(torch.ops.aten.full_like.default, (x, n))
    graph.output(fill)
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(shape_env=ShapeEnv())
    s = mode.shape_env.create_unbacked_symint()
    with mode:
        x.meta["val"] = torch.empty(3, dtype=dtype)
        fill.meta["val"] = torch.empty(3, dtype=dtype)
    n.meta["val"] = s
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert check_scalar_ranges(gm) == 0
    x.meta["val"] = fill.meta["val"] = fill.meta["val"].to(torch.int32)
    assert check_scalar_ranges(gm) == 2  # both bounds
