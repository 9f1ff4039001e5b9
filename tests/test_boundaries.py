"""Where Coil's kernels meet anything else: forward and backward graphs that share a library
op's saved values, and ATen calls whose results arrive in a layout other than the one the
next kernel was generated for. Each case here once gave a wrong result with no error."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from helpers import check


def _train_like_eager(model: nn.Module, make_loss, steps: int = 3, atol: float = 1e-5,
                      rtol: float = 1e-4) -> None:
    """Loss, every gradient and the parameters after ``steps`` SGD steps match eager."""
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="coil")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(steps):
        for m, o, fwd in ((model, opt, compiled), (ref, ref_opt, ref)):
            o.zero_grad()
            make_loss(fwd).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=rtol, msg=f"step {step}: grad {name}")
        opt.step()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=atol, rtol=rtol, msg=f"parameter {name}")


class _CausalBlock(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def test_sdpa_gradients_match_eager():
    """The attention forward must not be decomposed while its backward is ATen's flash
    backward, which reads the forward's log-sum-exp (the decomposition returns the weights)."""
    torch.manual_seed(0)
    x = torch.randn(2, 10, 16)
    _train_like_eager(_CausalBlock(), lambda m: m(x).pow(2).mean())


def test_multihead_attention_trains_like_eager():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 6, 16)
    _train_like_eager(mha, lambda m: m(x, x, x, need_weights=False)[0].pow(2).mean())


def test_transformer_encoder_layer_trains_like_eager():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 6, 16)
    _train_like_eager(layer, lambda m: m(x).pow(2).mean(), atol=1e-4)


def test_channels_last_through_a_fallback():
    """A kernel writes the input's channels_last layout, the pooling fallback returns its own,
    and the next kernel reads with the strides eager would have."""
    x = torch.randn(2, 8, 8, 8).to(memory_format=torch.channels_last)
    # a 6x6 window (36 taps) is past what core/lowering/pooling.py unrolls: an ATen call
    report = check(lambda x: (F.max_pool2d(x.relu(), 6, 1) * 2).mean((2, 3)), x)
    assert report.fallbacks, "max_pool2d is expected to be an ATen fallback here"


def test_channels_last_conv_block_trains_like_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(8, 8, 3), nn.GELU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 12, 12).to(memory_format=torch.channels_last)
    _train_like_eager(model, lambda m: m(x).logsumexp(-1).mean(), atol=1e-4)


# An op whose fake (meta) function promises a contiguous result while the real kernel returns
# a column-major one: the wrapper must notice and hand the next kernel what it expects.
@torch.library.custom_op("coil_test::column_major_double", mutates_args=())
def _column_major_double(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).t().contiguous().t()


@_column_major_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def test_extern_result_in_an_unpredicted_layout():
    x = torch.randn(5, 7)
    fn = lambda x: torch.ops.coil_test.column_major_double(x.exp()) + 1  # noqa: E731
    report = check(fn, x)
    assert "restride(" in report.graphs[0].wrapper_source


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_fallback_between_kernels_in_both_layouts(fmt):
    x = torch.randn(2, 4, 6, 6).to(memory_format=fmt)
    check(lambda x: torch.sort(x.sigmoid(), dim=1)[0].sum(1) * 3, x)


def test_layout_check_knob_is_what_guards_an_unpredicted_layout():
    """Off, the column-major result reaches the next kernel unchecked (a wrong result); on by
    default, it is copied first."""
    x = torch.randn(5, 7)
    fn = lambda x: torch.ops.coil_test.column_major_double(x.exp()) + 1  # noqa: E731
    expected = fn(x)
    with coil.config.override(check_extern_layouts=False):
        report = coil.explain(fn, x)
    assert "restride(" not in report.graphs[0].wrapper_source
    assert not torch.allclose(report.result, expected)


def test_dynamic_index_dividing_by_a_product_keeps_its_parentheses():
    """``x0 // (5*s0)`` once printed as ``x0 / 5*s0`` in C++: out-of-bounds reads."""
    x = torch.randn(2, 5, 3, 4)
    check(lambda x: (x.permute(0, 2, 1, 3) * 2).reshape(-1, x.shape[-1]), x, dynamic=True)


