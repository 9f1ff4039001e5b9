"""OpInfo under autocast: each float32 sample run inside ``torch.autocast("cpu",
dtype=torch.bfloat16)``, eagerly and compiled, must give the same values within bfloat16
tolerances, and every output the same dtype as eager's (``coil.sdk.testing.opinfo_modes``).

CI runs ``CI_OPS`` plus the autocast-listed ops (:data:`AUTOCAST_EXTRA_OPS`), one sample each;
``COIL_OPINFO_FULL=1`` runs every eligible op and ``COIL_OPINFO_SAMPLES`` sets the samples
(the nightly figure: ``python tests/opinfo_harness.py --mode autocast --all``)."""
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
    CountingBackend,
    Mode,
    Status,
    assert_op_matches_eager,
    find_ops,
    mode_ops,
    run_op,
)

from coil.sdk.testing.compare import Mismatch, compare_with_reference
from coil.sdk.testing.opinfo_modes import AUTOCAST_TOLERANCE

NUM_SAMPLES: int = env_samples(1)

#: Ops CPU autocast runs in bfloat16 (or whose composite bodies do) that ``CI_OPS`` lacks.
AUTOCAST_EXTRA_OPS: tuple[str, ...] = (
    "einsum", "addmv", "baddbmm", "nn.functional.prelu", "nn.functional.bilinear",
)


def _op_names() -> list[str]:
    if FULL:
        return [op.full_name for op in mode_ops(Mode.AUTOCAST)]
    return list(CI_OPS) + list(AUTOCAST_EXTRA_OPS)


@pytest.mark.parametrize("op_name", _op_names())
def test_autocast_matches_eager(op_name: str, counting_backend: CountingBackend) -> None:
    """Under bfloat16 autocast: values within bfloat16 tolerance, dtypes equal to eager's."""
    assert_op_matches_eager(op_name, counting_backend, mode=Mode.AUTOCAST, num_samples=NUM_SAMPLES,
                            timeout_s=TIMEOUT_S, require_reached=not FULL)


# --------------------------------------------------------------------------- #
# Self-tests: dtypes are checked, tolerances fit bfloat16.
# --------------------------------------------------------------------------- #


def _output_backend(change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., Any]:
    """A backend running the graph eagerly and applying ``change`` to each floating output."""
    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            return torch.utils._pytree.tree_map(
                lambda t: change(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                gm(*args))
        return run
    return backend


def _one_ulp_up(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, float("inf")))


@pytest.mark.parametrize(
    ("change", "expected", "reason"),
    [
        (lambda t: t, Status.PASS, ""),
        (lambda t: t.float(), Status.MISMATCH, "dtype torch.float32 != eager's torch.bfloat16"),
        (_one_ulp_up, Status.PASS, ""),
        (lambda t: t * 1.1, Status.MISMATCH, "float64 reference"),
    ],
    ids=["same", "upcast-output", "one-ulp", "ten-percent"],
)
def test_autocast_mode_checks_dtypes_and_values(change: Callable[[torch.Tensor], torch.Tensor],
                                                 expected: Status, reason: str) -> None:
    """``mm`` under autocast gives bfloat16: a float32 result is a mismatch, one bfloat16 ulp
    is not, ten percent is."""
    (op,) = find_ops(["mm"])
    records = run_op(op, CountingBackend(_output_backend(change)), num_samples=1, mode=Mode.AUTOCAST)
    assert [r.status for r in records] == [expected], records
    assert reason in records[0].reason


def test_fp64_reference_judges_low_precision_results() -> None:
    """Beyond tolerance, a result no further from float64 truth than 3x eager's error passes."""
    reference = torch.tensor([1000.0, -3.0], dtype=torch.float64)
    eager = reference.to(torch.bfloat16)  # 1000 rounds to 1000, exact
    off_by_rounding = torch.tensor([1000.0 + 8.0, -3.0], dtype=torch.bfloat16)  # one ulp at 1000
    eager_rounded = torch.tensor([1000.0 + 4.0, -3.0], dtype=torch.float64).to(torch.bfloat16)
    compare_with_reference(eager_rounded, eager_rounded, reference, tol=AUTOCAST_TOLERANCE)
    with pytest.raises(Mismatch, match="float64 reference"):
        compare_with_reference(off_by_rounding, eager, reference, tol=AUTOCAST_TOLERANCE)
    with pytest.raises(Mismatch, match="dtype"):
        compare_with_reference(off_by_rounding.float(), eager, reference, tol=AUTOCAST_TOLERANCE)
