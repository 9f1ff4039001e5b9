"""Test helpers: run a function eagerly and through Coil, and compare."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import coil


def check(fn: Callable[..., Any], *args: Any, atol: float = 1e-5, rtol: float = 1e-5,
          dynamic: bool | None = False) -> "coil.explain":
    """Compile ``fn`` with Coil, compare with eager, and return Coil's report."""
    expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    report = coil.explain(fn, *args, dynamic=dynamic)
    torch.testing.assert_close(report.result, expected, atol=atol, rtol=rtol, equal_nan=True)
    return report


def matches_golden(text: str, path: Path, what: str) -> None:
    """Assert ``text`` equals the golden file ``path``; with ``COIL_UPDATE_GOLDEN=1`` (or when
    the file is missing, which then fails) write it instead."""
    if os.environ.get("COIL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(text)
        if os.environ.get("COIL_UPDATE_GOLDEN") != "1":
            pytest.fail(f"wrote missing golden file {path}; check it in")
    assert text == path.read_text(), f"{what} changed; see {path}"