def test_dynamic_fallback_size_in_a_torch_function():
    """A fallback's output size ``(s + 1)//2`` is torch's FloorDiv; it once made the stride
    check of that output (and then the kernel after it) fail to print."""
    x = torch.randn(3, 1, 2, 2)
    check(lambda a: torch.sort(a[::2], dim=0).values, x, dynamic=True)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_dynamic_layout_of_a_saved_activation(fmt):
    """With symbolic sizes, channels_last strides were not seen as dense: the forward wrote the
    saved ``tanh(a / 2)`` contiguous and the backward read it channels_last (found by the fuzzer)."""
    x = torch.randn(2, 3, 4, 5).to(memory_format=fmt)
    w = torch.randn(2, 3, 4, 5)
    fn = lambda a: torch.tanh(a / 2.0)  # noqa: E731
    a = x.clone(memory_format=torch.preserve_format).requires_grad_()
    expected = torch.autograd.grad((fn(a) * w).sum(), a)[0]
    b = x.clone(memory_format=torch.preserve_format).requires_grad_()
    out = torch.compile(fn, backend="coil", dynamic=True)(b)
    got = torch.autograd.grad((out * w).sum(), b)[0]
    torch.testing.assert_close(got, expected)


def test_backward_graph_inputs_in_an_unexpected_layout_are_copied():
    """A backward graph's inputs are the forward's outputs, which no Dynamo guard checks: one
    arriving in other strides than the graph was compiled for is copied into them first."""
    from coil.compile import compile_graph

    def bw(saved, grad):
        return (saved.cos() * grad,)

    example = (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), torch.randn(2, 3, 4, 5))
    gm = torch.fx.experimental.proxy_tensor.make_fx(bw)(*example)
    fn = compile_graph(gm, list(example), coil.config.get(), "backward")
    saved = example[0].contiguous()  # the same values, other strides
    (got,) = fn([saved, example[1]])
    torch.testing.assert_close(got, bw(*example)[0])


def test_a_backward_input_expected_expanded_is_copied_once():
    """A backward graph compiled for an expanded input (stride 0: BERT's position ids, saved
    for the embedding's backward) that arrives materialised: copying it into the expanded
    layout would write one element from several; its first slice is copied and expanded."""
    from coil.compile import compile_graph

    def bw(ids, grad):
        return (grad * ids.to(grad.dtype),)

    example = (torch.arange(16).expand(3, 16), torch.randn(3, 16))
    gm = torch.fx.experimental.proxy_tensor.make_fx(bw)(*example)
    fn = compile_graph(gm, list(example), coil.config.get(), "backward")
    (got,) = fn([example[0].contiguous(), example[1]])
    torch.testing.assert_close(got, bw(*example)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(2, 2), (37, 53)])
def test_selected_values_of_a_library_function_are_not_recomputed(dtype, shape):
    """``amax``'s gradient compares its input with the max: a ``tanh`` computed once by the
    vector libm (in the reduction) and once by the scalar one (in the mask) differed in the
    last bit, so the mask was empty and the gradient NaN (found by the fuzzer)."""
    torch.manual_seed(2203)  # (CUDA runs of the suite make tensors on the GPU by default)
    x = torch.randn(shape, dtype=dtype)
    for fn in (lambda a: torch.tanh(a).amax(), lambda a: torch.exp(a).amin(1).sum(),
               lambda a: torch.sin(a).max()):
        a = x.clone().requires_grad_()
        expected = torch.autograd.grad(fn(a), a)[0]
        b = x.clone().requires_grad_()
        got = torch.autograd.grad(torch.compile(fn, backend="coil")(b), b)[0]
        torch.testing.assert_close(got, expected)
    def picked(a):
        s = a.sin()
        return s == s.topk(2, dim=-1).values[..., -1:]
    check(picked, x)


@pytest.mark.parametrize("fn", [
    lambda x: F.max_pool2d(x, 2, ceil_mode=True).sin(),
    lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect").cos() * 2,
    lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True) + 1,
    lambda x: x[:, :, ::2].exp(),
], ids=["ceil_pool", "reflect_pad", "avg_pool", "step_slice"])
def test_dynamic_sizes_in_torch_functions(fn):
    """Symbolic sizes such as ``(s0 - 1)//2`` or ``Max(...)`` are torch's sympy functions; they
    are rewritten into Coil's before kernels see them (they failed to print)."""
    check(fn, torch.randn(2, 3, 9, 7), dynamic=True)


