"""The CPU benchmark's workloads (``bench/cpu.py``): each one's fixed-size inputs, the function
that gets compiled, and :func:`make_step`, the callable that is timed.

Every float32 tensor is 24 MiB (6,291,456 floats, 1536x4096 for 2-D ones); the bf16 workload
uses 3072x4096 so its tensors are 24 MiB too (``bench/cpu.py``'s docstring says why). The GPT
block and the MLP training step are small and matmul-bound. ``bench/warm_start.py`` runs the
same workloads, reaching them as ``cpu.WORKLOADS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from common import Tensors  # bench/ is on sys.path

NUMEL = 6_291_456  # float32 elements in 24 MiB
ROWS, COLS = 1536, 4096  # 2-D fp32 shape with NUMEL elements


@dataclass(frozen=True)
class Workload:
    """One benchmark case.

    ``fn(*make_inputs())`` is what gets compiled.  For ``training`` workloads
    ``fn`` returns a scalar loss; the timed step is forward + ``backward()`` and
    its outputs are the loss plus the gradients of every input that requires
    grad.  Inference workloads run under ``torch.no_grad()``.
    """

    name: str
    description: str
    make_inputs: Callable[[], Tensors]
    fn: Callable[..., torch.Tensor]
    bandwidth_bound: bool = True
    training: bool = False
    atol: float = 1e-4
    rtol: float = 1e-4


def _randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32).mul_(scale).to(dtype)


# 1. pointwise chain -------------------------------------------------------- #
def pointwise_inputs() -> Tensors:
    return (_randn(NUMEL),)


def pointwise_fn(x: torch.Tensor) -> torch.Tensor:
    y = x * 2.0 + 1.0
    y = torch.sin(y) * torch.sigmoid(x)
    y = torch.relu(y) - 0.25 * torch.tanh(x)
    return y * y + torch.exp(-x.abs())


# 2. bias + GELU + residual, bf16 ------------------------------------------- #
BF16_ROWS = 2 * ROWS  # bf16 tensors are 24 MiB too


def bias_gelu_residual_inputs() -> Tensors:
    return (
        _randn(BF16_ROWS, COLS, dtype=torch.bfloat16),
        _randn(COLS, dtype=torch.bfloat16),
        _randn(BF16_ROWS, COLS, dtype=torch.bfloat16),
    )


def bias_gelu_residual_fn(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias) + residual


# 3. softmax ---------------------------------------------------------------- #
def matrix_inputs() -> Tensors:
    return (_randn(ROWS, COLS),)


def softmax_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


# 4. layer norm --------------------------------------------------------------- #
def layernorm_inputs() -> Tensors:
    return (_randn(ROWS, COLS), 1.0 + _randn(COLS, scale=0.1), _randn(COLS, scale=0.1))


def layernorm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


# 5. RMS norm ----------------------------------------------------------------- #
def rmsnorm_inputs() -> Tensors:
    return (_randn(ROWS, COLS), 1.0 + _randn(COLS, scale=0.1))


def rmsnorm_fn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


# 6./7. sums ------------------------------------------------------------------ #
def transpose_inputs() -> Tensors:
    return (_randn(ROWS, COLS), _randn(COLS, ROWS))


def transpose_add_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Reads ``y`` across its rows: a loop over ``x``'s rows walks ``y`` a row per element."""
    return x + y.t()


def sum_last_fn(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1)


def sum_first_fn(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=0)


# 8. cross-entropy ------------------------------------------------------------ #
CE_ROWS, CE_VOCAB = 768, 8192  # logits are NUMEL floats


def cross_entropy_inputs() -> Tensors:
    return (_randn(CE_ROWS, CE_VOCAB), torch.randint(0, CE_VOCAB, (CE_ROWS,), dtype=torch.int64))


def cross_entropy_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, targets)


# 9. GPT block forward -------------------------------------------------------- #
GPT_B, GPT_T, GPT_C, GPT_HEADS = 4, 128, 256, 4


def gpt_block_inputs() -> Tensors:
    c = GPT_C
    s = 1.0 / math.sqrt(c)
    return (
        _randn(GPT_B, GPT_T, c),  # x
        1.0 + _randn(c, scale=0.1), _randn(c, scale=0.1),  # ln1 weight, bias
        _randn(c, 3 * c, scale=s), _randn(3 * c, scale=0.02),  # qkv projection
        _randn(c, c, scale=s), _randn(c, scale=0.02),  # attention output projection
        1.0 + _randn(c, scale=0.1), _randn(c, scale=0.1),  # ln2 weight, bias
        _randn(c, 4 * c, scale=s), _randn(4 * c, scale=0.02),  # MLP up
        _randn(4 * c, c, scale=0.5 * s), _randn(c, scale=0.02),  # MLP down
    )


