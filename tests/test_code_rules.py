"""The rules of Coil's style guide ("Habits for this project") that a test can check, run in
CI like any other test.

* No Python module under ``core/``, ``sdk/``, ``plugins/``, ``bench/`` or ``tests/`` is over
  :data:`MAX_LINES` lines: a module that long holds more than one idea and is split along a
  real seam (workloads apart from the runner, helpers grouped by what they compute)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED_DIRS = ("core", "sdk", "plugins", "bench", "tests")
MAX_LINES = 600


def _python_modules() -> list[Path]:
    return sorted(path for folder in CHECKED_DIRS for path in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in path.parts)


def _line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_modules_are_at_most_600_lines():
    modules = _python_modules()
    assert modules, f"no Python modules found under {ROOT}"
    too_long = {path.relative_to(ROOT).as_posix(): n for path in modules
                if (n := _line_count(path)) > MAX_LINES}
    assert not too_long, (
        f"modules over {MAX_LINES} lines (split each along a seam, one idea per module): "
        + ", ".join(f"{name} ({n} lines)" for name, n in sorted(too_long.items(), key=lambda kv: -kv[1])))
