"""Dynamic shapes where Dynamo's guards settle what the lowering only spells symbolically, and
symbolic scalars (found by a hunt, session 35): Coil against eager, with ``dynamic=True`` and
on the automatic-dynamic recompile, on the default device (``COIL_TEST_DEVICE``)."""
from __future__ import annotations

import pytest
import sympy
import torch

from coil.errors import LoweringError
from coil.lowering.values import Lazy, check_static_sizes


def _both_ways(fn, *shapes, make=torch.randn):
    """``fn`` under ``dynamic=True``, and under automatic dynamic (called at each shape in
    turn, so the later shapes recompile with symbols), against eager; shapes and values."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", dynamic=True)
    auto = torch.compile(fn, backend="coil")
    for shape in shapes:
        args = [make(*s) for s in shape] if isinstance(shape[0], tuple) else [make(*shape)]
        want = fn(*args)
        for c in (compiled, auto):
            got = c(*args)
            torch.testing.assert_close(got, want)
    torch._dynamo.reset()


SLICES_OF_ONE = {
    "later_operand": lambda x: x[:, ::2] * x[:, 1:2],
    "earlier_operand": lambda x: x[:, 1:2] + x,
    "squeezed": lambda x: x[:, 1:2].squeeze(1) + x[:, 0],
    "from_the_end": lambda x: x[:, -2:-1] * x,
    "narrow": lambda x: x.narrow(1, 1, 1) - x,
    "middle": lambda x: x[:, x.shape[1] // 2: x.shape[1] // 2 + 1] * x,
    "where": lambda x: torch.where(x[:, 1:2] > 0, x, -x),
    "softmax": lambda x: (x[:, 1:2] * x).softmax(-1),
    "sum_over_it": lambda x: (x[:, 2:3] + x).sum(0),
}


@pytest.mark.parametrize("name", sorted(SLICES_OF_ONE))
def test_a_slice_of_one_element_broadcasts(name):
    """``x[:, 1:2]`` of ``s`` columns is ``Min(2, s) - Min(1, s)`` columns to the bounds and 1
    to Dynamo (``s >= 2`` guarded): it must broadcast as a size 1, and squeeze away."""
    _both_ways(SLICES_OF_ONE[name], (3, 4), (3, 6), (5, 9))


def test_a_split_with_a_chunk_of_one():
    def fn(x):
        a, b = x.split([1, x.shape[1] - 1], 1)
        return a * b
    _both_ways(fn, (3, 5), (4, 7))


def test_a_narrow_at_a_derived_size_runs_in_aten_with_its_size_bound():
    """A bound the lowering cannot sign (``n // 2``) leaves the slice to ATen, whose call
    takes the derived size: the wrapper binds it (it raised NameError)."""
    def fn(x, n):
        return x.narrow(1, n // 2, 1) * x
    torch._dynamo.reset()
    x = torch.randn(3, 5)
    got = torch.compile(fn, backend="coil", dynamic=True)(x, 4)
    torch.testing.assert_close(got, fn(x, 4))
    torch._dynamo.reset()


def test_sizes_against_the_graphs_metadata():
    """The net under every lowering: a number the metadata has must be the lowered value's,
    and a size 1 must not be an expression."""
    meta = torch.empty(3, 1)
    s = sympy.Symbol("s0", integer=True, positive=True)
    ok = Lazy(torch.float32, torch.device("cpu"), (sympy.Integer(3), sympy.Integer(1)), lambda idx: None)
    check_static_sizes(ok, meta)
    check_static_sizes([ok, ok], [meta, meta])
    for size in [(sympy.Integer(3), sympy.Integer(2)), (sympy.Integer(3), sympy.Min(2, s) - 1),
                 (sympy.Integer(3),)]:
        with pytest.raises(LoweringError):
            check_static_sizes(Lazy(torch.float32, torch.device("cpu"), size, lambda idx: None), meta)
    symbolic = Lazy(torch.float32, torch.device("cpu"), (s, sympy.Integer(1)), lambda idx: None)
    check_static_sizes(symbolic, meta)  # a symbol where the metadata has 3: nothing to decide on


HALF_WITH_SYMBOLIC_SCALARS = {
    "fmod": lambda x: torch.fmod(x, x.size(0) + 2102),
    "remainder_of_a_symfloat": lambda x: x % (x.size(0) / 10),
    "pow_of_a_symfloat": lambda x: x.abs() ** (x.size(0) / 10),
    "sub": lambda x: x - x.size(0) * 1000,
    "rsub": lambda x: x.size(0) * 1000 - x,
    "equal": lambda x: x == x.size(0) * 1000 + 1,
    "where_greater": lambda x: torch.where(x > x.size(0) / 10, x, -x),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(HALF_WITH_SYMBOLIC_SCALARS))
def test_a_symbolic_scalar_is_rounded_to_the_half_type_as_a_number_is(name, dtype):
    """Eager's CPU kernels round a scalar operand to a half tensor's type (add, sub, fmod,
    remainder, pow, comparisons); a scalar from a symbolic size must be rounded too, where a
    number already was (``bf16(2119)`` is 2112)."""
    fn = HALF_WITH_SYMBOLIC_SCALARS[name]

    def make(n):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, generator=g, dtype=torch.float32, device="cpu") * 3000
        x[:3] = torch.tensor([17001.0, 2119.0, 4238.0], device="cpu")
        return x.to(dtype).to(torch.get_default_device())
    _both_ways(fn, (17,), (23,), (31,), make=make)


SYMBOLIC_INTS = {
    # a slice's step of the sizes (torch's Max and FloorDiv reached the printer)
    "step": (lambda x, n: x[::max(x.shape[0] // 3, 1)] + n, ((7, 2), (12, 3), (2, 5))),
    # abs() of an int argument (sympy's Abs had no spelling)
    "abs": (lambda x, n: x * abs(n), ((4, 4),)),
    "abs_index": (lambda x, n: x[-(abs(n) % 4) - 1], ((4, 4), (6, 2))),
    # a view returned at a derived offset (the wrapper did not bind the derived size: NameError)
    "mod_index": (lambda x, n: x[n % 4], ((4, 4), (5, 3))),
    # a scatter's index filled with the argument (its symbol was no argument of the C++ kernel)
    "scatter_full": (lambda x, n: x.scatter(1, torch.full((x.shape[0], 1), abs(n) % x.shape[1]), 9.0),
                     ((4, 4), (3, 5))),
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC_INTS))
def test_symbolic_int_arguments(name):
    """Found by a hunt (session 37): each compiled, or ran, only with a static argument."""
    fn, shapes = SYMBOLIC_INTS[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", dynamic=True)
    for shape in shapes:
        x = torch.arange(float(shape[0] * shape[1])).view(shape)
        for n in (-7, 5, 2, 9):
            torch.testing.assert_close(compiled(x, n), fn(x, n))
    torch._dynamo.reset()


CHANNELS_LAST_UNDER_SYMBOLS = {
    "conv_relu": lambda x, w: torch.nn.functional.conv2d(x, w).relu(),
    "conv_relu_": lambda x, w: torch.nn.functional.conv2d(x, w).relu_(),
    "conv_add": lambda x, w: torch.nn.functional.conv2d(x, w, padding=1) + x,
}


@pytest.mark.parametrize("name", sorted(CHANNELS_LAST_UNDER_SYMBOLS))
def test_channels_last_strides_of_symbolic_sizes(name):
    """Eager's channels-last strides of a symbolic size hold ``Max(1, n)``: they are dense, and
    a result computed from a channels-last convolution keeps them (found by a hunt, session
    37: Coil returned contiguous strides under ``dynamic=True``, equal values)."""
    fn = CHANNELS_LAST_UNDER_SYMBOLS[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", dynamic=True)
    w = torch.randn(4, 4, 3, 3)
    for n, hw in ((2, 8), (3, 11), (1, 5)):
        x = torch.randn(n, 4, hw, hw).to(memory_format=torch.channels_last)
        got, want = compiled(x, w), fn(x, w)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    torch._dynamo.reset()
