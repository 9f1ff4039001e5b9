"""Coil's decomposition table: PyTorch's core-ATen decompositions, plus decompositions of the
composite ops Coil wants to fuse (softmax, layer norm, GELU, addmm, batch norm...), minus
the ops Coil lowers whole (Welford var_mean, for one)."""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Sequence

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from . import cia_ops
from .sdk.diskcache import cache_dir

aten = torch.ops.aten
log = logging.getLogger(__name__)

#: Composite ops that core-ATen keeps whole but Coil decomposes so their parts fuse.
#: ``aten.embedding`` is not one: Coil lowers it whole, as a gather that fuses like the
#: ``aten.index`` it would decompose to (``coil.lowering.indexing``). Whether a training
#: graph saves less with it whole or as that index differs by model (the Qwen2-like saves
#: less whole, T5 as an index): ``coil.embedding_partition`` partitions both ways and keeps
#: the smaller saved set.
EXTRA = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.gelu, aten.addmm,
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training, aten.silu, aten.mish,
    aten.hardsigmoid, aten.hardswish, aten.hardtanh, aten.leaky_relu, aten.elu, aten.softplus,
    aten.logsumexp, aten.native_group_norm, aten.rms_norm, aten._fused_rms_norm,
    aten.index_add, aten.index_copy, aten.index_fill, aten.nan_to_num, aten.addcmul, aten.addcdiv,
    aten.lerp, aten.xlogy, aten.logaddexp, aten.glu, aten.baddbmm, aten.linspace, aten.logspace,
    aten.mse_loss, aten.binary_cross_entropy, aten.smooth_l1_loss, aten.huber_loss,
    aten.native_dropout_backward, aten.threshold_backward, aten.sigmoid_backward, aten.tanh_backward,
]

#: Ops Coil lowers natively and better than their decomposition.
KEEP = [aten.var_mean.correction, aten.var.correction, aten.std.correction, aten.mean.dim,
        aten.mean.default, aten.index_select.default, aten.clamp_min,
        aten.clamp_max,
        # ``rand_like(p) < p`` fires at 2^-24 for any p above 0; Coil's lowering is exact
        aten.bernoulli.default]

#: Ops whose decomposition must never run: their backward is an ATen kernel that reads the
#: forward's saved outputs, so forward and backward have to be the same library op. PyTorch's
#: decomposition of the CPU flash-attention forward returns the attention weights where the
#: op returns the log-sum-exp, and the flash backward then computes garbage gradients.
#: Attention stays a library call in both directions (``graph.LIBRARY_OPS``).
PAIRED_WITH_BACKWARD = [aten._scaled_dot_product_flash_attention_for_cpu.default]


def _addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1,
           alpha: Any = 1) -> Any:
    """A linear layer's ``bias + mat1 @ mat2`` stays one library call, as in eager: the GEMM
    library adds the bias in its epilogue and picks its kernels for that op (on the H200,
    cuBLAS ran BERT's 30522-wide output layer as ``mm`` 4.6x slower than as ``addmm``).
    Other forms become ``beta * self + alpha * (mat1 @ mat2)`` with the matmul in the inputs'
    own dtype: PyTorch's decomposition computes the whole op in float32
    (``pw_cast_for_opmath``), which turns every bf16/fp16 matmul under autocast into a
    float32 one."""
    if self.dim() == 1 and self.is_floating_point() and beta == 1 and alpha == 1:
        return NotImplemented  # not decomposed
    if not _decomposable(mat1.dtype, beta, alpha):
        return NotImplemented
    return _scaled_sum(self, torch.mm(mat1, mat2), beta, alpha)


def _baddbmm(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: Any = 1,
             alpha: Any = 1) -> Any:
    """``beta * self + alpha * (batch1 @ batch2)``, the matmul in the inputs' dtype (as ``_addmm``)."""
    if not _decomposable(batch1.dtype, beta, alpha):
        return NotImplemented
    return _scaled_sum(self, torch.bmm(batch1, batch2), beta, alpha)


def _decomposable(dtype: torch.dtype, beta: Any, alpha: Any) -> bool:
    """Whether the sum may round the product first: in float32 and float64 with ``alpha`` and
    ``beta`` 1, within an ulp of the library's one rounding (as ``coil.matmul_bias`` splits a
    linear layer's); integers exactly. Other forms stay the library's call, as in eager: a bf16
    product rounded, scaled and added rounds three times (BLOOM's
    ``baddbmm(alibi, q, k.mT, alpha=0.125)`` under bf16 autocast differed from eager in 4703 of
    16384 elements), and ``alpha=0`` must not multiply an inf of the product (eager skips it:
    a NaN here; a hunt, session 37)."""
    if not dtype.is_floating_point:
        return True
    return dtype in (torch.float32, torch.float64) and alpha == 1 and beta == 1


