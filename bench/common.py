"""Device-neutral helpers shared by Coil's benchmarks: checking a compiled result against eager,
one-line error descriptions, ideal-byte counting, sample statistics, cache-dir environment
handling and plain-text / markdown table rendering.

Nothing here touches a device or times anything; the benchmark scripts (``bench/gpu.py``)
import it as ``common`` (the script's directory is first on ``sys.path``).
"""

from __future__ import annotations

import logging
import os
import statistics
import traceback
from collections.abc import Sequence

import torch

log = logging.getLogger("bench.common")

Tensors = tuple[torch.Tensor, ...]

#: Cache directories a cold compile must find empty (Inductor, Triton, Coil).
CACHE_ENV_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COIL_CACHE_DIR")


# --------------------------------------------------------------------------- #
# Results against eager
# --------------------------------------------------------------------------- #


def compare(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
            atol: float, rtol: float, norm_tol: float | None = None) -> str:
    """'ok (...)' or 'MISMATCH: ...' for a compiled result against the eager reference.

    With ``norm_tol`` each output is judged by its relative L2 error
    ``||a - e|| / ||e||`` (robust for matmul-heavy outputs whose elements near zero
    differ by accumulation order); otherwise by ``torch.testing.assert_close``.
    """
    if len(actual) != len(expected):
        return f"MISMATCH: {len(actual)} outputs vs {len(expected)} in eager"
    worst = 0.0
    for a, e in zip(actual, expected):
        err = _relative_l2(a, e) if norm_tol is not None else _max_abs_error(a, e, atol, rtol)
        if isinstance(err, str):
            return err
        if norm_tol is not None and err > norm_tol:
            return f"MISMATCH: relative L2 error {err:.1e} > {norm_tol:.0e}"
        worst = max(worst, err)
    kind = "rel L2 err" if norm_tol is not None else "max err"
    return f"ok ({kind} {worst:.1e})"


def _max_abs_error(a: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> float | str:
    try:
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol)
    except Exception as exc:  # noqa: BLE001 - AssertionError, or TypeError for a non-tensor output
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return "MISMATCH: " + "; ".join(lines[:3])
    return (a.double() - e.double()).abs().max().item() if a.numel() else 0.0


def _relative_l2(a: torch.Tensor, e: torch.Tensor) -> float | str:
    if not isinstance(a, torch.Tensor) or a.shape != e.shape or a.dtype != e.dtype:
        return f"MISMATCH: got {_describe(a)}, eager gave {_describe(e)}"
    if not bool(torch.isfinite(a).all()):
        return "MISMATCH: non-finite values"
    ref = e.double().norm().item()
    return (a.double() - e.double()).norm().item() / max(ref, 1e-30)


def _describe(t: object) -> str:
    return f"{t.dtype}{list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def passed(check: str) -> bool:
    """True for the eager reference and for compiled results that matched it."""
    return check == "reference" or check.startswith("ok")


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #

_logged_failures: set[str] = set()


def log_failure(context: str, exc: BaseException) -> str:
    """Log a failure (full traceback the first time a message is seen) and return its one-liner."""
    msg = one_line(exc)
    if msg in _logged_failures:
        log.warning("%s failed: %s (traceback logged above)", context, msg)
    else:
        _logged_failures.add(msg)
        log.warning("%s failed:\n%s", context, "".join(traceback.format_exception(exc)))
    return msg


def _root_cause(exc: BaseException) -> BaseException:
    root, seen = exc, {id(exc)}
    # dynamo's BackendCompilerFailed raises "from None" but keeps the backend's error as inner_exception
    while (inner := root.__cause__ or getattr(root, "inner_exception", None)) is not None and id(inner) not in seen:
        root = inner
        seen.add(id(inner))
    return root


def one_line(exc: BaseException, limit: int = 200) -> str:
    """Short single-line description of ``exc``, naming its root cause when it wraps one."""
    root = _root_cause(exc)
    text = next((ln.strip() for ln in str(root).splitlines() if ln.strip()), "")
    msg = f"{type(root).__name__}: {text}" if text else type(root).__name__
    if root is not exc:
        msg = f"{type(exc).__name__} <- {msg}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


# --------------------------------------------------------------------------- #
# Measurement arithmetic
# --------------------------------------------------------------------------- #


def ideal_bytes_of(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> int:
    """Bytes moved if each distinct input is read once and each output written once."""
    total, seen = 0, set()
    for t in inputs:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total + sum(t.numel() * t.element_size() for t in outputs)


def sample_stats(samples: Sequence[float]) -> dict[str, float | int | list[float]]:
    """Median, min, inter-quartile range relative to the median (full range below 4 samples),
    and the samples themselves."""
    med = statistics.median(samples)
    if len(samples) < 4:
        spread = max(samples) - min(samples)
    else:
        q1, _, q3 = statistics.quantiles(samples, n=4)
        spread = q3 - q1
    return {"median_s": med, "min_s": min(samples), "iqr": spread / med if med > 0 else 0.0,
            "n": len(samples), "samples_s": list(samples)}


# --------------------------------------------------------------------------- #
# Cache directories
# --------------------------------------------------------------------------- #


def cache_env(root: str) -> dict[str, str]:
    """The cache-dir environment variables pointing into ``root`` (directories created)."""
    env = {var: os.path.join(root, var.lower()) for var in CACHE_ENV_VARS}
    for path in env.values():
        os.makedirs(path, exist_ok=True)
    return env


# --------------------------------------------------------------------------- #
# Tables
# --------------------------------------------------------------------------- #


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    """Markdown table lines; ``right[i]`` right-aligns column ``i``."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return lines


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool],
               max_last: int = 60) -> list[str]:
    """Aligned plain-text table; the last column is cut to ``max_last`` characters."""
    cut = [[*row[:-1], row[-1] if len(row[-1]) <= max_last else row[-1][: max_last - 3] + "..."] for row in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *cut)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in cut)]

