"""Which of PyTorch's OpInfos (``op_db``) are compared against eager, and their samples: the
skip lists (random ops, uninitialised memory), lookup by name, and deterministic sample
generation on the CPU. Moved here from ``tests/opinfo_harness.py``, which imports it."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput

#: Samples are generated (and eager runs happen) on the CPU in float32.
DEVICE = "cpu"
DTYPE = torch.float32
#: Seed set before generating each op's samples, so runs are reproducible.
SEED = 0
#: Bypass OpInfo's ``wrapper_set_seed`` (see :func:`without_seed_wrapper`).
STRIP_SEED_WRAPPER = True

_RNG = "draws from the RNG; compiled and eager consume/produce random numbers differently"
_UNINIT = "returns uninitialized memory"

#: OpInfos (by full name, ``name.variant``) that are never compared, with a reason.
#: Besides this table, :func:`skip_reason` also skips any OpInfo flagged
#: ``has_nondeterministic_output`` or ``skip_correctness_check_compile_vs_eager``,
#: and the runner skips samples whose two eager runs disagree.
SKIPPED_OPS: dict[str, str] = {
    # Random sampling (in-place and functional).
    "bernoulli": f"Bernoulli sampling; {_RNG}",
    "cauchy": f"in-place Cauchy sampling (Tensor.cauchy_); {_RNG}",
    "exponential": f"in-place exponential sampling (Tensor.exponential_); {_RNG}",
    "geometric": f"in-place geometric sampling (Tensor.geometric_); {_RNG}",
    "log_normal": f"in-place log-normal sampling (Tensor.log_normal_); {_RNG}",
    "uniform": f"in-place uniform sampling (Tensor.uniform_); {_RNG}",
    "normal": f"normal sampling (torch.normal); {_RNG}",
    "normal.in_place": f"in-place normal sampling (Tensor.normal_); {_RNG}",
    "normal.number_mean": f"normal sampling with scalar mean; {_RNG}",
    "multinomial": f"multinomial sampling; {_RNG}",
    # Random factories.
    "rand_like": f"random factory; {_RNG}",
    "randn": f"random factory; {_RNG}",
    "randn_like": f"random factory; {_RNG}",
    "randint": f"random factory; {_RNG}",
    "randint_like": f"random factory; {_RNG}",
    # Random masks / slopes / regions.
    "nn.functional.dropout": f"random dropout mask; {_RNG}",
    "nn.functional.dropout2d": f"random channel dropout mask; {_RNG}",
    "nn.functional.dropout3d": f"random channel dropout mask; {_RNG}",
    "nn.functional.alpha_dropout": f"random dropout mask; {_RNG}",
    "nn.functional.feature_alpha_dropout.with_train": f"random mask (training=True); {_RNG}",
    "nn.functional.rrelu": f"random negative slopes when training=True; {_RNG}",
    "nn.functional.fractional_max_pool2d": f"random pooling regions (no _random_samples); {_RNG}",
    "nn.functional.fractional_max_pool3d": f"random pooling regions (no _random_samples); {_RNG}",
    # Randomized algorithms.
    "svd_lowrank": f"randomized SVD (random Gaussian projection); {_RNG}",
    "pca_lowrank": f"randomized PCA (random Gaussian projection); {_RNG}",
    # Uninitialized memory.
    "empty": _UNINIT,
    "empty_like": _UNINIT,
    "empty_strided": _UNINIT,
    "empty_permuted": _UNINIT,
    "new_empty": _UNINIT,
    "new_empty_strided": _UNINIT,
    "resize_": f"{_UNINIT} when the tensor grows",
    "resize_as_": f"{_UNINIT} when the tensor grows",
}


def _sdpa_random_sample(sample: SampleInput) -> str | None:
    if float(sample.kwargs.get("dropout_p", 0.0) or 0.0) > 0.0:
        return "dropout_p > 0 draws a random attention-dropout mask"
    return None


def _mha_random_sample(sample: SampleInput) -> str | None:
    # multi_head_attention_forward(query, key, value, embed_dim_to_check,
    #   num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn,
    #   dropout_p, ...): sample.args starts at ``key`` so dropout_p is args[9].
    dropout_p = sample.kwargs.get("dropout_p", sample.args[9] if len(sample.args) > 9 else 0.0)
    if sample.kwargs.get("training", True) and float(dropout_p or 0.0) > 0.0:
        return "training=True with dropout_p > 0 draws a random dropout mask"
    return None


#: Per-sample filters for ops that are only random for some samples.  A filter
#: returns a reason string for samples to drop (they do not count towards N).
RANDOM_SAMPLE_FILTERS: dict[str, Callable[[SampleInput], str | None]] = {
    "nn.functional.scaled_dot_product_attention": _sdpa_random_sample,
    "nn.functional.multi_head_attention_forward": _mha_random_sample,
}


@functools.cache
def load_op_db() -> tuple[OpInfo, ...]:
    """Import (lazily, it takes a few seconds) and return PyTorch's ``op_db``."""
    from torch.testing._internal.common_methods_invocations import op_db

    return tuple(op_db)


