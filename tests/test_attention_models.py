"""The attention rewrite (coil.attention) on modules as models write them: GPT-2 and BERT
style blocks and Hugging Face models on their ``eager`` attention path, trained against eager
(outputs, every parameter's gradient, parameters after SGD steps) and run without gradients."""
from __future__ import annotations

import collections
import contextlib
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import coil
from coil import attention
from test_attention_rewrite import _uses_sdpa, autocast_bf16, check_inference


# ----------------------------------------------------------------------------- modules


class CausalSelfAttention(nn.Module):
    """GPT-2 style (nanoGPT's slow path): a registered tril buffer, masked_fill with -inf."""

    def __init__(self, dim: int = 24, heads: int = 3, block: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.attn_dropout = nn.Dropout(dropout)
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class BertSelfAttention(nn.Module):
    """BERT style: an additive mask (0 or finfo.min) built from the padding mask."""

    def __init__(self, dim: int = 24, heads: int = 3) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.1)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        extended = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + extended
        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.shape[0], ctx.shape[1], -1)


def _train_like_eager(model: nn.Module, inputs, autocast: bool, steps: int = 2,
                      read=1.0) -> collections.Counter:
    """Outputs, every parameter's gradient and the parameters after SGD steps match eager
    (the loss reads the outputs where ``read`` is nonzero)."""
    tol = dict(atol=3e-2, rtol=3e-2) if autocast else dict(atol=1e-5, rtol=1e-4)
    ref = copy.deepcopy(model)
    before = collections.Counter(attention.rewrites)
    compiled = torch.compile(model, backend="coil")
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    ctx = autocast_bf16 if autocast else contextlib.nullcontext
    for step in range(steps):
        outs = []
        for fwd, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad()
            with ctx():
                out = fwd(*inputs)
            (out.float().pow(2) * read).mean().backward()
            outs.append(out)
        assert outs[0].dtype == outs[1].dtype
        torch.testing.assert_close(outs[0], outs[1], **tol, msg=f"step {step}: output")
        for (name, p), r in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, r.grad, **tol, msg=f"step {step}: grad {name}")
        opt.step()
        ref_opt.step()
    return collections.Counter(attention.rewrites) - before


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16"])
def test_gpt2_style_block(autocast):
    torch.manual_seed(0)
    model = CausalSelfAttention()
    x = torch.randn(2, 10, 24)
    # the causal mask is a buffer (its values are never trusted): an attend mask, not is_causal
    assert _train_like_eager(model, (x,), autocast) == {"bool": 1}


def test_gpt2_style_block_in_eval_with_dropout():
    torch.manual_seed(0)
    model = CausalSelfAttention(dropout=0.1).eval()
    x = torch.randn(2, 10, 24)
    report = coil.explain(model, x)
    torch.testing.assert_close(report.result, model(x), atol=1e-5, rtol=1e-4)
    assert _uses_sdpa(report)


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16"])
def test_bert_style_additive_mask(autocast):
    torch.manual_seed(0)
    model = BertSelfAttention().eval()  # dropout in eval: the identity
    x = torch.randn(3, 9, 24)
    attention_mask = torch.ones(3, 9)
    attention_mask[1, 6:] = 0
    attention_mask[2] = 0  # an all-padding sequence: every row masked, uniform as in eager
    # the loss reads non-padding positions only, as a masked language model's does
    # with gradients the chain stays as written (an all-padding row's gradients, see
    # test_gradients_of_rows_a_finite_fill_masks_fully_are_eagers); without, it is rewritten
    assert _train_like_eager(model, (x, attention_mask), autocast) == {}  # every row read
    assert check_inference(model, x, attention_mask, autocast=autocast) == {"additive": 1}


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_transformers_eager_attention(name):
    """Hugging Face models on their ``eager`` attention path: every layer is rewritten."""
    from models.imports import import_optional
    tf = import_optional("transformers")
    if tf is None:
        pytest.skip("transformers is not installed")
    torch.manual_seed(0)
    if name == "bert":
        cfg = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                            vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = tf.BertModel(cfg, add_pooling_layer=False)
    else:
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        model = tf.GPT2Model(cfg)
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 100, (2, 12))
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, 8:] = 0
    got = _train_like_eager(_LastHiddenState(model), (ids, padding), autocast=False)
    assert got == {}  # gradients: Hugging Face's (1 - mask) * finfo.min may fill whole rows
    assert check_inference(_LastHiddenState(model), ids, padding) == {"additive": 2}


class _LastHiddenState(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