def gpt_block_fn(
    x: torch.Tensor,
    ln1_w: torch.Tensor, ln1_b: torch.Tensor,
    w_qkv: torch.Tensor, b_qkv: torch.Tensor,
    w_proj: torch.Tensor, b_proj: torch.Tensor,
    ln2_w: torch.Tensor, ln2_b: torch.Tensor,
    w_fc: torch.Tensor, b_fc: torch.Tensor,
    w_out: torch.Tensor, b_out: torch.Tensor,
) -> torch.Tensor:
    b, t, c = x.shape
    hd = c // GPT_HEADS
    h = F.layer_norm(x, (c,), ln1_w, ln1_b)
    q, k, v = (h @ w_qkv + b_qkv).split(c, dim=-1)
    q = q.view(b, t, GPT_HEADS, hd).transpose(1, 2)
    k = k.view(b, t, GPT_HEADS, hd).transpose(1, 2)
    v = v.view(b, t, GPT_HEADS, hd).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, c)
    x = x + (y @ w_proj + b_proj)
    h = F.layer_norm(x, (c,), ln2_w, ln2_b)
    return x + (F.gelu(h @ w_fc + b_fc) @ w_out + b_out)


# 10. MLP training step -------------------------------------------------------- #
MLP_BATCH, MLP_WIDTH = 256, 512


def mlp_train_inputs() -> Tensors:
    s = 1.0 / math.sqrt(MLP_WIDTH)
    params = [
        _randn(MLP_WIDTH, MLP_WIDTH, scale=s), _randn(MLP_WIDTH, scale=0.02),
        _randn(MLP_WIDTH, MLP_WIDTH, scale=s), _randn(MLP_WIDTH, scale=0.02),
        _randn(MLP_WIDTH, MLP_WIDTH, scale=s), _randn(MLP_WIDTH, scale=0.02),
    ]
    return (
        _randn(MLP_BATCH, MLP_WIDTH),
        torch.randint(0, MLP_WIDTH, (MLP_BATCH,), dtype=torch.int64),
        *(p.requires_grad_() for p in params),
    )


def mlp_train_fn(
    x: torch.Tensor, target: torch.Tensor,
    w1: torch.Tensor, b1: torch.Tensor,
    w2: torch.Tensor, b2: torch.Tensor,
    w3: torch.Tensor, b3: torch.Tensor,
) -> torch.Tensor:
    h = F.gelu(F.linear(x, w1, b1))
    h = F.gelu(F.linear(h, w2, b2))
    return F.cross_entropy(F.linear(h, w3, b3), target)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("pointwise", f"sin/sigmoid/relu/tanh/exp chain, fp32 [{NUMEL}]",
                 pointwise_inputs, pointwise_fn),
        Workload("bias_gelu_residual", f"gelu(x+bias)+residual, bf16 [{BF16_ROWS},{COLS}]",
                 bias_gelu_residual_inputs, bias_gelu_residual_fn, atol=5e-2, rtol=2e-2),
        Workload("softmax", f"softmax(dim=-1), fp32 [{ROWS},{COLS}]",
                 matrix_inputs, softmax_fn, atol=1e-6, rtol=1e-4),
        Workload("layernorm", f"F.layer_norm w/ weight+bias, fp32 [{ROWS},{COLS}]",
                 layernorm_inputs, layernorm_fn, atol=1e-4, rtol=1e-4),
        Workload("rmsnorm", f"x*rsqrt(mean(x^2,-1)+eps)*w, fp32 [{ROWS},{COLS}]",
                 rmsnorm_inputs, rmsnorm_fn, atol=1e-4, rtol=1e-4),
        Workload("transpose_add", f"x + y.t(), fp32 [{ROWS},{COLS}]",
                 transpose_inputs, transpose_add_fn),
        Workload("sum_last", f"x.sum(-1), fp32 [{ROWS},{COLS}]",
                 matrix_inputs, sum_last_fn, atol=1e-3, rtol=1e-4),
        Workload("sum_first", f"x.sum(0), fp32 [{ROWS},{COLS}]",
                 matrix_inputs, sum_first_fn, atol=1e-3, rtol=1e-4),
        Workload("cross_entropy", f"F.cross_entropy, fp32 logits [{CE_ROWS},{CE_VOCAB}], int64 targets",
                 cross_entropy_inputs, cross_entropy_fn, atol=1e-4, rtol=1e-4),
        Workload("gpt_block", f"GPT block fwd, no_grad, fp32 B={GPT_B} T={GPT_T} C={GPT_C} heads={GPT_HEADS}",
                 gpt_block_inputs, gpt_block_fn, bandwidth_bound=False, atol=1e-3, rtol=1e-3),
        Workload("mlp_train", f"3x(Linear+GELU) + CE loss, fwd+bwd, fp32 batch={MLP_BATCH} width={MLP_WIDTH}",
                 mlp_train_inputs, mlp_train_fn, bandwidth_bound=False, training=True, atol=1e-4, rtol=1e-3),
    ]
}


def make_step(workload: Workload, fn: Callable[..., torch.Tensor], inputs: Tensors) -> Callable[[], Tensors]:
    """The callable that is timed: one inference call, or one fwd+bwd training step."""
    if not workload.training:
        def step() -> Tensors:
            with torch.no_grad():
                out = fn(*inputs)
            return out if isinstance(out, tuple) else (out,)
        return step

    params = [t for t in inputs if t.requires_grad]

    def train_step() -> Tensors:
        for p in params:
            p.grad = None
        loss = fn(*inputs)
        loss.backward()
        return (loss.detach(), *(p.grad for p in params))  # type: ignore[misc]
    return train_step
