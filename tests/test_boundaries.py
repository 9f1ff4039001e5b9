"""Where Coil's kernels meet anything else: forward and backward graphs that share a library
op's saved values, and ATen calls whose results arrive in a layout other than the one the
next kernel was generated for. Each case here once gave a wrong result with no error."""
from __future__ import annotations

import copy

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
    report = check(lambda x: (F.max_pool2d(x.relu(), 2) * 2).mean((2, 3)), x)
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


def test_dynamic_fallback_sizes_the_printer_cannot_spell_skip_the_stride_check():
    """A fallback's output size ``(s + 1)//2`` is torch's FloorDiv, which the wrapper's printer
    does not spell: the stride check of that output is left out, the compile goes on."""
    x = torch.randn(3, 1, 2, 2)
    check(lambda a: torch.sort(a[::2], dim=0).values, x, dynamic=True)
