"""Library ops' argument contracts beyond eager's strides (:mod:`coil.library_args`): an
attention bias reaches the memory-efficient and cuDNN attention kernels with rows aligned to
8 elements, whatever layout the lowering gave it."""
from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil import ir, library_args
from coil.compile import lowering_registry
from coil.config import Config
from coil.graph import GraphLowering

aten = torch.ops.aten


def _extern_args(fn, *inputs: torch.Tensor) -> tuple[list[ir.BufferRef], int]:
    """The tensor arguments of the one library call in ``fn``'s lowered graph, and how many
    other nodes write buffers."""
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    lowered = GraphLowering(gm, list(inputs), lowering_registry(), Config()).run()
    (node,) = [n for n in lowered.nodes if isinstance(n, ir.ExternNode)]
    return [a for a in node.args if isinstance(a, ir.BufferRef)], len(lowered.nodes) - 1


def _layout(size, stride, offset=0) -> ir.Layout:
    return ir.Layout(torch.float32, torch.device("cpu"), tuple(map(sympy.Integer, size)),
                     tuple(map(sympy.Integer, stride)), sympy.Integer(offset))


def test_rows_aligned_reads_every_stepping_dim_and_the_offset() -> None:
    assert library_args.rows_aligned(_layout((4, 3, 49, 49), (8232, 2744, 56, 1)))
    assert library_args.rows_aligned(_layout((4, 3, 49, 49), (0, 2744, 56, 1)))  # expanded batch
    assert library_args.rows_aligned(_layout((1, 3, 49, 49), (7, 2744, 56, 1)))  # size-1 dim
    assert not library_args.rows_aligned(_layout((4, 3, 49, 49), (7203, 2401, 49, 1)))
    assert not library_args.rows_aligned(_layout((4, 3, 49, 56), (8232, 2744, 1, 49)))  # column-major
    assert not library_args.rows_aligned(_layout((4, 3, 49, 49), (8232, 2744, 56, 1), offset=3))


def test_padded_layout_pads_rows_symbolic_sizes_too() -> None:
    padded = library_args.padded_layout(_layout((4, 3, 49, 49), (7203, 2401, 49, 1)))
    assert padded.stride == (8232, 2744, 56, 1)
    n = sympy.Symbol("s0", integer=True, positive=True)
    sym = library_args.padded_layout(ir.Layout(torch.float32, torch.device("cpu"), (sympy.Integer(2), n, n),
                                               ir.contiguous_strides((2, n, n))))
    assert library_args.rows_aligned(sym)
    assert sym.stride[-1] == 1 and sym.stride[0] == n * sym.stride[1]


def test_unaligned_attention_bias_is_copied_into_padded_rows() -> None:
    """A dense bias whose rows are 49 elements long (as Swin's 7x7 windows give) reaches the
    memory-efficient kernel in a buffer of 56-element rows; q, k and v stay as they are."""
    def fn(q, bias):
        return aten._scaled_dot_product_efficient_attention(q, q, q, bias * 2, False)[0]

    q, bias = torch.randn(4, 3, 49, 32), torch.randn(4, 3, 49, 49)
    args, _ = _extern_args(fn, q, bias)
    assert [a.layout.stride for a in args[:3]] == [(4704, 1568, 32, 1)] * 3
    assert args[3].layout.stride == (8232, 2744, 56, 1)


def test_aligned_attention_bias_is_passed_as_it_is() -> None:
    """Eager's composite SDPA pads and slices a bias itself: that view is kept, not copied."""
    def fn(q, bias):
        padded = aten.constant_pad_nd(bias * 2, [0, 7])
        return aten._scaled_dot_product_efficient_attention(q, q, q, padded[..., :49], False)[0]

    q, bias = torch.randn(4, 3, 49, 32), torch.randn(4, 3, 49, 49)
    args, writes = _extern_args(fn, q, bias)
    assert args[3].layout.stride == (8232, 2744, 56, 1)
    assert writes == 1  # the padded buffer, written once (the scaling fused): no second copy


def test_ops_without_attn_bias_have_no_aligned_arguments() -> None:
    assert library_args.aligned_positions(aten._scaled_dot_product_efficient_attention.default) == {"attn_bias": 3}
    assert library_args.aligned_positions(aten._scaled_dot_product_efficient_attention_backward.default) == {
        "attn_bias": 4}
    assert library_args.aligned_positions(aten._scaled_dot_product_flash_attention_for_cpu.default) == {}
    assert library_args.aligned_positions(aten.mm.default) == {}