def skip_reason(op: OpInfo) -> str | None:
    """Return why ``op`` is not eligible for differential testing, or ``None``."""
    if op.full_name in SKIPPED_OPS:
        return SKIPPED_OPS[op.full_name]
    if getattr(op, "has_nondeterministic_output", False):
        return "OpInfo.has_nondeterministic_output"
    if getattr(op, "skip_correctness_check_compile_vs_eager", False):
        return "OpInfo.skip_correctness_check_compile_vs_eager"
    if not op.supports_dtype(DTYPE, DEVICE):
        return f"{DTYPE} not supported on {DEVICE}"
    return None


def eligible_ops() -> list[OpInfo]:
    """All OpInfos supporting float32 on CPU that are not skipped (``op_db`` order)."""
    return [op for op in load_op_db() if skip_reason(op) is None]


def find_ops(names: Sequence[str], *, include_skipped: bool = False) -> list[OpInfo]:
    """Resolve op names to OpInfos.

    A name matches an OpInfo's full name (``"div.trunc_rounding"``) exactly or,
    failing that, its base name (``"div"`` selects every ``div`` variant).
    Unknown names raise ``KeyError``; ineligible ops are dropped unless
    ``include_skipped`` is true.
    """
    db = load_op_db()
    by_full = {op.full_name: op for op in db}
    selected: list[OpInfo] = []
    for name in names:
        matches = [by_full[name]] if name in by_full else [op for op in db if op.name == name]
        if not matches:
            raise KeyError(f"no OpInfo named {name!r}")
        for op in matches:
            if op not in selected and (include_skipped or skip_reason(op) is None):
                selected.append(op)
    return selected


def iter_samples(op: OpInfo, num_samples: int, *, requires_grad: bool = False
                 ) -> Iterator[tuple[int, SampleInput]]:
    """First ``num_samples`` deterministic samples, with their original indices
    (``requires_grad``: OpInfo marks the differentiable inputs, as for its gradient tests)."""
    sample_filter = RANDOM_SAMPLE_FILTERS.get(op.full_name)
    torch.manual_seed(SEED)
    samples = op.sample_inputs(DEVICE, DTYPE, requires_grad=requires_grad)
    kept = 0
    for index, sample in enumerate(samples):
        if kept >= num_samples:
            return
        if sample_filter is not None and sample_filter(sample) is not None:
            continue
        kept += 1
        yield index, sample


def _call_unseeded(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Pass-through stand-in for OpInfo's ``wrapper_set_seed``."""
    return op(*args, **kwargs)


@contextlib.contextmanager
def without_seed_wrapper() -> Iterator[None]:
    """Temporarily replace ``wrapper_set_seed`` in ``common_methods_invocations``.

    Several OpInfo callables are ``lambda *a, **k: wrapper_set_seed(f, *a, **k)``,
    which re-seeds the RNG inside ``freeze_rng_state()``.  Dynamo cannot trace
    that (RNG state save/restore), so e.g. ``scaled_dot_product_attention``
    would never reach the backend.  The seeding only matters for random ops,
    which are skipped (and the eager-vs-eager check catches any left over), so
    eager and compiled runs both call the op directly instead.  The lambdas look
    the name up in the module globals at call time, so patching it there works.
    """
    if not STRIP_SEED_WRAPPER:
        yield
        return
    import torch.testing._internal.common_methods_invocations as cmi

    original = getattr(cmi, "wrapper_set_seed", None)
    if original is None:
        yield
        return
    setattr(cmi, "wrapper_set_seed", _call_unseeded)  # noqa: B010
    try:
        yield
    finally:
        setattr(cmi, "wrapper_set_seed", original)  # noqa: B010
