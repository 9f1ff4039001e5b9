"""The conformance kit's tiers: their names, what each checks, and which capability a device
must declare for a tier to run. A tier the device lacks is skipped with the reason, never
passed. Imports nothing heavy: the pytest plugin reads this in every session."""
from __future__ import annotations

from typing import Any, Callable

#: Every tier, in scorecard order, with a one-line summary.
TIERS: dict[str, str] = {
    "runtime": "backend registered, doctor checks, synchronize, a trivial function, no recompile",
    "pointwise": "a chain of pointwise ops is one kernel on the device, every declared dtype",
    "reductions": "each declared reduction kind, over inner, outer and all dims",
    "views_indexing": "views without copies, gather/index/embedding, scatter, scans, cat/pad",
    "fusion": "softmax, layer norm, RMS norm and bias+GELU+residual are one kernel each",
    "memory_reuse": "the planned peak of a chain is below the naive sum; inputs never reused",
    "autotune_cache": "a second compile in a fresh process reads the tuning cache, tunes nothing",
    "backward": "gradients of compiled functions match eager; backward kernels on the device",
    "dynamic_shapes": "one symbolic compile serves several sizes",
    "templates": "each op the backend has a template for, with a fused epilogue",
    "host_programs": "runs of kernels as one host call each: results, errors, gradients, threads as without",
    "opinfo": "PyTorch's OpInfo samples against eager (off by default; expected-failures file)",
}

#: Tiers run when ``--coil-tiers`` is not given.
DEFAULT_TIERS: tuple[str, ...] = tuple(t for t in TIERS if t != "opinfo")


def _needs_flag(flag: str, default: bool) -> Callable[[Any], str | None]:
    def check(caps: Any) -> str | None:
        return None if getattr(caps, flag, default) else f"capabilities.{flag} is False"
    return check


def _needs_templates(caps: Any) -> str | None:
    if getattr(caps, "templates", frozenset()) or getattr(caps, "template_dialects", frozenset()):
        return None
    return "capabilities.templates and capabilities.template_dialects are empty"


def _needs_reductions(caps: Any) -> str | None:
    return None if getattr(caps, "reductions", frozenset()) else "capabilities.reductions is empty"


def _needs_float32(caps: Any) -> str | None:
    import torch  # the kit's pytest plugin imports this module in every pytest session
    return None if torch.float32 in caps.dtypes else "capabilities.dtypes lacks torch.float32"


_REQUIREMENTS: dict[str, Callable[[Any], str | None]] = {
    "reductions": _needs_reductions,
    "autotune_cache": _needs_flag("autotune", False),
    "backward": _needs_flag("backward", True),
    "dynamic_shapes": _needs_flag("dynamic_shapes", True),
    "templates": _needs_templates,
    "host_programs": _needs_flag("host_programs", False),
    "opinfo": _needs_float32,
}


def missing_capability(tier: str, capabilities: Any) -> str | None:
    """Why a device with ``capabilities`` cannot run ``tier`` (None when it can)."""
    requirement = _REQUIREMENTS.get(tier)
    return requirement(capabilities) if requirement is not None else None


def parse_tiers(text: str | None, *, opinfo: bool = False) -> tuple[str, ...]:
    """The tiers a comma-separated ``--coil-tiers`` value selects (default: every tier but
    opinfo; ``opinfo=True`` adds it). Raises ValueError naming the known tiers."""
    names = [t.strip() for t in (text or "").split(",") if t.strip()] or list(DEFAULT_TIERS)
    unknown = [t for t in names if t not in TIERS]
    if unknown:
        raise ValueError(f"unknown conformance tier(s) {', '.join(unknown)}; "
                         f"known tiers: {', '.join(TIERS)}")
    if opinfo and "opinfo" not in names:
        names.append("opinfo")
    return tuple(t for t in TIERS if t in names)
