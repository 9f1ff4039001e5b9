"""Copying call arguments (onto a device, keeping strides, offsets and aliasing) and comparing
nested results against eager, for the OpInfo runner. Moved here from
``tests/opinfo_harness.py`` so the conformance kit and the harness share one definition."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import SampleInput

#: Comparison tolerances (also applied to the eager-vs-eager determinism check).
ATOL = 1e-4
RTOL = 1e-4
#: Maximum length of the one-line reasons stored in records.
REASON_MAX_CHARS = 300


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How close a result must be to eager's: ``|a - e| <= atol + rtol * |e|`` element-wise
    (NaN equals NaN), with dtypes equal. ``low`` (an ``(atol, rtol)`` pair) replaces them for
    tensors whose eager dtype is bfloat16 or float16, and for every floating-point tensor when
    ``low_for_all_floats`` is set: under autocast a float32 result may come from bfloat16
    intermediates. The default has no ``low``: in float32 programs a 16-bit result comes from
    a cast, which must round exactly as eager does."""

    atol: float = ATOL
    rtol: float = RTOL
    low: tuple[float, float] | None = None
    low_for_all_floats: bool = False

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        """(atol, rtol) for a tensor whose eager result has ``dtype``."""
        if self.low is not None and (dtype in (torch.bfloat16, torch.float16)
                                     or (self.low_for_all_floats and dtype.is_floating_point)):
            return self.low
        return self.atol, self.rtol


#: The forward mode's tolerance (float32 results, 1e-4).
DEFAULT_TOLERANCE = Tolerance()

_Memo = dict[tuple[int, int], torch.UntypedStorage]


def one_line(text: str, limit: int = REASON_MAX_CHARS) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def exc_reason(exc: BaseException) -> str:
    """``Type: first line`` of an exception, unwrapping Dynamo's wrappers."""
    inner = exc
    # BackendCompilerFailed / InternalTorchDynamoError wrap the real error.
    for _ in range(3):
        nested = getattr(inner, "inner_exception", None) or inner.__cause__
        if nested is None or type(inner).__name__ not in (
            "BackendCompilerFailed",
            "InternalTorchDynamoError",
        ):
            break
        inner = nested
    prefix = type(exc).__name__
    if inner is not exc:
        prefix += f"({type(inner).__name__})"
    return one_line(f"{prefix}: {one_line(str(inner), 10_000)}")


def _copy_storage(storage: torch.UntypedStorage, device: torch.device | None) -> torch.UntypedStorage:
    if device is None or device == storage.device:
        return storage.clone()
    as_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return as_bytes.to(device).untyped_storage()


def clone_tensor(t: torch.Tensor, memo: _Memo, device: torch.device | None = None) -> torch.Tensor:
    """Deep-copy ``t`` (onto ``device`` when given) preserving size, strides, storage offset
    and aliasing: tensors sharing a storage get copies sharing one copied storage, so ops
    such as ``as_strided`` or in-place ops on views behave as on the original."""
    if (
        type(t) is not torch.Tensor
        or t.layout != torch.strided
        or t.is_quantized
        or t.is_nested
        or t.device.type == "meta"
    ):
        return t.detach().to(device or t.device, copy=True).requires_grad_(t.requires_grad)
    storage = t.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes())
    copied = memo.get(key) if key[0] != 0 else None
    if copied is None:
        copied = _copy_storage(storage, device)
        if key[0] != 0:
            memo[key] = copied
    out = torch.empty((0,), dtype=t.dtype, device=copied.device)
    with torch.no_grad():
        out.set_(copied, t.storage_offset(), t.size(), t.stride())
    out.requires_grad_(t.requires_grad)
    if t.is_conj():
        out = out.conj()
    if t.is_neg():
        out = out._neg_view()
    return out


def clone_tree(value: Any, memo: _Memo, device: torch.device | None = None) -> Any:
    """Clone every tensor in a nest of lists/tuples/dicts; other leaves are shared."""
    if isinstance(value, torch.Tensor):
        return clone_tensor(value, memo, device)
    if isinstance(value, list):
        return [clone_tree(v, memo, device) for v in value]
    if type(value) is tuple:  # not namedtuples / torch.Size
        return tuple(clone_tree(v, memo, device) for v in value)
    if isinstance(value, dict):
        return {k: clone_tree(v, memo, device) for k, v in value.items()}
    return value