def test_torch_size_functions_keep_their_meaning():
    from torch.utils._sympy import functions as tf
    from coil.symbolic import FloorDiv, ModIdx, from_torch
    import sympy
    s = sympy.Symbol("s0", positive=True, integer=True)
    assert from_torch(tf.FloorDiv(s - 1, 2)) == FloorDiv(s - 1, 2)
    assert from_torch(tf.CeilDiv(s, 4)) == FloorDiv(s + 3, 4)
    assert from_torch(tf.ModularIndexing(s, 2, 3)) == ModIdx(FloorDiv(s, 2), 3)
    assert from_torch(tf.Max(s, 3) + 1) == sympy.Max(s, 3) + 1
    # a dividend that may be negative keeps Python's floor division: the wrapper computes it
    from coil.symbolic import derived_definitions
    d = from_torch(tf.FloorDiv(s - 3, 2) + 1)
    (sym,) = d.free_symbols
    assert d == sym + 1 and derived_definitions()[sym] == tf.FloorDiv(s - 3, 2)


def test_dynamic_size_with_a_dividend_of_unknown_sign():
    """A strided conv's output size ``(s1 - s0)//2`` (found by the fuzzer) is computed by the
    wrapper with Python's floor division, then passed to the kernels as a size."""
    w = torch.randn(4, 3, 2, 1)
    report = check(lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=2).relu(),
                   torch.randn(6, 7, 5), w, dynamic=True)
    assert "//" in report.graphs[0].wrapper_source


def test_dynamic_output_size_in_a_torch_function():
    """A graph returning a size ``(s + 1)//2`` (a chunk's, found by the fuzzer) printed it raw."""
    x = torch.randn(2, 4, 1, 6, requires_grad=True)
    fn = lambda a: a.chunk(2, 3)[0] * 2  # noqa: E731
    got = torch.compile(fn, backend="coil", dynamic=True)(x)
    torch.testing.assert_close(got, fn(x))
    got.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0).where(torch.arange(6) < 3, 0.0))


@pytest.mark.parametrize("fn", [
    lambda x, y: torch.softmax(x, -1) * x.shape[0],
    lambda x, y: x * y.shape[0] + x.shape[1],  # a size the kernel knows only as a scalar
    lambda x, y: (x.sum(-1) / x.shape[1]).to(torch.int64) * x.shape[0],
], ids=["softmax_times_rows", "other_input_size", "int_result"])
def test_a_symbolic_size_used_as_a_scalar_stays_symbolic(fn):
    """With dynamic=True, a size used as a number (``softmax(x) * x.shape[0]``) was turned
    into a constant by the lowering, which added the guard ``Eq(s0, 3)``: every size compiled
    again. It is an index expression used as data now: two sizes, one compile."""
    from coil import compile as cc
    reports = []
    cc.add_observer(reports.append)
    try:
        compiled = torch.compile(fn, backend="coil", dynamic=True)
        for rows in (3, 6):
            x, y = torch.randn(rows, rows + 2), torch.randn(rows + 5)
            torch.testing.assert_close(compiled(x, y), fn(x, y))
    finally:
        cc.remove_observer(reports.append)
    assert len(reports) == 1 and reports[0].symbolic


