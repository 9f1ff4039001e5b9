"""Masks a graph builds from constants alone (``coil.full_masks``): True everywhere, as
transformers 5.17 builds one for bidirectional encoders under ``torch.compile``, leaves the
``scaled_dot_product_attention`` call; the causal triangle becomes ``is_causal=True``; every
other mask stays. Coil against eager, forward and backward."""
from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F

from coil import full_masks

from models import imports, zoo

B, H, L, S, E = 2, 3, 6, 6, 8
# masks are built on the queries' device, as models build them (Dynamo 2.11 puts a factory of a
# CUDA default device on the CPU when no input is there)


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Drawn from a CPU generator, on the default device (the same numbers under
    ``COIL_TEST_DEVICE=cuda``), as a leaf that wants its gradient."""
    return torch.randn(*shape, generator=g, device="cpu").to(torch.get_default_device()).requires_grad_()


def _qkv(batch: int = B):
    g = torch.Generator().manual_seed(0)
    return [_randn(g, batch, H, n, E) for n in (L, S, S)]


def _sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def transformers_bidirectional(q, k, v):
    """transformers 5.17's ``sdpa_mask`` for a bidirectional encoder, as Dynamo sees it."""
    q_idx = (torch.arange(L, device=q.device) + 0)[None, None, :, None]
    return _sdpa(q, k, v, (q_idx >= 0).expand(q.shape[0], -1, L, S))


def kv_below_length(q, k, v):
    return _sdpa(q, k, v, torch.arange(S, device=q.device)[None, None, None, :] < S)


def both_and_ones(q, k, v):
    rows = torch.arange(2, L + 2, device=q.device).view(1, 1, L, 1) - 2 >= 0
    cols = torch.ones(1, 1, 1, S, dtype=torch.bool, device=q.device)
    return _sdpa(q, k, v, (rows & cols).expand(q.shape[0], H, L, S))


def positional(q, k, v):
    full = torch.full((L, S), True, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, full, 0.0)


KEPT_EVERYWHERE = {f.__name__: f for f in (transformers_bidirectional, kv_below_length, both_and_ones, positional)}


def from_one(q, k, v):
    return _sdpa(q, k, v, (torch.arange(L, device=q.device) >= 1)[None, None, :, None].expand(q.shape[0], -1, L, S))


def shifted_below_zero(q, k, v):
    # a full [L, S] mask: eager's CUDA kernels refuse one whose last dim is broadcast
    rows = (torch.arange(L, device=q.device) - 1)[None, None, :, None] >= 0
    return _sdpa(q, k, v, rows & torch.ones(1, 1, 1, S, dtype=torch.bool, device=q.device))


def last_key_masked(q, k, v):
    return _sdpa(q, k, v, torch.arange(S, device=q.device)[None, None, None, :] < S - 1)


def causal_but_one_batch(q, k, v):
    idx = torch.arange(L, device=q.device)
    mask = (idx[None, :] <= idx[:, None]).expand(q.shape[0], 1, L, S).clone()
    mask[0, 0, 3, 1] = False  # an effect (setitem): the pass must not evaluate this
    return _sdpa(q, k, v, mask)


def strict_triangle(q, k, v):
    idx = torch.arange(L, device=q.device)
    return _sdpa(q, k, v, (idx[None, :] < idx[:, None]) | (idx[None, :] == 0))


MASKING = {f.__name__: f for f in (from_one, shifted_below_zero, last_key_masked, causal_but_one_batch,
                                   strict_triangle)}


def causal_from_aranges(q, k, v):
    idx = torch.arange(L, device=q.device)
    return _sdpa(q, k, v, idx[None, :] <= idx[:, None])


def causal_from_tril(q, k, v):
    return _sdpa(q, k, v, torch.ones(L, S, dtype=torch.bool, device=q.device).tril().expand(q.shape[0], H, L, S))


CAUSAL = {f.__name__: f for f in (causal_from_aranges, causal_from_tril)}


def _run(fn, args):
    args = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*args)
    out.sum().backward()
    return out, [a.grad for a in args]