@torch.library.custom_op("coil_test::biased_rows", mutates_args=())
def _biased_rows(x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
    """A stand-in for the attention kernels on the CPU: refuses a bias whose rows are not
    8-aligned, as the memory-efficient kernel does."""
    if any(st % 8 for n, st in zip(attn_bias.shape[:-1], attn_bias.stride()[:-1]) if n > 1):
        raise RuntimeError(f"attn_bias is not correctly aligned: strides {attn_bias.stride()}")
    return x + attn_bias.sum(-1, keepdim=True)


@_biased_rows.register_fake
def _(x: torch.Tensor, attn_bias: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_compiled_call_passes_padded_bias_and_matches_eager() -> None:
    """End to end on the CPU: the padded buffer is allocated, written and read through its
    view, and the values are eager's."""
    def fn(x, bias):
        return torch.ops.coil_test.biased_rows(x, torch.tanh(bias) * 3)

    x, bias = torch.randn(4, 3, 49, 1), torch.randn(4, 3, 49, 49)
    with pytest.raises(RuntimeError, match="not correctly aligned"):
        fn(x, bias)  # eager itself passes the dense bias: the stand-in refuses it
    torch._dynamo.reset()
    got = torch.compile(fn, backend="coil")(x, bias)
    torch.testing.assert_close(got, x + (torch.tanh(bias) * 3).sum(-1, keepdim=True))


def test_expanded_bias_is_written_once_and_passed_broadcast() -> None:
    """Swin's relative-position bias, [1, H, 49, 49] expanded over the windows as eager's SDPA
    passes it: written once per head in padded rows, reaching the kernel with stride 0 over
    the windows (it had been written out for every window)."""
    def fn(q, table, idx):
        bias = table[idx].view(49, 49, 3).permute(2, 0, 1).unsqueeze(0)
        padded = aten.constant_pad_nd(bias, [0, 7])[..., :49]
        return aten._scaled_dot_product_efficient_attention(q, q, q, padded.expand(8, 3, 49, 49), False)[0]

    q, table, idx = torch.randn(8, 3, 49, 32), torch.randn(169, 3), torch.randint(0, 169, (2401,))
    args, writes = _extern_args(fn, q, table, idx)
    assert args[3].layout.stride == (0, 2744, 56, 1)
    assert writes == 1


@torch.library.custom_op("coil_test::strides_seen", mutates_args=())
def _strides_seen(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``x + other`` with ``other``'s strides recorded, to see what a library call received."""
    _SEEN.append(tuple(other.stride()))
    return x + other


@_strides_seen.register_fake
def _(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_SEEN: list[tuple[int, ...]] = []


def test_compiled_call_passes_an_expanded_argument_as_eager_does() -> None:
    """End to end on the CPU: a computed value expanded along two dims reaches the op with
    eager's stride-0 dims, holding eager's values."""
    def fn(x, b):
        return torch.ops.coil_test.strides_seen(x, (torch.sigmoid(b) * 2).expand(4, 3, 5, 6))

    x, b = torch.randn(4, 3, 5, 6), torch.randn(1, 3, 1, 6)
    _SEEN.clear()
    expected = fn(x, b)
    eager_strides = _SEEN[-1]
    torch._dynamo.reset()
    got = torch.compile(fn, backend="coil")(x, b)
    torch.testing.assert_close(got, expected)
    assert _SEEN[-1] == eager_strides == (0, 6, 0, 1)


def test_broadcast_argument_read_by_two_calls_is_written_once() -> None:
    """One expanded mask read by two attention calls (a model's layers, after common
    subexpressions merged their expands) is written once and passed to both."""
    def fn(q, m):
        bias = (1.0 - m).unsqueeze(1).expand(8, 3, 49, 56)[..., :49]
        a = aten._scaled_dot_product_efficient_attention(q, q, q, bias, False)[0]
        return aten._scaled_dot_product_efficient_attention(a, a, a, bias, False)[0]

    q, m = torch.randn(8, 3, 49, 32), torch.rand(8, 49, 56)
    gm = make_fx(fn, tracing_mode="fake")(q, m)
    lowered = GraphLowering(gm, [q, m], lowering_registry(), Config()).run()
    calls = [n for n in lowered.nodes if isinstance(n, ir.ExternNode)]
    biases = {(n.args[3].name, n.args[3].layout.stride) for n in calls}
    assert len(calls) == 2 and len(biases) == 1
    assert next(iter(biases))[1] == (2744, 0, 56, 1)
    assert len(lowered.nodes) - len(calls) == 1


def test_broadcast_argument_passed_twice_to_one_call_is_written_once() -> None:
    def fn(b):
        e = (torch.sigmoid(b) * 2).expand(4, 3, 5, 6)
        return torch.ops.coil_test.strides_seen(e, e)

    args, writes = _extern_args(fn, torch.randn(1, 3, 1, 6))
    assert [a.layout.stride for a in args] == [(0, 6, 0, 1)] * 2 and args[0].name == args[1].name
    assert writes == 1
