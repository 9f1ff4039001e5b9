"""Tier ``templates``: a matrix product with an epilogue compiles into ONE kernel on the
device (the template with the epilogue fused, not an ATen library call) and matches eager.

The device takes templates in two ways: its backend generates some ops itself
(``Capabilities.templates``), or it embeds the installed template plugins' templates of the
dialects it speaks (``Capabilities.template_dialects``, :mod:`coil.sdk.templates`). The tier
is skipped when it declares neither. Each case runs in float32, float16 and bfloat16 (those
in ``Capabilities.dtypes``) with templates forced (``templates="force"``): a dtype no template
takes runs as a library call and is passed over; an op that no dtype gets a template for
fails when the backend lists it in ``Capabilities.templates``, and is skipped otherwise
(no installed template computes it)."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from coil.sdk import config
from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("templates")

#: Template op -> (function with an epilogue, its float32 CPU inputs, the ATen op it replaces).
CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple], str]] = {
    "mm": (lambda a, b, bias: torch.relu(a @ b + bias),
           lambda: (torch.randn(128, 64), torch.randn(64, 96), torch.randn(96)), "aten.mm"),
    "addmm": (lambda bias, a, b: torch.addmm(bias, a, b) * 2,
              lambda: (torch.randn(96), torch.randn(128, 64), torch.randn(64, 96)), "aten.addmm"),
    "bmm": (lambda a, b: torch.tanh(torch.bmm(a, b)),
            lambda: (torch.randn(4, 32, 48), torch.randn(4, 48, 40)), "aten.bmm"),
}
#: Matmul templates may accumulate in another order or in reduced precision.
TOL = {torch.float32: 2e-2, torch.float16: 3e-2, torch.bfloat16: 6e-2}


@pytest.mark.parametrize("op", list(CASES))
def test_template_with_epilogue(coil_kit: Kit, op: str) -> None:
    fn, make_inputs, aten_op = CASES[op]
    caps = coil_kit.capabilities
    templated = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        if dtype not in caps.dtypes:
            continue
        inputs = tuple(t.to(dtype) for t in make_inputs())
        with config.override(templates="force"):
            report = coil_kit.check(fn, *inputs, atol=TOL[dtype], rtol=TOL[dtype])
        kernels = coil_kit.assert_kernels(report)
        coil_kit.assert_no_fallbacks(report)
        if any(c.startswith(aten_op + ".") for c in report.library_calls):
            continue  # no template takes this dtype
        templated.append(dtype)
        assert len(kernels) == 1, (
            f"{op} ({dtype}): the epilogue did not fuse into the template: {[k.name for k in kernels]}")
    if not templated:
        if op in caps.templates:
            pytest.fail(f"{op} is in capabilities.templates but ran as an ATen library call in every dtype")
        pytest.skip(f"no template on {coil_kit.device.type} computes {op} (dialects: "
                    f"{sorted(getattr(caps, 'template_dialects', ()))})")
