"""Masks the attention rewrite must read as eager does (found by hunts against eager and a
review, session 31): a float32 position bias under bf16 autocast stays as written (rounding
it to bf16 for the call moved weights by up to 0.18), Hugging Face's ``(1 - mask) *
finfo.min`` is still rewritten, and rows whose every key an additive mask sets to -inf are
NaN, as in eager, with or without autocast."""
from __future__ import annotations

import collections
import math

import pytest
import torch
import torch.nn.functional as F

from coil import attention
from test_attention_rewrite import (B, E, H, L, S, _additive, _qkv, _rows_read, autocast_bf16, check, check_bf16,
                                   check_inference)


def _biased(q, k, v, bias):
    s = q @ k.transpose(-1, -2) * E**-0.5 + bias
    return s.softmax(-1).to(v.dtype) @ v


def test_a_float32_position_bias_under_bf16_autocast_stays_float32():
    """ALiBi-style bias in float32 under bf16 autocast: rounding it to bf16 for the call moved
    the weights by up to 0.18 where eager adds it in float32 (session 31); the chain stays."""
    q, k, v = (x.detach() for x in _qkv(96, 96, dtype=torch.float32))
    pos = torch.arange(96.0)
    bias = (torch.tensor([0.7, 0.35, 0.18])[:, None, None] * (pos[None, :] - pos[:, None]))[None]
    before = collections.Counter(attention.rewrites)
    with autocast_bf16():
        got, expected = torch.compile(_biased, backend="coil")(q, k, v, bias), _biased(q, k, v, bias)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    assert collections.Counter(attention.rewrites) == before


_ONE_MINUS = {"operator": lambda x: 1.0 - x, "rsub": lambda x: torch.rsub(x, 1.0),
              "method": lambda x: x.__rsub__(1.0)}


