"""Golden files of the C++ generated for a few canonical graphs: an unintended change to
codegen shows up as a diff here. Regenerate with ``COIL_UPDATE_GOLDEN=1 pytest tests/test_golden.py``
after checking that the new code is what you meant."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import coil
from helpers import matches_golden

GOLDEN = Path(__file__).with_name("golden")

CASES = {
    "pointwise_chain": (lambda x: torch.sigmoid(x * 2 + 1) - x.abs(), lambda: (torch.randn(1024),)),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(64, 256),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (256,), w, b),
                   lambda: (torch.randn(64, 256), torch.randn(256), torch.randn(256))),
    "sum_first_dim": (lambda x: x.sum(0), lambda: (torch.randn(64, 256),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_code_matches_golden(case):
    fn, make = CASES[case]
    report = coil.explain(fn, *make())
    text = "\n".join(k.source.rstrip() for k in report.kernels) + "\n"
    path = GOLDEN / f"{case}.cpp"
    matches_golden(text, path, f"generated code for {case}")