@pytest.mark.parametrize("f", [
    lambda x, k: x[-k:] * 2, lambda x, k: x[:-k] * 2, lambda x, k: x[-k:-1] * 2,
    lambda x, k: x[k:] * 2, lambda x, k: x[:k] * 2,
    lambda x, k: x[-(x.shape[0] // 3):] * 2,  # 0 for short x, and x[-0:] is all of x
    lambda x, k: x[x.shape[0] - 2 * x.shape[0] // 3 - 2 * x.shape[0]:] * 2,
], ids=["neg_start", "neg_end", "neg_both", "start", "end", "size_start", "unknown_sign"])
def test_symbolic_slice_bounds_count_from_the_end_as_in_python(f):
    """A negative bound that is a symbol (``x[-k:]`` under ``dynamic=True``) was taken as it
    was: the slice came out too long and read memory before the tensor (session 30)."""
    compiled = torch.compile(f, backend="coil", dynamic=True)
    for n, k in [(5, 2), (7, 3), (4, 9), (2, 1)]:
        x = torch.arange(2.0 * n).reshape(n, 2)
        expected, got = f(x, k), compiled(x, k)
        assert got.shape == expected.shape and torch.equal(got, expected), (n, k)
    torch._dynamo.reset()


class _TableReads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(10.0))  # a buffer's size stays static

    def forward(self, x):
        n = x.shape[0]
        return self.table[:n] * 1, self.table[n:n + 3] + 1


@pytest.mark.parametrize("f", [
    lambda x: x[-10:] * 2, lambda x: x[:10] * 2, lambda x: x[5:10] + 1, lambda x: (x * 3)[-6:],
    lambda x: torch.cat([x] * 5, 1)[:, 1:5:2] + 0, lambda x: torch.slice_scatter(x, x[:3] * 0 - 1, 0, -3),
], ids=["neg_start", "end", "both", "lazy", "strided", "scatter"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_numeric_slice_bounds_are_clamped_to_a_symbolic_size(f, dynamic):
    """``x[:10]`` of a symbolic size was 10 rows whatever the size, reading past the tensor;
    ``x[-10:]`` started before it; a slice_scatter at -3 of 2 rows wrote one row (session 31).
    ``dynamic=None`` is torch.compile's default: the second size makes the graph symbolic."""
    compiled = torch.compile(f, backend="coil", dynamic=dynamic)
    for n in [20, 12, 7, 2, 1]:
        x = torch.arange(float(n)).view(n, 1)
        expected, got = f(x), compiled(x)
        assert got.shape == expected.shape and torch.equal(got, expected), n
    torch._dynamo.reset()


def test_a_symbolic_slice_of_a_constant_table_and_writes_through_one_stay_inside():
    """Bounds from a symbolic size over a tensor of fixed size (a position table) and an
    assignment to ``x[-4:]`` of a shorter x (garbage was written, session 31)."""
    module = _TableReads()
    compiled = torch.compile(module, backend="coil", dynamic=True)
    for n in [4, 9, 12]:
        for got, expected in zip(compiled(torch.zeros(n)), module(torch.zeros(n))):
            assert got.shape == expected.shape and torch.equal(got, expected), n

    def write(x, v):
        x[-4:] = v
        return x

    compiled = torch.compile(write, backend="coil", dynamic=True)
    for n in [6, 2]:
        assert torch.equal(compiled(torch.zeros(n), torch.tensor(7.0)), write(torch.zeros(n), torch.tensor(7.0)))
    compiled = torch.compile(lambda x: x.sin()[-4:], backend="coil", dynamic=True)
    for n in [7, 3]:
        x = torch.randn(n, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        x.sin()[-4:].sum().backward()
        compiled(x2).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)
    torch._dynamo.reset()


_ROWS = torch.arange(40.0).reshape(10, 4)


@pytest.mark.parametrize("f", [
    lambda x, y: x[-y.shape[0]] * 1, lambda x, y: x[y.shape[0] - x.shape[0] + 1] * 1,
    lambda x, y: x.select(1, -y.shape[0]) * 1, lambda x, y: (x * 3)[-y.shape[0]],
], ids=["negative", "unknown_sign", "dim1", "lazy"])
def test_a_symbolic_negative_index_counts_from_the_end(f):
    """``x[-n]`` with a symbolic n read the rows before x (session 31)."""
    compiled = torch.compile(f, backend="coil", dynamic=True)
    for n in [2, 3, 1]:
        x, y = _ROWS[5:], torch.zeros(n)
        torch.testing.assert_close(compiled(x, y), f(x, y), atol=0, rtol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("f", [
    lambda x: x[: int(x.shape[0] * 0.5)] * 2, lambda x: x[: math.ceil(x.shape[0] / 3)] * 2,
    lambda x: F.interpolate(x.view(1, 1, -1, 1), scale_factor=1.5, mode="bilinear", align_corners=True),
], ids=["trunc", "ceil", "interpolate"])
def test_sizes_computed_from_floats(f):
    """A size derived from a float one printed as ``math.trunc(...)`` in a wrapper without
    ``math`` (a NameError on every call, session 31)."""
    compiled = torch.compile(f, backend="coil", dynamic=True)
    for n in [7, 9, 4]:
        x = torch.arange(float(n))
        torch.testing.assert_close(compiled(x), f(x))
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [True, None, False])
def test_a_view_of_a_mutated_input_is_a_view_of_it(dynamic):
    """``x.add_(1); return x[n:]`` with a symbolic n: AOTAutograd rebuilt the output from x
    with the offset of Coil's compact copy (0), so it showed x's first rows (session 31)."""
    def f(x, y):
        x.add_(1)
        return x[y.shape[0]:], x[y.shape[0]], x[1:1 + y.shape[0]].t()

    compiled = torch.compile(f, backend="coil", dynamic=dynamic)
    for n in [3, 2, 1]:
        x = torch.arange(10.0).reshape(5, 2)
        x_eager = x.clone()
        for got, expected in zip(compiled(x, torch.zeros(n)), f(x_eager, torch.zeros(n))):
            assert torch.equal(got, expected) and got.stride() == expected.stride()
            assert got.storage_offset() == expected.storage_offset()
            assert got.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert torch.equal(x, x_eager)
    torch._dynamo.reset()


def test_a_view_of_a_mutated_input_with_an_offset_of_its_own():
    """The input a view of a larger tensor: its offset was counted twice (a review, session
    31); a non-dense input of static sizes still compiles (AOTAutograd replays its views)."""
    def f(x, y):
        x.add_(1)
        return x[y.shape[0]:]

    compiled = torch.compile(f, backend="coil", dynamic=True)
    for rows, n in [(10, 2), (6, 3), (12, 1)]:
        base = torch.arange(2.0 * rows).reshape(rows, 2)
        base_eager = base.clone()
        got, expected = compiled(base[1:6], torch.zeros(n)), f(base_eager[1:6], torch.zeros(n))
        assert torch.equal(got, expected) and got.storage_offset() == expected.storage_offset()
        assert torch.equal(base, base_eager)
    torch._dynamo.reset()

    def g(x):
        x.mul_(2)
        return x[1:]

    base, base_eager = torch.arange(24.0).reshape(6, 4), torch.arange(24.0).reshape(6, 4)
    report = coil.explain(g, base[:, :3])
    expected = g(base_eager[:, :3])
    assert torch.equal(report.result, expected) and torch.equal(base, base_eager)
    assert not any(f.op == "<whole graph>" for graph in report.graphs for f in graph.fallbacks)


@pytest.mark.parametrize("size", [(2, 3, 1, 1), (2, 3, 1, 6), (2, 3, 4, 5)])
def test_affine_grid_with_a_one_element_dim_compiles(size):
    """PyTorch's decomposition of ``affine_grid`` builds a one-element dim's grid with
    ``torch.tensor``, whose ``detach_`` AOTAutograd refused: Coil's compile failed where eager
    ran (session 30)."""
    f = lambda t: (F.affine_grid(t, size, align_corners=False) ** 2).sum()  # noqa: E731
    theta = torch.randn(2, 2, 3)
    torch.testing.assert_close(torch.compile(f, backend="coil")(theta), f(theta))
    torch._dynamo.reset()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("target", [[[3, 0, -1, 1], [-1, 0, 0, 0]], [[1, 2, 3, 0], [2, -1, 3, 3]]],
                         ids=["terminated", "full"])
def test_multilabel_margin_loss_stays_atens(target, reduction):
    """PyTorch's decomposition, which AOTAutograd takes whatever the table says, counts classes
    past a row's -1 terminator (2.05 for eager's 0.85; session 30): the op stays whole
    (``coil.kept_whole``), forward and backward."""
    x = torch.tensor([[0.1, 0.2, 0.4, 0.8], [0.5, -0.3, 0.9, 0.0]], requires_grad=True)
    t = torch.tensor(target)
    f = lambda x, t: F.multilabel_margin_loss(x, t, reduction=reduction) * 2  # noqa: E731
    expected = f(x, t)
    (grad,) = torch.autograd.grad(expected.sum(), x)
    got = torch.compile(f, backend="coil")(x, t)
    (got_grad,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got_grad, grad)
    torch._dynamo.reset()