def _check(fn, args) -> collections.Counter:
    """Coil against eager (output, gradients); returns the masks this compile changed."""
    torch._dynamo.reset()
    before = collections.Counter(full_masks.changed)
    out_e, grads_e = _run(fn, args)
    out_c, grads_c = _run(torch.compile(fn, backend="coil"), args)
    torch.testing.assert_close(out_c, out_e, atol=1e-5, rtol=1e-4)
    for gc, ge in zip(grads_c, grads_e):
        torch.testing.assert_close(gc, ge, atol=1e-5, rtol=1e-4)
    return collections.Counter(full_masks.changed) - before


@pytest.mark.parametrize("name", sorted(KEPT_EVERYWHERE))
def test_a_mask_true_everywhere_is_dropped(name):
    assert _check(KEPT_EVERYWHERE[name], _qkv()) == {"none": 1}


@pytest.mark.parametrize("name", sorted(CAUSAL))
def test_a_causal_mask_becomes_is_causal(name):
    assert _check(CAUSAL[name], _qkv()) == {"causal": 1}


@pytest.mark.parametrize("name", sorted(MASKING))
def test_any_other_mask_stays(name):
    assert _check(MASKING[name], _qkv()) == {}


def test_query_key_and_value_by_keyword():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(query=q, key=k, value=v,
                                              attn_mask=torch.ones(L, S, dtype=torch.bool, device=q.device))
    assert _check(fn, _qkv()) == {}


def test_a_mask_read_from_an_input_stays():
    """Its values may change without a recompile, all True today or not."""
    mask = torch.ones(B, 1, L, S, dtype=torch.bool)
    assert _check(lambda q, k, v: _sdpa(q, k, v, mask), _qkv()) == {}


def test_a_causal_mask_with_more_keys_than_queries_stays():
    g = torch.Generator().manual_seed(0)
    q, k, v = (_randn(g, B, H, n, E) for n in (L, L + 2, L + 2))

    def fn(q, k, v):
        return _sdpa(q, k, v, torch.ones(L, L + 2, dtype=torch.bool, device=q.device).tril())
    assert _check(fn, [q, k, v]) == {}


def test_grouped_query_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (_randn(g, B, h, L, E) for h in (4, 2, 2))

    def fn(q, k, v):
        idx = torch.arange(L, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=idx[None, :] <= idx[:, None], enable_gqa=True)
    assert _check(fn, [q, k, v]) == {"causal": 1}


def test_the_knob_turns_it_off():
    torch._dynamo.reset()
    before = collections.Counter(full_masks.changed)
    q, k, v = (t.detach() for t in _qkv())
    compiled = torch.compile(transformers_bidirectional, backend="coil", options={"attention_rewrite": False})
    torch.testing.assert_close(compiled(q, k, v), transformers_bidirectional(q, k, v))
    assert collections.Counter(full_masks.changed) == before


def test_a_transformers_decoder_gets_is_causal():
    """transformers builds a causal LM's mask in the graph (5.24: from position ids, with a
    check for packed sequences); every layer's call gets ``is_causal`` instead."""
    imports.import_optional("transformers")
    pytest.importorskip("transformers")
    built = zoo.build("hf_llama", "small")
    model = built.model.eval()
    torch._dynamo.reset()
    before = collections.Counter(full_masks.changed)
    with torch.no_grad():
        expected = model(*built.args, **built.kwargs).logits
        got = torch.compile(model, backend="coil")(*built.args, **built.kwargs).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    layers = model.config.num_hidden_layers
    assert collections.Counter(full_masks.changed) - before == {"causal": layers}


@pytest.mark.parametrize("scale", [-0.5, 0.0])
def test_a_causal_mask_with_a_scale_not_positive_stays(scale):
    """torch's CPU flash kernel returns NaN rows under ``is_causal`` with such a scale, where
    the call with its mask is finite (found by a hunt)."""
    def fn(q, k, v):
        idx = torch.arange(L, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=idx[None, :] <= idx[:, None], scale=scale)
    assert _check(fn, _qkv()) == {}
