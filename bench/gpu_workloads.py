"""The workloads of the GPU benchmark (``bench/gpu.py``): what is compiled, its inputs, and its
ideal traffic or FLOPs, written out per workload.

``build(FULL)`` gives the sizes the benchmark reports; ``build(SMOKE)`` shrinks every workload
so the whole script can be smoke-tested on a CPU.  Ideal bytes are each distinct input read
once plus each output written once (1 GB = 1e9 bytes); the runner cross-checks every formula
against the tensors it actually builds.  The GPT block and the MLP step are matmul-bound, so
they carry matmul FLOPs instead of a bandwidth target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

Tensors = tuple[torch.Tensor, ...]
F32, BF16 = torch.float32, torch.bfloat16
GPT_HEAD_DIM = 64
F32_TOL = {"atol": 1e-4, "rtol": 1e-4}
BF16_TOL = {"atol": 5e-2, "rtol": 2e-2}  # a few bf16 ulps at |x| ~ 4


@dataclass(frozen=True)
class Sizes:
    """Every size the workloads use; FULL and SMOKE below."""

    numel: int  # pointwise chain elements
    rows: int  # 2-D workloads: rows x cols
    cols: int
    ce_rows: int  # cross-entropy: logits ce_rows x ce_vocab
    ce_vocab: int
    tiny: int  # launch-bound chain elements
    gpt_batch: int
    gpt_seq: int
    gpt_dim: int  # heads = gpt_dim // GPT_HEAD_DIM
    mlp_batch: int
    mlp_in: int
    mlp_hidden: int
    mlp_classes: int
    gemm: int = 8192  # square GEMM + bias + GELU
    skinny_k: int = 4096  # decode-like: M in (1, 16, 64) rows against K x N weights
    skinny_n: tuple[int, ...] = (4096, 14336)
    attn: tuple[int, int, int, int] = (8, 16, 2048, 64)  # naive attention B, H, T, D


FULL = Sizes(numel=2**28, rows=16384, cols=4096, ce_rows=8192, ce_vocab=32768, tiny=64,
             gpt_batch=8, gpt_seq=1024, gpt_dim=1024,
             mlp_batch=4096, mlp_in=1024, mlp_hidden=4096, mlp_classes=1024)
SMOKE = Sizes(numel=2**16, rows=64, cols=512, ce_rows=32, ce_vocab=1024, tiny=64,
              gpt_batch=2, gpt_seq=64, gpt_dim=128,
              mlp_batch=64, mlp_in=64, mlp_hidden=256, mlp_classes=64,
              gemm=256, skinny_k=128, skinny_n=(128, 256), attn=(2, 2, 64, 32))


@dataclass(frozen=True)
class Workload:
    """One benchmark case.

    ``fn(*make_inputs(device))`` is what gets compiled.  A ``training`` workload's ``fn``
    returns a scalar loss; its timed step is forward + ``backward()`` and its outputs are the
    loss plus the gradient of every input that requires grad.  ``host_timed`` workloads are
    launch-bound: they are timed as host wall time per call, not device time.
    """

    name: str
    description: str
    make_inputs: Callable[[torch.device], Tensors]
    fn: Callable[..., torch.Tensor]
    ideal_bytes: int
    flops: int = 0  # matmul FLOPs per step; non-zero marks a compute-bound workload
    bandwidth_target: bool = False  # held to the 3.9 TB/s goal
    training: bool = False
    host_timed: bool = False
    compile_kwargs: dict[str, str] = field(default_factory=dict)
    atol: float = 1e-4
    rtol: float = 1e-4
    norm_tol: float | None = None  # judge by relative L2 error instead of elementwise


def _randn(device: torch.device, *shape: int, dtype: torch.dtype = F32, scale: float = 1.0,
           shift: float = 0.0) -> torch.Tensor:
    return (torch.randn(*shape, device=device) * scale + shift).to(dtype)


# --------------------------------------------------------------------------- #
# The computations
# --------------------------------------------------------------------------- #


def pointwise_fn(x: torch.Tensor) -> torch.Tensor:
    y = x * 2.0 + 1.0
    y = torch.relu(y) * torch.sigmoid(x)
    return y * 0.5 - x


def bias_gelu_residual_fn(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias) + residual  # erf GELU (F.gelu's default)


def softmax_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def layernorm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)


def rmsnorm_fn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def sum_last_fn(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1)


def sum_first_fn(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=0)


def cross_entropy_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target)


def launch_chain_fn(x: torch.Tensor) -> torch.Tensor:
    """Ten tiny pointwise ops: eager launches ten kernels, a fusing compiler one."""
    y = x + 1.0
    y = y * 2.0
    y = y - 0.5
    y = torch.relu(y)
    y = y * x
    y = y + 3.0
    y = y / 4.0
    y = torch.sigmoid(y)
    y = y * 0.1
    return torch.abs(y)


def gpt_block_fn(
    x: torch.Tensor,
    ln1_w: torch.Tensor, ln1_b: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor,
    w_proj: torch.Tensor, b_proj: torch.Tensor, ln2_w: torch.Tensor, ln2_b: torch.Tensor,
    w_fc: torch.Tensor, b_fc: torch.Tensor, w_out: torch.Tensor, b_out: torch.Tensor,
) -> torch.Tensor:
    """Pre-LN GPT block, head dim 64; attention is plain matmuls + a causal masked softmax (no SDPA)."""
    b, t, c = x.shape
    hd = GPT_HEAD_DIM
    nh = c // hd
    h = F.layer_norm(x, (c,), ln1_w, ln1_b)
    q, k, v = (h @ w_qkv + b_qkv).split(c, dim=-1)
    q, k, v = (z.view(b, t, nh, hd).transpose(1, 2) for z in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, c)
    x = x + (y @ w_proj + b_proj)
    h = F.layer_norm(x, (c,), ln2_w, ln2_b)
    return x + (F.gelu(h @ w_fc + b_fc) @ w_out + b_out)


def gemm_bias_gelu_fn(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A linear layer with its activation: the GEMM template's epilogue case."""
    return F.gelu(F.linear(x, w, bias))