def _scaled_sum(self: torch.Tensor, product: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
    if not product.is_floating_point():
        beta, alpha = int(beta), int(alpha)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    # the product first: the result takes its (contiguous) strides, as the op's does
    return product + (self if beta == 1 else self * beta)


def _softmax(x: torch.Tensor, dim: int, half_to_float: bool) -> Any:
    """``exp(x - max) * (1 / sum)``: ATen's CPU kernel multiplies each element by the row
    sum's reciprocal, and so does this; PyTorch's decomposition divides every element by the
    sum (the CUDA kernels' form; the two are within one ulp). A division per element costs a
    float32 softmax on the CPU 11-14% of its time (1536x4096, one thread: 4.64 against 4.15
    ms as a kernel alone). Empty and zero-dim inputs keep PyTorch's decomposition."""
    if x.dim() == 0 or any(isinstance(n, int) and n == 0 for n in x.shape):
        return NotImplemented
    dtype = x.dtype
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    x = x.contiguous().to(compute)  # eager returns a contiguous tensor
    unnormalized = torch.exp(x - torch.amax(x, dim, keepdim=True))
    result = unnormalized * torch.reciprocal(torch.sum(unnormalized, dim, keepdim=True))
    return result if half_to_float else result.to(dtype)


def _affine_grid_generator(theta: torch.Tensor, size: Sequence[int], align_corners: bool) -> Any:
    """PyTorch's decomposition, except where an output dim has one element: there it builds
    its base grid with ``torch.tensor``, whose in-place ``detach_`` AOTAutograd refuses in a
    functional graph (the compile failed where eager runs, session 30); the op stays ATen's."""
    if any(n == 1 for n in size[2:]):
        return NotImplemented
    from torch._decomp.decompositions import affine_grid_generator
    return affine_grid_generator(theta, size, align_corners)


#: Coil's own decompositions, replacing PyTorch's for these ops.
OWN: dict[Any, Callable[..., Any]] = {aten.addmm.default: _addmm, aten.baddbmm.default: _baddbmm,
                                      aten._softmax.default: _softmax,
                                      aten.affine_grid_generator.default: _affine_grid_generator}


def core_table(folder: str | None = None) -> dict[Any, Callable[..., Any]]:
    """``dict(core_aten_decompositions())``, the same entries without its walks of the ops.

    PyTorch's table (``torch.export``'s ``CustomDecompTable``) materialises the dispatcher's
    composite-implicit ops once per op namespace when first read: 27 walks of every
    registration, 0.14 s of every process's first compile on the 2-core CPU machine. Here
    the list of those ops comes from :mod:`coil.cia_ops` (one walk, or none when an earlier
    process kept the list in ``folder``). Should the private helpers this needs move,
    PyTorch's own table is used; ``tests/test_decompositions.py`` checks the two agree."""
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd
        from torch._export.utils import _get_decomp_for_cia
        from torch.export.decomp_utils import PRESERVED_ATEN_CIA_OPS
        decomps = _core_aten_decompositions_post_autograd()
        for op in cia_ops.cia_ops(folder):
            if op not in decomps and not (op.namespace == "aten" and op in PRESERVED_ATEN_CIA_OPS):
                decomps[op] = _get_decomp_for_cia(op)
        return decomps
    except Exception as exc:  # noqa: BLE001 - private helpers of another torch: PyTorch's table
        log.debug("building the core-ATen table from the CIA op list failed (%s); using PyTorch's", exc)
        return dict(core_aten_decompositions())


def _cache_folder() -> str | None:
    try:
        return cache_dir("decompositions")
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def table() -> dict[Any, Callable[..., Any]]:
    """The decompositions AOTAutograd applies before Coil lowers the graph."""
    decomps = core_table(_cache_folder())
    decomps.update(get_decompositions([op for op in EXTRA if hasattr(aten, op.__name__)]))
    for op in KEEP:
        for overload in ([op] if isinstance(op, torch._ops.OpOverload) else
                         [getattr(op, n) for n in op.overloads()]):
            decomps.pop(overload, None)
    for op in PAIRED_WITH_BACKWARD:
        decomps.pop(op, None)
    decomps.update(OWN)
    for op in (aten.linspace, aten.logspace):
        for name in op.overloads():
            overload = getattr(op, name)
            if overload in decomps:
                decomps[overload] = functools.partial(_full_precision_only, decomps[overload])
    for op in (aten.addcmul, aten.addcdiv, aten.lerp, aten.xlogy, aten.logaddexp, aten.logaddexp2):
        for name in op.overloads():
            overload = getattr(op, name)
            if overload in decomps:
                decomps[overload] = functools.partial(_no_mixed_zero_dim, decomps[overload])
    return decomps


def _no_mixed_zero_dim(decomposition: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Not decomposed where a 0-d tensor operand of another type meets a float16 or bfloat16
    tensor: the decompositions compute in float32, where eager's CUDA kernels cast that operand
    to the half type first (:mod:`coil.zero_dim_operands`, which casts it before the call)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    half = [t.dtype for t in tensors if t.dim() > 0 and t.dtype in (torch.float16, torch.bfloat16)]
    if half and any(t.dim() == 0 and t.dtype != half[0] for t in tensors):
        return NotImplemented
    return decomposition(*args, **kwargs)


def _full_precision_only(decomposition: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``linspace`` and ``logspace`` decomposed in float32 and float64 only: eager's CPU
    kernel computes a half type's step in that type and wraps a uint8 start, where PyTorch's
    decomposition does neither (bf16 0.0557 for eager's 0.0625; uint8 253 for 245: found by
    a hunt); other dtypes stay ATen's call."""
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):
        return NotImplemented
    return decomposition(*args, **kwargs)