@pytest.mark.parametrize("spelling", _ONE_MINUS)
def test_an_hf_style_padding_mask_under_bf16_autocast_is_still_rewritten(spelling):
    """``(1 - mask) * finfo.min`` holds 0 and a swamping fill: rounding it changes nothing.
    ``1 - mask`` in each spelling a graph may hold (the rewrite did not happen on the GPU
    machine's torch 2.11, session 33)."""
    q, k, v = (x.detach() for x in _qkv())
    am = torch.ones(B, S, dtype=torch.long)
    am[0, :3] = 0
    one_minus = _ONE_MINUS[spelling]

    def fn(q, k, v, am):
        ext = one_minus(am[:, None, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
        return _biased(q, k, v, ext)

    before = collections.Counter(attention.rewrites)
    with autocast_bf16():
        got, expected = torch.compile(fn, backend="coil")(q, k, v, am), fn(q, k, v, am)
    torch.testing.assert_close(got, expected, atol=3e-2, rtol=3e-2)
    assert collections.Counter(attention.rewrites) - before == {"additive": 1}


def test_an_additive_minus_infinity_mask_over_a_whole_row_is_nan_as_in_eager():
    q, k, v = (x.detach() for x in _qkv())
    mask = torch.zeros(B, 1, 1, S).masked_fill(torch.tensor([[False] * S, [True] * S])[:, None, None, :],
                                               float("-inf"))
    got = torch.compile(_biased, backend="coil")(q, k, v, mask)
    expected = _biased(q, k, v, mask)
    assert got.isnan().sum() == expected.isnan().sum() > 0
    torch.testing.assert_close(got, expected, equal_nan=True, atol=1e-5, rtol=1e-4)


def test_a_float32_minus_infinity_row_under_bf16_autocast_is_nan_as_in_eager():
    """A float32 mask is clamped to bf16's range for the call; eager's NaN for a row whose
    every key is -inf is read from the mask before the clamp (a review, session 31)."""
    q, k, v = (x.detach() for x in _qkv())
    pad = torch.tensor([[False] * S, [True] * S])

    def fn(q, k, v, pad):
        return _biased(q, k, v, torch.zeros(B, 1, 1, S).masked_fill(pad[:, None, None, :], float("-inf")))

    before = collections.Counter(attention.rewrites)
    with autocast_bf16():
        got, expected = torch.compile(fn, backend="coil")(q, k, v, pad), fn(q, k, v, pad)
    assert collections.Counter(attention.rewrites) - before == {"additive": 1}
    assert got.isnan().sum() == expected.isnan().sum() > 0
    torch.testing.assert_close(got, expected, equal_nan=True, atol=3e-2, rtol=3e-2)


def test_additive_float32_mask_under_autocast_keeps_masked_rows_uniform():
    """Autocast would round finfo(float32).min to -inf in bf16 (rows of NaN or zeros); the
    rewrite clamps the mask to bf16's range first. The mask is built in the graph, as Hugging
    Face builds it (``(1 - keep) * finfo.min``: 0 or a swamping fill, which rounding keeps)."""
    keep = torch.ones(B, 1, 1, S)
    keep[0] = 0  # batch 0 hides every key
    read = _rows_read(torch.arange(B)[:, None, None].expand(B, H, L) == 0)

    def fn(q, k, v, keep):
        return _additive(q, k, v, (1.0 - keep) * torch.finfo(torch.float32).min)

    assert check_bf16(fn, *_qkv(), keep, read=read) == {}  # gradients: stays as written
    assert check_inference(fn, *_qkv(), keep, autocast=True) == {"additive": 1}
    q, k, v = (x.detach() for x in _qkv())
    with torch.no_grad(), autocast_bf16():
        out = torch.compile(fn, backend="coil")(q, k, v, keep)
    torch.testing.assert_close(out[0].float(), v[0].mean(-2, keepdim=True).expand(H, L, E), atol=2e-2, rtol=2e-2)


def _where_minus_1e9(q, k, v, keep):
    s = q @ k.transpose(-2, -1) * E**-0.5
    return (s + torch.where(keep, 0.0, -1e9)).softmax(-1) @ v


def _prefix_lm(q, k, v):
    keep = torch.tril(torch.ones(L, L, dtype=torch.bool))
    keep[:, :3] = True  # the prefix is visible to every query: no longer causal
    return (q @ k.transpose(-2, -1) * 0.3).masked_fill(~keep, float("-inf")).softmax(-1) @ v


def _scale_written_in_place(q, k, v):
    t = torch.tensor(8.0)
    t.mul_(4)
    return ((q @ k.transpose(-2, -1)) / t).softmax(-1) @ v


def _bf16_positions(q, k, v):
    pos = torch.arange(q.shape[-2], dtype=torch.bfloat16, device=q.device)  # 257 rounds to 256
    s = q @ k.transpose(-2, -1) * 0.25
    return s.masked_fill(pos[None, :] > pos[:, None], float("-inf")).softmax(-1) @ v


def _nan_fill(q, k, v):
    s = q @ k.transpose(-2, -1) * 0.3
    return s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("nan")).softmax(-1) @ v


def test_what_the_rewrite_must_not_take_for_a_mask_or_a_scale():
    """Found by a hunt against eager (session 32): a large finite constant in an additive mask
    with gradients (SDPA's backward loses -1e9's bits: gradients up to 7.7 apart), a causal
    mask written in place afterwards, a 0-d scale written in place, positions a bfloat16
    arange rounds, a NaN fill (read as a swamping one). Each stays as written, as eager."""
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[0] = False  # a sequence of padding only: every row of it fully masked
    assert check(_where_minus_1e9, *_qkv(), keep) == {}
    assert check_inference(_where_minus_1e9, *_qkv(), keep) == {"additive": 1}
    assert check(_prefix_lm, *_qkv(L, L)) == {"bool": 1}  # a mask, not is_causal
    assert check(_scale_written_in_place, *_qkv(L, L)) == {}
    assert check_inference(_nan_fill, *_qkv(L, L)) == {}  # NaN rows as eager's
    q, k, v = (x.detach() for x in _qkv(300, 300))
    assert check_inference(_bf16_positions, q, k, v) == {"bool": 1}  # a mask, not is_causal


def _overflowing_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """SDPA as CUDA's fused kernels compute it: the masked scores times log2(e) in float32,
    where ``finfo.min`` overflows to -inf, and a row of -inf only giving zeros."""
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.float()
    t = s * math.log2(math.e)
    p = torch.exp2(t - t.amax(-1, keepdim=True)).nan_to_num(0.0)
    return ((p / p.sum(-1, keepdim=True)).nan_to_num(0.0).to(v.dtype) @ v.float()).to(v.dtype)


class _FusedKernels(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return _overflowing_sdpa(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fill", ["finfo_min", "distinct"])
def test_rows_of_swamping_values_survive_a_kernel_that_overflows_them(fill):
    """CUDA's fused kernels overflow ``finfo.min`` (times log2(e)) to -inf: BERT's all-padding
    sequence came out as zeros on an H100 where eager averages v (session 33). The call's mask
    now holds no value a kernel overflows and gives eager's weights: a row of one swamping
    value is uniform, a row of distinct ones weighs its largest alone, and a swamping value
    beside an ordinary one weighs 0."""
    q, k, v = (x.detach() for x in _qkv())
    mn = torch.finfo(torch.float32).min
    mask = torch.zeros(B, 1, 1, S)
    if fill == "finfo_min":
        mask[0, ..., 3:] = mn
        mask[1] = mn
    else:
        mask[0] = mn
        mask[0, ..., 1:3] = mn * 0.9
        mask[1, ..., 2] = float("-inf")
        mask[1, ..., 4] = mn
    graphs = []

    def backend(gm, example_inputs):
        attention.rewrite_attention(gm)
        gm.recompile()
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(_biased, backend=backend)
        compiled(q, k, v, mask)  # compiles
        with _FusedKernels():
            got = compiled(q, k, v, mask)
        expected = _biased(q, k, v, mask)
    assert "scaled_dot_product_attention" in graphs[0].code
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pad_fill, rewritten", [(-1e9, False), (torch.finfo(torch.float32).min, True)])
def test_two_additive_masks_are_summed_only_where_the_order_cannot_round(pad_fill, rewritten):
    """A position bias, then a padding mask: eager rounds ``(s + bias) + pad``, the call would
    ``s + (bias + pad)``. With -1e9 (spacing 64 there) a fully padded row's weights moved by
    up to 3.7 (a hunt, session 39): such a chain stays. A swamping fill (Hugging Face's
    ``finfo.min``) rounds the same either way and is still rewritten (T5)."""
    torch.manual_seed(0)
    q, k, v = (x.detach() for x in _qkv(dtype=torch.float32))
    bias = torch.randn(1, H, L, S) * 30
    pad = torch.ones(B, S)
    pad[1, :] = 0  # the second sequence is padding only

    def fn(q, k, v, bias, pad):
        s = q @ k.transpose(-2, -1) + bias
        s = s + (1.0 - pad[:, None, None, :]) * pad_fill
        return s.softmax(-1) @ v

    before = collections.Counter(attention.rewrites)
    got, expected = torch.compile(fn, backend="coil")(q, k, v, bias, pad), fn(q, k, v, bias, pad)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (collections.Counter(attention.rewrites) - before == {"additive": 1}) == rewritten