def clone_call_args(sample: SampleInput, device: torch.device | None = None
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh ``(args, kwargs)`` for ``op(sample.input, *sample.args, **sample.kwargs)``."""
    memo: _Memo = {}
    args = clone_tree((sample.input, *sample.args), memo, device)
    kwargs = clone_tree(dict(sample.kwargs), memo, device)
    return tuple(args), kwargs


class Mismatch(AssertionError):
    """Raised by :func:`compare` with a path-qualified message."""


class DtypeMismatch(Mismatch):
    """A result of another dtype than eager's (no tolerance or reference excuses it)."""


def compare(actual: Any, expected: Any, path: str = "out", device: str | None = None,
            tol: Tolerance = DEFAULT_TOLERANCE) -> None:
    """Recursively compare ``actual`` with ``expected`` (tensors of ``actual`` must be on
    ``device`` when given, and are copied to the CPU); raise :class:`Mismatch`."""
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        _compare_tensors(actual, expected, path, device, tol)
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{path}: {_short_repr(actual)} != {_short_repr(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            compare(a, e, f"{path}[{i}]", device, tol)
        return
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping) or set(actual) != set(expected):
            raise Mismatch(f"{path}: keys differ")
        for k in expected:
            compare(actual[k], expected[k], f"{path}[{k!r}]", device, tol)
        return
    if isinstance(expected, (float, complex)) and isinstance(actual, (int, float, complex)):
        if not _close_scalar(complex(actual), complex(expected), tol):
            raise Mismatch(f"{path}: {actual!r} != {expected!r}")
        return
    if type(actual) is not type(expected) or actual != expected:
        raise Mismatch(f"{path}: {_short_repr(actual)} != {_short_repr(expected)}")


def _compare_tensors(actual: Any, expected: Any, path: str, device: str | None,
                     tol: Tolerance) -> None:
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        raise Mismatch(f"{path}: type {type(actual).__name__} != {type(expected).__name__}")
    if device is not None and actual.device.type != device:
        raise Mismatch(f"{path}: on {actual.device}, expected on the device under test ({device})")
    a, e = actual.detach().cpu(), expected.detach()
    if a.layout == torch.strided and a.is_conj() != e.is_conj():
        a, e = a.resolve_conj(), e.resolve_conj()
    if a.dtype != e.dtype:  # said plainly: under autocast this is the finding, not the values
        raise DtypeMismatch(f"{path}: dtype {a.dtype} != eager's {e.dtype}")
    atol, rtol = tol.for_dtype(e.dtype)
    try:
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)
    except AssertionError as exc:
        raise Mismatch(f"{path}: {' '.join(str(exc).split())}") from None


def _close_scalar(a: complex, e: complex, tol: Tolerance = DEFAULT_TOLERANCE) -> bool:
    parts = ((a.real, e.real), (a.imag, e.imag))
    for x, y in parts:
        if math.isnan(x) and math.isnan(y):
            continue
        if x == y:
            continue
        if not abs(x - y) <= tol.atol + tol.rtol * abs(y):
            return False
    return True


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare_call(
    actual: tuple[Any, tuple[Any, ...], dict[str, Any]],
    expected: tuple[Any, tuple[Any, ...], dict[str, Any]],
    device: str | None = None,
    tol: Tolerance = DEFAULT_TOLERANCE,
) -> None:
    """Compare (output, args after call, kwargs after call) of two runs."""
    compare(actual[0], expected[0], "out", device, tol)
    # Inputs are compared too: in-place ops and ``out=``-style mutation.
    compare(actual[1], expected[1], "input", device, tol)
    compare(actual[2], expected[2], "kwargs", device, tol)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, Mapping):
        return [leaf for key in sorted(value, key=repr) for leaf in _leaves(value[key])]
    return [value]


def compare_with_reference(actual: Any, expected: Any, reference: Any, path: str = "out",
                           tol: Tolerance = DEFAULT_TOLERANCE, multiplier: float = 3.0) -> None:
    """Judge a low-precision result by its distance from a float64 ``reference`` (the same
    program run in float64): each floating-point tensor of ``actual`` must have eager's dtype,
    NaN where eager has NaN, and a largest error ``max|actual - reference|`` within
    ``multiplier`` times eager's own plus the tolerance's ``atol``; other leaves must be
    close to eager's as :func:`compare` judges them. Raises :class:`Mismatch`."""
    leaves_a, leaves_e, leaves_r = _leaves(actual), _leaves(expected), _leaves(reference)
    if not len(leaves_a) == len(leaves_e) == len(leaves_r):
        raise Mismatch(f"{path}: {len(leaves_a)} results, eager {len(leaves_e)}, "
                       f"float64 reference {len(leaves_r)}")
    for i, (a, e, r) in enumerate(zip(leaves_a, leaves_e, leaves_r)):
        where = f"{path} leaf {i}"
        floating = all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (a, e, r))
        if not floating or a.shape != e.shape or e.shape != r.shape:
            compare(a, e, where, None, tol)
            continue
        if a.dtype != e.dtype:
            raise DtypeMismatch(f"{where}: dtype {a.dtype} != eager's {e.dtype}")
        a64, e64, r64 = (t.detach().cpu().double() for t in (a, e, r))
        if not torch.equal(a64.isnan(), e64.isnan()):
            raise Mismatch(f"{where}: NaN where eager has none, or the reverse")
        finite = ~e64.isnan() & r64.isfinite()
        err_a = (a64 - r64).abs()[finite].max().item() if finite.any() else 0.0
        err_e = (e64 - r64).abs()[finite].max().item() if finite.any() else 0.0
        atol, _ = tol.for_dtype(e.dtype)
        if not err_a <= multiplier * err_e + atol:
            raise Mismatch(f"{where}: beyond tolerance, and {err_a:.3g} from the float64 "
                           f"reference where eager is {err_e:.3g} (allowed {multiplier:g}x + {atol:g})")
