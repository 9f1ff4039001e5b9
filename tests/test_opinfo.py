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

from collections.abc import Callable
from typing import Any

import pytest
import torch
from opinfo_fixtures import _quiet_torch_trace_log, counting_backend  # noqa: F401 (fixtures)
from opinfo_harness import (
    FULL,
    TIMEOUT_S,
    env_samples,
    CI_OPS,
    DEFAULT_SAMPLES,
    CountingBackend,
    Status,
    assert_op_matches_eager,
    eligible_ops,
    find_ops,
    run_op,
)

NUM_SAMPLES: int = env_samples(DEFAULT_SAMPLES)


def _op_names() -> list[str]:
    """Op names to parametrize over: the CI sample, or all eligible ops in full mode."""
    if FULL:
        return [op.full_name for op in eligible_ops()]
    return list(CI_OPS)


@pytest.mark.parametrize(
    "op_name",
    [pytest.param(name, marks=[pytest.mark.slow] if FULL else []) for name in _op_names()],
)
def test_compiled_matches_eager(op_name: str, counting_backend: CountingBackend) -> None:
    """Compiled results (outputs and mutated inputs) match eager for each sample."""
    assert_op_matches_eager(op_name, counting_backend, num_samples=NUM_SAMPLES,
                            timeout_s=TIMEOUT_S, require_reached=not FULL)


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
