"""OpInfo differential tests: ``torch.compile(backend=...)`` must match eager.

Each test runs one OpInfo from PyTorch's ``op_db`` through
:mod:`opinfo_harness` and fails if any sample's compiled result differs from
eager (``mismatch``) or the compiled run raises (``error``).  A compile error is
a failure: the backend is expected to fall back per op rather than fail.
Samples where eager itself raises, or that are nondeterministic, are skipped.

Environment variables:

``COIL_OPINFO_BACKEND``
    Backend under test (default ``"coil"``); e.g. ``aot_eager`` as a reference.
``COIL_OPINFO_FULL=1``
    Test every eligible OpInfo (~640 ops) instead of the fixed CI sample.
``COIL_OPINFO_SAMPLES``
    Samples per op (default 2).
``COIL_OPINFO_TIMEOUT``
    Per-sample time limit in seconds (default 60; 0 disables it).

Example::

    COIL_OPINFO_BACKEND=aot_eager pytest tests/test_opinfo.py -q
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest
import torch
from opinfo_harness import (
    DEFAULT_SAMPLES,
    DEFAULT_TIMEOUT_S,
    CountingBackend,
    SampleRecord,
    Status,
    eligible_ops,
    find_ops,
    resolve_backend,
    run_op,
)

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

BACKEND_NAME: str = os.environ.get("COIL_OPINFO_BACKEND") or "coil"
FULL: bool = os.environ.get("COIL_OPINFO_FULL", "") == "1"
NUM_SAMPLES: int = int(os.environ.get("COIL_OPINFO_SAMPLES") or DEFAULT_SAMPLES)
TIMEOUT_S: float | None = float(os.environ.get("COIL_OPINFO_TIMEOUT") or DEFAULT_TIMEOUT_S) or None

#: Fixed, representative CI sample (OpInfo full names).  Every op here has at
#: least one sample that Dynamo hands to the backend (checked by the test), so
#: none of these can pass vacuously by running eagerly.
CI_OPS: tuple[str, ...] = (
    # pointwise unary
    "abs",
    "exp",
    "tanh",
    "sigmoid",
    "rsqrt",
    # pointwise binary
    "add",
    "mul",
    "div.no_rounding_mode",
    "pow",
    # comparisons / selection
    "eq",
    "lt",
    "where",
    "masked_fill",
    "clamp",
    # reductions
    "sum",
    "mean",
    "amax",
    "argmax",
    "var",
    "std",
    "prod",
    "any",
    "all",
    "logsumexp",
    "max.reduction_with_dim",
    # normalizations over a dim
    "softmax",
    "log_softmax",
    # views and reshapes
    "view",
    "reshape",
    "permute",
    "transpose",
    "expand",
    "squeeze",
    "unsqueeze",
    "__getitem__",  # basic and advanced slicing
    "narrow",
    "select",
    # concatenation
    "cat",
    "stack",
    # indexing / scatter-gather
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "index_put",
    "index_add",
    "nn.functional.embedding",
    # scans
    "cumsum",
    "cumprod",
    # in-place mutation of an input
    "zero_",
    # nn.functional
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.layer_norm",
    "nn.functional.linear",
    "nn.functional.conv2d",
    "nn.functional.cross_entropy",
    "nn.functional.scaled_dot_product_attention",
    # matrix multiplication
    "matmul",
    "mm",
    "addmm",
    "bmm",
    # casts
    "to",
    # factories
    "full",
    "arange",
    "zeros_like",
)


def _op_names() -> list[str]:
    """Op names to parametrize over: the CI sample, or all eligible ops in full mode."""
    if FULL:
        return [op.full_name for op in eligible_ops()]
    return list(CI_OPS)


def _find_one(op_name: str) -> OpInfo:
    """Resolve ``op_name``, which must be the exact full name of an eligible OpInfo."""
    ops = [op for op in find_ops([op_name]) if op.full_name == op_name]
    assert len(ops) == 1, f"{op_name!r} is not the full name of an eligible OpInfo"
    return ops[0]


def _failure_message(records: Sequence[SampleRecord]) -> str:
    lines = [f"torch.compile(backend={BACKEND_NAME!r}) disagrees with eager:"]
    for r in records:
        lines.append(f"  sample {r.sample_index}: {r.status.value}: {r.reason}")
        lines.append(f"    {r.sample}")
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _quiet_torch_trace_log() -> Iterator[None]:
    """Keep torch's structured-trace records out of failure reports.

    pytest attaches its capture handlers even to the non-propagating
    ``torch.__trace`` logger, which then fills every failure report with dozens
    of empty DEBUG lines.  Left alone when ``TORCH_TRACE`` is set (tlparse).
    """
    logger = logging.getLogger("torch.__trace")
    saved = logger.disabled
    if not os.environ.get("TORCH_TRACE"):
        logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = saved


@pytest.fixture(scope="module")
def counting_backend() -> CountingBackend:
    """The backend under test, wrapped to count graphs that reach it."""
    return CountingBackend(resolve_backend(BACKEND_NAME))


@pytest.mark.parametrize(
    "op_name",
    [pytest.param(name, marks=[pytest.mark.slow] if FULL else []) for name in _op_names()],
)
def test_compiled_matches_eager(op_name: str, counting_backend: CountingBackend) -> None:
    """Compiled results (outputs and mutated inputs) match eager for each sample."""
    op = _find_one(op_name)
    records = run_op(op, counting_backend, num_samples=NUM_SAMPLES, timeout_s=TIMEOUT_S)

    failures = [r for r in records if r.status.failed]
    if failures:
        pytest.fail(_failure_message(failures), pytrace=False)

    compared = [r for r in records if r.status.compared]
    if not compared:
        reasons = "; ".join(f"{r.status.value}: {r.reason}" for r in records) or "no samples"
        pytest.skip(f"no sample could be compared ({reasons})")
    if not FULL and not any(r.reached_backend for r in compared):
        pytest.fail(
            f"{op_name}: no sample reached the backend (Dynamo ran it eagerly: "
            f"{compared[0].reason}); the CI op list must only hold ops that compile",
            pytrace=False,
        )


# --------------------------------------------------------------------------- #
# Harness self-tests: the comparison must not be vacuous.
# --------------------------------------------------------------------------- #


def _eager_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return gm.forward


def _corrupting_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A wrong backend: adds 1 to every floating-point output."""

    def run(*args: Any) -> Any:
        return torch.utils._pytree.tree_map(
            lambda t: t + 1 if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
            gm(*args),
        )

    return run


def _failing_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    raise RuntimeError("backend exploded")


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (_eager_backend, Status.PASS),
        (_corrupting_backend, Status.MISMATCH),
        (_failing_backend, Status.ERROR),
    ],
    ids=["eager", "corrupting", "failing"],
)
def test_harness_detects_backend_bugs(backend: Callable[..., Any], expected: Status) -> None:
    """The harness classifies a correct, a wrong and a crashing backend correctly."""
    (op,) = find_ops(["mul"])
    records = run_op(op, CountingBackend(backend), num_samples=1, timeout_s=TIMEOUT_S)
    assert [r.status for r in records] == [expected], records
    assert all(r.reached_backend for r in records)
