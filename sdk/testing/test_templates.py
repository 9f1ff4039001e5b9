"""Tier ``templates``: for each op the device declares templates for
(``Capabilities.templates``), the op with an epilogue compiles under
``mode="max-autotune"`` into ONE kernel on the device (template + fused epilogue, not an ATen
library call) and matches eager. The tier is skipped when the device declares no templates;
the kit has cases for ``mm``, ``addmm`` and ``bmm`` (other declared ops are not checked)."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("templates")

#: Template op -> (function with an epilogue, its CPU inputs, the ATen op it must generate).
CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple], str]] = {
    "mm": (lambda a, b, bias: torch.relu(a @ b + bias),
           lambda: (torch.randn(128, 64), torch.randn(64, 96), torch.randn(96)), "aten.mm"),
    "addmm": (lambda bias, a, b: torch.addmm(bias, a, b) * 2,
              lambda: (torch.randn(96), torch.randn(128, 64), torch.randn(64, 96)), "aten.mm"),
    "bmm": (lambda a, b: torch.tanh(torch.bmm(a, b)),
            lambda: (torch.randn(4, 32, 48), torch.randn(4, 48, 40)), "aten.bmm"),
}
#: Matmul templates may accumulate in TF32 or reduced precision.
TOL = 2e-2


@pytest.mark.parametrize("op", list(CASES))
def test_template_with_epilogue(coil_kit: Kit, op: str) -> None:
    if op not in coil_kit.capabilities.templates:
        pytest.skip(f"capabilities.templates lacks {op}")
    fn, make_inputs, aten_op = CASES[op]
    report = coil_kit.check(fn, *make_inputs(), atol=TOL, rtol=TOL, mode="max-autotune")
    kernels = coil_kit.assert_kernels(report)
    coil_kit.assert_no_fallbacks(report)
    library = [c for c in report.library_calls if c.startswith(aten_op + ".")]
    assert not library, f"{op} ran as an ATen library call {library}, not as the device's template"
    assert any(o.startswith(aten_op + ".") for k in kernels for o in k.ops), (
        f"no kernel on {coil_kit.device.type} generates {aten_op}: {[k.ops for k in kernels]}")
    assert len(kernels) == 1, f"the epilogue did not fuse into the template: {[k.name for k in kernels]}"