def naive_attention_fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention as many models still write it: scores materialised, softmax, matmul."""
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    return torch.softmax(scores, dim=-1) @ v


def _templates(s: Sizes) -> list["Workload"]:
    n = s.gemm
    out = [Workload("gemm_bias_gelu", f"gelu(x @ w.T + b), bf16 {n}x{n}x{n}",
                    lambda dev: (_randn(dev, n, n, dtype=BF16), _randn(dev, n, n, dtype=BF16, scale=n ** -0.5),
                                 _randn(dev, n, dtype=BF16)),
                    gemm_bias_gelu_fn, ideal_bytes=(3 * n * n + n) * 2, flops=2 * n ** 3, norm_tol=1e-2)]
    for j, wide in enumerate(s.skinny_n):
        for m in (1, 16, 64):
            k = s.skinny_k
            out.append(Workload(
                f"linear_gelu_m{m}" + ("_wide" if j else ""), f"gelu(x @ w.T + b), bf16 M={m} K={k} N={wide}",
                lambda dev, m=m, k=k, wide=wide: (_randn(dev, m, k, dtype=BF16),
                                                  _randn(dev, wide, k, dtype=BF16, scale=k ** -0.5),
                                                  _randn(dev, wide, dtype=BF16)),
                gemm_bias_gelu_fn, ideal_bytes=(m * k + wide * k + wide + m * wide) * 2,
                flops=2 * m * k * wide, norm_tol=1e-2))
    b, h, t, d = s.attn
    out.append(Workload(
        "naive_attention", f"softmax(q @ k.T * s) @ v, fp16 B={b} H={h} T={t} D={d}",
        lambda dev: tuple(_randn(dev, b, h, t, d, dtype=torch.float16) for _ in range(3)),
        naive_attention_fn, ideal_bytes=4 * b * h * t * d * 2, flops=4 * b * h * t * t * d, norm_tol=1e-2))
    return out


def mlp_train_fn(
    x: torch.Tensor, target: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor,
    w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
) -> torch.Tensor:
    """LayerNorm -> Linear -> GELU -> Linear -> cross-entropy loss."""
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b)
    h = F.gelu(F.linear(h, w1, b1))
    return F.cross_entropy(F.linear(h, w2, b2), target)


# --------------------------------------------------------------------------- #
# Inputs
# --------------------------------------------------------------------------- #


def _gpt_inputs(s: Sizes, device: torch.device) -> Tensors:
    c, r = s.gpt_dim, 1.0 / math.sqrt(s.gpt_dim)

    def p(*shape: int, scale: float, shift: float = 0.0) -> torch.Tensor:
        return _randn(device, *shape, dtype=BF16, scale=scale, shift=shift)

    return (
        p(s.gpt_batch, s.gpt_seq, c, scale=1.0),
        p(c, scale=0.1, shift=1.0), p(c, scale=0.1), p(c, 3 * c, scale=r), p(3 * c, scale=0.02),
        p(c, c, scale=r), p(c, scale=0.02), p(c, scale=0.1, shift=1.0), p(c, scale=0.1),
        p(c, 4 * c, scale=r), p(4 * c, scale=0.02), p(4 * c, c, scale=0.5 * r), p(c, scale=0.02),
    )


def _mlp_inputs(s: Sizes, device: torch.device) -> Tensors:
    d, h, k = s.mlp_in, s.mlp_hidden, s.mlp_classes
    params = [_randn(device, d, scale=0.1, shift=1.0), _randn(device, d, scale=0.1),
              _randn(device, h, d, scale=1 / math.sqrt(d)), _randn(device, h, scale=0.02),
              _randn(device, k, h, scale=1 / math.sqrt(h)), _randn(device, k, scale=0.02)]
    return (_randn(device, s.mlp_batch, d), torch.randint(0, k, (s.mlp_batch,), device=device),
            *(t.requires_grad_() for t in params))


def _gpt_bytes(s: Sizes) -> int:
    c = s.gpt_dim
    params = 4 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    return 2 * (2 * s.gpt_batch * s.gpt_seq * c + params)  # x in, out, params; bf16


def _gpt_flops(s: Sizes) -> int:
    bt, c = s.gpt_batch * s.gpt_seq, s.gpt_dim
    # qkv, proj, fc, out projections (24 B T C^2) + full T x T scores and att @ v (4 B T^2 C)
    return 24 * bt * c * c + 4 * bt * s.gpt_seq * c


def _mlp_bytes(s: Sizes) -> int:
    d, h, k = s.mlp_in, s.mlp_hidden, s.mlp_classes
    params = 2 * d + h * d + h + k * h + k
    return 4 * (s.mlp_batch * d + 1 + 2 * params) + 8 * s.mlp_batch  # x, loss, params + grads; int64 target


def _mlp_flops(s: Sizes) -> int:
    return 6 * s.mlp_batch * (s.mlp_in * s.mlp_hidden + s.mlp_hidden * s.mlp_classes)  # fwd + 2x for bwd


# --------------------------------------------------------------------------- #
# The table of workloads
# --------------------------------------------------------------------------- #


def _softmax(s: Sizes, dt: torch.dtype) -> Workload:
    r, c, name = s.rows, s.cols, _suffix(dt)
    tol = {"atol": 1e-6, "rtol": 1e-4} if dt is F32 else {"atol": 1e-2, "rtol": 2e-2}
    return Workload(f"softmax_{name}", f"softmax(dim=-1), {name} [{r},{c}]",
                    lambda dev: (_randn(dev, r, c, dtype=dt),), softmax_fn,
                    ideal_bytes=2 * r * c * dt.itemsize, bandwidth_target=True, **tol)


def _layernorm(s: Sizes, dt: torch.dtype) -> Workload:
    r, c, name = s.rows, s.cols, _suffix(dt)
    return Workload(f"layernorm_{name}", f"F.layer_norm w/ weight+bias, {name} [{r},{c}]",
                    lambda dev: (_randn(dev, r, c, dtype=dt), _randn(dev, c, dtype=dt, scale=0.1, shift=1.0),
                                 _randn(dev, c, dtype=dt, scale=0.1)),
                    layernorm_fn, ideal_bytes=(2 * r * c + 2 * c) * dt.itemsize, bandwidth_target=True,
                    **(F32_TOL if dt is F32 else BF16_TOL))


def _rmsnorm(s: Sizes, dt: torch.dtype) -> Workload:
    r, c, name = s.rows, s.cols, _suffix(dt)
    return Workload(f"rmsnorm_{name}", f"x*rsqrt(mean(x^2,-1)+eps)*w, {name} [{r},{c}]",
                    lambda dev: (_randn(dev, r, c, dtype=dt), _randn(dev, c, dtype=dt, scale=0.1, shift=1.0)),
                    rmsnorm_fn, ideal_bytes=(2 * r * c + c) * dt.itemsize, bandwidth_target=True,
                    **(F32_TOL if dt is F32 else BF16_TOL))


def _suffix(dt: torch.dtype) -> str:
    return {F32: "fp32", BF16: "bf16"}[dt]


def build(s: Sizes) -> dict[str, Workload]:
    """All workloads at sizes ``s``, in report order."""
    r, c = s.rows, s.cols
    cg = {"mode": "reduce-overhead"}
    workloads = [
        Workload("pointwise", f"x*2+1, relu, *sigmoid(x), *0.5-x; fp32 [{s.numel}]",
                 lambda dev: (_randn(dev, s.numel),), pointwise_fn,
                 ideal_bytes=2 * s.numel * 4, bandwidth_target=True),
        Workload("bias_gelu_residual", f"gelu(x+bias)+residual (erf), bf16 [{r},{c}]",
                 lambda dev: (_randn(dev, r, c, dtype=BF16), _randn(dev, c, dtype=BF16),
                              _randn(dev, r, c, dtype=BF16)),
                 bias_gelu_residual_fn, ideal_bytes=(3 * r * c + c) * 2, **BF16_TOL),
        *(make(s, dt) for make in (_softmax, _layernorm, _rmsnorm) for dt in (F32, BF16)),
        Workload("sum_last", f"x.sum(-1), fp32 [{r},{c}]", lambda dev: (_randn(dev, r, c),), sum_last_fn,
                 ideal_bytes=(r * c + r) * 4, atol=1e-3, rtol=1e-4),
        Workload("sum_first", f"x.sum(0), fp32 [{r},{c}]", lambda dev: (_randn(dev, r, c),), sum_first_fn,
                 ideal_bytes=(r * c + c) * 4, atol=2e-3, rtol=1e-4),
        Workload("cross_entropy", f"F.cross_entropy, fp32 logits [{s.ce_rows},{s.ce_vocab}], int64 target",
                 lambda dev: (_randn(dev, s.ce_rows, s.ce_vocab),
                              torch.randint(0, s.ce_vocab, (s.ce_rows,), device=dev)),
                 cross_entropy_fn, ideal_bytes=s.ce_rows * s.ce_vocab * 4 + s.ce_rows * 8 + 4,
                 bandwidth_target=True),
        Workload("launch_chain", f"10 tiny pointwise ops, fp32 [{s.tiny}]; host time per call",
                 lambda dev: (_randn(dev, s.tiny),), launch_chain_fn, ideal_bytes=2 * s.tiny * 4,
                 host_timed=True, atol=1e-5, rtol=1e-4),
        Workload("launch_chain_cudagraphs", "launch_chain, compiled with mode='reduce-overhead'",
                 lambda dev: (_randn(dev, s.tiny),), launch_chain_fn, ideal_bytes=2 * s.tiny * 4,
                 host_timed=True, compile_kwargs=cg, atol=1e-5, rtol=1e-4),
        Workload("gpt_block", f"GPT block fwd, no_grad, bf16, matmul attention, B={s.gpt_batch} "
                              f"T={s.gpt_seq} C={s.gpt_dim} heads={s.gpt_dim // GPT_HEAD_DIM}",
                 lambda dev: _gpt_inputs(s, dev), gpt_block_fn, ideal_bytes=_gpt_bytes(s),
                 flops=_gpt_flops(s), norm_tol=2e-2),
        Workload("mlp_train", f"LN-Linear-GELU-Linear + CE, fwd+bwd, fp32 (TF32 matmul on cuda), "
                              f"batch={s.mlp_batch} {s.mlp_in}->{s.mlp_hidden}->{s.mlp_classes}",
                 lambda dev: _mlp_inputs(s, dev), mlp_train_fn, ideal_bytes=_mlp_bytes(s),
                 flops=_mlp_flops(s), training=True, norm_tol=1e-2),
        *_templates(s),
    ]
    return {w.name: w for w in workloads}
