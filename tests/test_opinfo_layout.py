"""OpInfo layouts: each sample again with its tensors re-strided, same values
(``coil.sdk.testing.opinfo_layout``: column-major last two dims; a step of 2 and a storage
offset; channels-last for 4-D and 5-D), compiled against eager on the same tensors.

CI runs ``CI_OPS``, one sample each (every variant of it); ``COIL_OPINFO_FULL=1`` runs every
eligible op and ``COIL_OPINFO_SAMPLES`` sets the samples (the nightly figure:
``python tests/opinfo_harness.py --mode layout --all``)."""
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

from coil.sdk.testing.opinfo_layout import OFFSET, VARIANTS, layout_variants
from coil.sdk.testing.opinfo_modes import select_cases

NUM_SAMPLES: int = env_samples(1)

#: ``CI_OPS`` less the factories, which take no tensor to re-stride.
LAYOUT_CI_OPS: tuple[str, ...] = tuple(name for name in CI_OPS if name not in ("full", "arange"))


def _op_names() -> list[str]:
    return [op.full_name for op in mode_ops(Mode.LAYOUT)] if FULL else list(LAYOUT_CI_OPS)


@pytest.mark.parametrize("op_name", _op_names())
def test_layouts_match_eager(op_name: str, counting_backend: CountingBackend) -> None:
    """On transposed, stepped/offset and channels-last inputs, compiled matches eager."""
    assert_op_matches_eager(op_name, counting_backend, mode=Mode.LAYOUT, num_samples=NUM_SAMPLES,
                            timeout_s=TIMEOUT_S, require_reached=not FULL)


# --------------------------------------------------------------------------- #
# Self-tests: the variants keep values, change strides, and catch a stride-blind backend.
# --------------------------------------------------------------------------- #


def test_variants_keep_values_and_change_strides() -> None:
    (op,) = find_ops(["nn.functional.conv2d"])
    sample = next(iter(op.sample_inputs("cpu", torch.float32)))
    variants = dict(layout_variants(sample))
    assert set(variants) == set(VARIANTS)
    for name, restrided in variants.items():
        before, after = sample.input, restrided.input
        torch.testing.assert_close(after, before, atol=0, rtol=0)
        assert after.stride() != before.stride(), name
    assert variants["strided+offset"].input.storage_offset() == OFFSET
    assert variants["channels_last"].input.is_contiguous(memory_format=torch.channels_last)


def _stride_blind_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A wrong backend: reads every tensor input as if it were contiguous from its offset."""
    def blind(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.is_contiguous() or t.numel() == 0:
            return t
        return torch.as_strided(t, t.shape, torch.empty(t.shape).stride(), t.storage_offset())

    def run(*args: Any) -> Any:
        return gm(*[blind(a) for a in args])

    return run


def test_layout_mode_catches_a_stride_blind_backend() -> None:
    """The stride-blind backend passes the forward mode on contiguous samples and fails here."""
    (op,) = find_ops(["sin"])  # its first sample is 20 x 20
    backend = CountingBackend(_stride_blind_backend)
    assert {r.status for r in run_op(op, backend, num_samples=1, mode=Mode.FORWARD)} == {Status.PASS}
    records = run_op(op, backend, num_samples=1, mode=Mode.LAYOUT)
    assert {r.variant for r in records} >= {"transposed", "strided+offset"}
    assert all(r.status is Status.MISMATCH for r in records), records


def test_a_later_sample_adds_channels_last() -> None:
    """An op whose first samples have no 4-D tensor still gets a channels-last case, from
    the first later sample that has one."""
    (op,) = find_ops(["sum"])
    selected = select_cases(Mode.LAYOUT, op, 1)
    variants = [(index, variant) for index, _, factories in selected for variant, _ in factories]
    assert all(variant != "channels_last" for index, variant in variants if index == 0)
    (extra,) = [index for index, variant in variants if variant == "channels_last"]
    assert extra > 0
