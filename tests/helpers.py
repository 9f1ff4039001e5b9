"""Test helpers: run a function eagerly and through Coil, and compare."""
from __future__ import annotations

from typing import Any, Callable

import torch

import coil


def check(fn: Callable[..., Any], *args: Any, atol: float = 1e-5, rtol: float = 1e-5,
          dynamic: bool | None = False) -> "coil.explain":
    """Compile ``fn`` with Coil, compare with eager, and return Coil's report."""
    expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    report = coil.explain(fn, *args, dynamic=dynamic)
    torch.testing.assert_close(report.result, expected, atol=atol, rtol=rtol, equal_nan=True)
    return report
