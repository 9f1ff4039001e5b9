"""Differential OpInfo harness: compiled (``torch.compile``) results versus eager.

This module drives PyTorch's OpInfo database
(``torch.testing._internal.common_methods_invocations.op_db``) through a
``torch.compile`` backend and compares every result against plain eager
execution.  It is shared by ``tests/test_opinfo.py`` (pytest) and usable as a
command-line tool::

    python tests/opinfo_harness.py --all --backend aot_eager --json report.json
    python tests/opinfo_harness.py --ops add,sum,nn.functional.relu --samples 4

For every eligible OpInfo (float32 supported on CPU, not random -- see
:data:`SKIPPED_OPS`) the harness takes the first ``N`` deterministic samples of
``op.sample_inputs("cpu", torch.float32)`` and, for each sample:

1. runs the op eagerly twice on two independent copies of the inputs.  If the
   first run raises, the sample is ``eager-error`` (skipped); if the two runs
   disagree the sample is ``nondeterministic`` (skipped);
2. resets Dynamo, compiles ``lambda *a, **k: op(*a, **k)`` with
   ``torch.compile(..., backend=CountingBackend(real), dynamic=False)`` and runs
   it on a third copy of the inputs;
3. compares outputs *and* the post-call state of the inputs (so in-place ops
   are checked too) with ``torch.testing.assert_close(atol=1e-4, rtol=1e-4,
   equal_nan=True)``.

The result is ``pass``, ``mismatch`` or ``error`` (the compiled run raised,
including compile failures and per-sample timeouts).  The counting backend
records how many graphs actually reached the real backend: Dynamo may graph
break or fall back to eager (e.g. data-dependent ops such as ``nonzero`` or
``item``), in which case a ``pass`` says nothing about the backend under test;
such samples are reported separately as "not reached".

Random ops are never compared: :data:`SKIPPED_OPS` lists them by name with a
reason, :data:`RANDOM_SAMPLE_FILTERS` drops the random samples of otherwise
deterministic ops (attention with dropout), and the eager-vs-eager check above
catches anything missed.  OpInfo's ``wrapper_set_seed`` indirection, which
Dynamo cannot trace, is bypassed for both runs (see ``_without_seed_wrapper``).

The backend is chosen by name.  The default is :data:`DEFAULT_BACKEND_NAME`
(``"coil"``), overridable with the ``COIL_OPINFO_BACKEND`` environment variable
or ``--backend``; any Dynamo-registered backend name (e.g. ``aot_eager``) or a
``module:attribute`` path to a backend callable is accepted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import functools
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch._dynamo
import torch.fx

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput

__all__ = [
    "ATOL",
    "BACKEND_ENV_VAR",
    "DEFAULT_BACKEND_NAME",
    "DEFAULT_SAMPLES",
    "DEFAULT_TIMEOUT_S",
    "RTOL",
    "SKIPPED_OPS",
    "CountingBackend",
    "SampleRecord",
    "Status",
    "default_backend_name",
    "eligible_ops",
    "find_ops",
    "load_op_db",
    "main",
    "resolve_backend",
    "run_op",
    "run_ops",
    "run_sample",
    "skip_reason",
    "summarize",
]

# --------------------------------------------------------------------------- #
# Configuration
# --------------------------------------------------------------------------- #

#: The backend under test.  Change this one line (or set COIL_OPINFO_BACKEND).
DEFAULT_BACKEND_NAME = "coil"
#: Environment variable that overrides :data:`DEFAULT_BACKEND_NAME`.
BACKEND_ENV_VAR = "COIL_OPINFO_BACKEND"
#: Samples taken per OpInfo (after dropping random samples).
DEFAULT_SAMPLES = 2
#: Wall-clock guard for one sample (eager runs + compile + compiled run).
DEFAULT_TIMEOUT_S = 60.0
#: Comparison tolerances (also applied to the eager-vs-eager determinism check).
ATOL = 1e-4
RTOL = 1e-4

DEVICE = "cpu"
DTYPE = torch.float32
#: Seed set before generating each op's samples, so runs are reproducible.
SEED = 0
#: Bypass OpInfo's ``wrapper_set_seed`` (see :func:`_without_seed_wrapper`).
STRIP_SEED_WRAPPER = True
#: Maximum length of the one-line reasons stored in records.
_REASON_MAX_CHARS = 300


def default_backend_name() -> str:
    """Return the backend name: ``$COIL_OPINFO_BACKEND`` or :data:`DEFAULT_BACKEND_NAME`."""
    return os.environ.get(BACKEND_ENV_VAR) or DEFAULT_BACKEND_NAME


# --------------------------------------------------------------------------- #
# Skip lists
# --------------------------------------------------------------------------- #

_RNG = "draws from the RNG; compiled and eager consume/produce random numbers differently"
_UNINIT = "returns uninitialized memory"

#: OpInfos (by full name, ``name.variant``) that are never compared, with a reason.
#: Besides this table, :func:`skip_reason` also skips any OpInfo flagged
#: ``has_nondeterministic_output`` or ``skip_correctness_check_compile_vs_eager``,
#: and :func:`run_sample` skips samples whose two eager runs disagree.
SKIPPED_OPS: dict[str, str] = {
    # Random sampling (in-place and functional).
    "bernoulli": f"Bernoulli sampling; {_RNG}",
    "cauchy": f"in-place Cauchy sampling (Tensor.cauchy_); {_RNG}",
    "exponential": f"in-place exponential sampling (Tensor.exponential_); {_RNG}",
    "geometric": f"in-place geometric sampling (Tensor.geometric_); {_RNG}",
    "log_normal": f"in-place log-normal sampling (Tensor.log_normal_); {_RNG}",
    "uniform": f"in-place uniform sampling (Tensor.uniform_); {_RNG}",
    "normal": f"normal sampling (torch.normal); {_RNG}",
    "normal.in_place": f"in-place normal sampling (Tensor.normal_); {_RNG}",
    "normal.number_mean": f"normal sampling with scalar mean; {_RNG}",
    "multinomial": f"multinomial sampling; {_RNG}",
    # Random factories.
    "rand_like": f"random factory; {_RNG}",
    "randn": f"random factory; {_RNG}",
    "randn_like": f"random factory; {_RNG}",
    "randint": f"random factory; {_RNG}",
    "randint_like": f"random factory; {_RNG}",
    # Random masks / slopes / regions.
    "nn.functional.dropout": f"random dropout mask; {_RNG}",
    "nn.functional.dropout2d": f"random channel dropout mask; {_RNG}",
    "nn.functional.dropout3d": f"random channel dropout mask; {_RNG}",
    "nn.functional.alpha_dropout": f"random dropout mask; {_RNG}",
    "nn.functional.feature_alpha_dropout.with_train": f"random mask (training=True); {_RNG}",
    "nn.functional.rrelu": f"random negative slopes when training=True; {_RNG}",
    "nn.functional.fractional_max_pool2d": f"random pooling regions (no _random_samples); {_RNG}",
    "nn.functional.fractional_max_pool3d": f"random pooling regions (no _random_samples); {_RNG}",
    # Randomized algorithms.
    "svd_lowrank": f"randomized SVD (random Gaussian projection); {_RNG}",
    "pca_lowrank": f"randomized PCA (random Gaussian projection); {_RNG}",
    # Uninitialized memory.
    "empty": _UNINIT,
    "empty_like": _UNINIT,
    "empty_strided": _UNINIT,
    "empty_permuted": _UNINIT,
    "new_empty": _UNINIT,
    "new_empty_strided": _UNINIT,
    "resize_": f"{_UNINIT} when the tensor grows",
    "resize_as_": f"{_UNINIT} when the tensor grows",
}


def _sdpa_random_sample(sample: SampleInput) -> str | None:
    if float(sample.kwargs.get("dropout_p", 0.0) or 0.0) > 0.0:
        return "dropout_p > 0 draws a random attention-dropout mask"
    return None


def _mha_random_sample(sample: SampleInput) -> str | None:
    # multi_head_attention_forward(query, key, value, embed_dim_to_check,
    #   num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn,
    #   dropout_p, ...): sample.args starts at ``key`` so dropout_p is args[9].
    dropout_p = sample.kwargs.get("dropout_p", sample.args[9] if len(sample.args) > 9 else 0.0)
    if sample.kwargs.get("training", True) and float(dropout_p or 0.0) > 0.0:
        return "training=True with dropout_p > 0 draws a random dropout mask"
    return None


#: Per-sample filters for ops that are only random for some samples.  A filter
#: returns a reason string for samples to drop (they do not count towards N).
RANDOM_SAMPLE_FILTERS: dict[str, Callable[[SampleInput], str | None]] = {
    "nn.functional.scaled_dot_product_attention": _sdpa_random_sample,
    "nn.functional.multi_head_attention_forward": _mha_random_sample,
}


# --------------------------------------------------------------------------- #
# OpInfo discovery
# --------------------------------------------------------------------------- #


@functools.cache
def load_op_db() -> tuple[OpInfo, ...]:
    """Import (lazily, it takes a few seconds) and return PyTorch's ``op_db``."""
    from torch.testing._internal.common_methods_invocations import op_db

    return tuple(op_db)


def skip_reason(op: OpInfo) -> str | None:
    """Return why ``op`` is not eligible for differential testing, or ``None``."""
    if op.full_name in SKIPPED_OPS:
        return SKIPPED_OPS[op.full_name]
    if getattr(op, "has_nondeterministic_output", False):
        return "OpInfo.has_nondeterministic_output"
    if getattr(op, "skip_correctness_check_compile_vs_eager", False):
        return "OpInfo.skip_correctness_check_compile_vs_eager"
    if not op.supports_dtype(DTYPE, DEVICE):
        return f"{DTYPE} not supported on {DEVICE}"
    return None


def eligible_ops() -> list[OpInfo]:
    """All OpInfos supporting float32 on CPU that are not skipped (``op_db`` order)."""
    return [op for op in load_op_db() if skip_reason(op) is None]


def find_ops(names: Sequence[str], *, include_skipped: bool = False) -> list[OpInfo]:
    """Resolve op names to OpInfos.

    A name matches an OpInfo's full name (``"div.trunc_rounding"``) exactly or,
    failing that, its base name (``"div"`` selects every ``div`` variant).
    Unknown names raise ``KeyError``; ineligible ops are dropped unless
    ``include_skipped`` is true.
    """
    db = load_op_db()
    by_full = {op.full_name: op for op in db}
    selected: list[OpInfo] = []
    for name in names:
        matches = [by_full[name]] if name in by_full else [op for op in db if op.name == name]
        if not matches:
            raise KeyError(f"no OpInfo named {name!r}")
        for op in matches:
            if op not in selected and (include_skipped or skip_reason(op) is None):
                selected.append(op)
    return selected


# --------------------------------------------------------------------------- #
# Backend handling
# --------------------------------------------------------------------------- #

CompilerFn = Callable[..., Callable[..., Any]]


def resolve_backend(name: str) -> CompilerFn:
    """Return the backend callable for ``name``.

    Accepts a Dynamo-registered backend name, or ``"package.module:attr"``.
    ``"coil"`` falls back to importing ``coil.backend.compile_fx`` when the
    entry point is not registered (e.g. the package is not pip-installed).
    """
    if ":" in name:
        import importlib

        module_name, _, attr = name.partition(":")
        return cast(CompilerFn, getattr(importlib.import_module(module_name), attr))
    from torch._dynamo.backends.registry import lookup_backend

    try:
        return lookup_backend(name)
    except Exception:
        if name != "coil":
            raise
    try:
        from coil.backend import compile_fx  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise RuntimeError(
            "backend 'coil' is neither registered with Dynamo nor importable as "
            f"coil.backend.compile_fx ({exc}); install it with `pip install -e .`, "
            f"or set {BACKEND_ENV_VAR}=aot_eager to test the harness"
        ) from exc
    return cast(CompilerFn, compile_fx)


class CountingBackend:
    """Wrap a backend and count the FX graphs that reach it.

    Dynamo only calls the backend when it captured a graph with at least one
    operation; a frame that graph-breaks before capturing anything, or whose
    result is computed at trace time, never reaches it.
    """

    def __init__(self, inner: CompilerFn) -> None:
        self.inner = inner
        self.graphs = 0
        self.nodes = 0

    def reset(self) -> None:
        """Zero the counters."""
        self.graphs = 0
        self.nodes = 0

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any
    ) -> Callable[..., Any]:
        self.graphs += 1
        self.nodes += sum(
            node.op in ("call_function", "call_method", "call_module") for node in gm.graph.nodes
        )
        return self.inner(gm, example_inputs, **kwargs)


# --------------------------------------------------------------------------- #
# Records
# --------------------------------------------------------------------------- #


class Status(str, enum.Enum):
    """Outcome of one sample."""

    PASS = "pass"
    MISMATCH = "mismatch"  # compiled result differs from eager
    ERROR = "error"  # compiled run (or compilation) raised, or timed out
    EAGER_ERROR = "eager-error"  # skipped: eager raised, or sample generation failed
    NONDETERMINISTIC = "nondeterministic"  # skipped: two eager runs disagree

    @property
    def failed(self) -> bool:
        """Whether this outcome is a test failure."""
        return self in (Status.MISMATCH, Status.ERROR)

    @property
    def compared(self) -> bool:
        """Whether a compiled run was compared against eager."""
        return self in (Status.PASS, Status.MISMATCH, Status.ERROR)


@dataclasses.dataclass
class SampleRecord:
    """Result of one (op, sample) pair."""

    op: str  #: OpInfo full name (``name.variant``).
    sample_index: int  #: Index into ``op.sample_inputs(...)``; -1 for op-level records.
    status: Status
    reached_backend: bool  #: At least one graph was handed to the backend.
    graphs: int = 0  #: Number of graphs handed to the backend.
    graph_nodes: int = 0  #: Total call nodes in those graphs.
    graph_breaks: int = 0  #: Graph breaks Dynamo reported while compiling.
    reason: str = ""  #: One-line explanation for non-pass outcomes / breaks.
    sample: str = ""  #: Short description of the sample.
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """JSON-serializable dict."""
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data


# --------------------------------------------------------------------------- #
# Per-sample helpers
# --------------------------------------------------------------------------- #


class SampleTimeout(BaseException):
    """Raised by the alarm handler when a sample exceeds its time budget.

    Derives from ``BaseException`` so that ``except Exception`` blocks inside
    Dynamo/the backend do not swallow or re-wrap it.
    """


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`SampleTimeout` after ``seconds`` (main thread, POSIX only).

    Uses ``SIGALRM``, so it cannot interrupt a long-running C++ kernel until it
    returns to Python.  An outer ``ITIMER_REAL`` timer (e.g. pytest-timeout's
    signal method) is re-armed afterwards with its remaining time.
    """
    if (
        seconds is None
        or seconds <= 0
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    limit = seconds

    def _on_alarm(signum: int, frame: Any) -> None:
        raise SampleTimeout(f"timed out after {limit:g}s")

    outer_remaining, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, min(limit, outer_remaining or limit))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_remaining > 0:
            left = max(outer_remaining - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


def _one_line(text: str, limit: int = _REASON_MAX_CHARS) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _exc_reason(exc: BaseException) -> str:
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
    return _one_line(f"{prefix}: {_one_line(str(inner), 10_000)}")


def _clone_tensor(
    t: torch.Tensor, memo: dict[tuple[int, int], torch.UntypedStorage]
) -> torch.Tensor:
    """Deep-copy ``t`` preserving size, strides, storage offset and aliasing.

    Tensors sharing a storage get copies sharing one cloned storage, so ops
    such as ``as_strided`` or in-place ops on views behave as on the original.
    """
    if (
        type(t) is not torch.Tensor
        or t.layout != torch.strided
        or t.is_quantized
        or t.is_nested
        or t.device.type == "meta"
    ):
        return t.detach().clone().requires_grad_(t.requires_grad)
    storage = t.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes())
    copied = memo.get(key) if key[0] != 0 else None
    if copied is None:
        copied = storage.clone()
        if key[0] != 0:
            memo[key] = copied
    out = torch.empty((0,), dtype=t.dtype, device=t.device)
    with torch.no_grad():
        out.set_(copied, t.storage_offset(), t.size(), t.stride())
    out.requires_grad_(t.requires_grad)
    if t.is_conj():
        out = out.conj()
    if t.is_neg():
        out = out._neg_view()
    return out


def _clone_tree(value: Any, memo: dict[tuple[int, int], torch.UntypedStorage]) -> Any:
    """Clone every tensor in a nest of lists/tuples/dicts; other leaves are shared."""
    if isinstance(value, torch.Tensor):
        return _clone_tensor(value, memo)
    if isinstance(value, list):
        return [_clone_tree(v, memo) for v in value]
    if type(value) is tuple:  # not namedtuples / torch.Size
        return tuple(_clone_tree(v, memo) for v in value)
    if isinstance(value, dict):
        return {k: _clone_tree(v, memo) for k, v in value.items()}
    return value


def _clone_call_args(sample: SampleInput) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh ``(args, kwargs)`` for ``op(sample.input, *sample.args, **sample.kwargs)``."""
    memo: dict[tuple[int, int], torch.UntypedStorage] = {}
    args = _clone_tree((sample.input, *sample.args), memo)
    kwargs = _clone_tree(dict(sample.kwargs), memo)
    return tuple(args), kwargs


class _Mismatch(AssertionError):
    """Raised by :func:`_compare` with a path-qualified message."""


def _compare(actual: Any, expected: Any, path: str = "out") -> None:
    """Recursively compare ``actual`` with ``expected``; raise :class:`_Mismatch`."""
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
            raise _Mismatch(f"{path}: type {type(actual).__name__} != {type(expected).__name__}")
        a, e = actual.detach(), expected.detach()
        if a.layout == torch.strided and a.is_conj() != e.is_conj():
            a, e = a.resolve_conj(), e.resolve_conj()
        try:
            torch.testing.assert_close(a, e, atol=ATOL, rtol=RTOL, equal_nan=True)
        except AssertionError as exc:
            raise _Mismatch(f"{path}: {' '.join(str(exc).split())}") from None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise _Mismatch(f"{path}: {_short_repr(actual)} != {_short_repr(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _compare(a, e, f"{path}[{i}]")
        return
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping) or set(actual) != set(expected):
            raise _Mismatch(f"{path}: keys differ")
        for k in expected:
            _compare(actual[k], expected[k], f"{path}[{k!r}]")
        return
    if isinstance(expected, (float, complex)) and isinstance(actual, (int, float, complex)):
        if not _close_scalar(complex(actual), complex(expected)):
            raise _Mismatch(f"{path}: {actual!r} != {expected!r}")
        return
    if type(actual) is not type(expected) or actual != expected:
        raise _Mismatch(f"{path}: {_short_repr(actual)} != {_short_repr(expected)}")


def _close_scalar(a: complex, e: complex) -> bool:
    parts = ((a.real, e.real), (a.imag, e.imag))
    for x, y in parts:
        if math.isnan(x) and math.isnan(y):
            continue
        if x == y:
            continue
        if not abs(x - y) <= ATOL + RTOL * abs(y):
            return False
    return True


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _compare_call(
    actual: tuple[Any, tuple[Any, ...], dict[str, Any]],
    expected: tuple[Any, tuple[Any, ...], dict[str, Any]],
) -> None:
    """Compare (output, args after call, kwargs after call) of two runs."""
    _compare(actual[0], expected[0], "out")
    # Inputs are compared too: in-place ops and ``out=``-style mutation.
    _compare(actual[1], expected[1], "input")
    _compare(actual[2], expected[2], "kwargs")


def _call(
    fn: Callable[..., Any], sample: SampleInput
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Call ``fn`` on fresh copies of the sample; return (output, args, kwargs)."""
    args, kwargs = _clone_call_args(sample)
    out = fn(*args, **kwargs)
    return out, args, kwargs


def _dynamo_counters() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    return counters


def _graph_break_summary() -> tuple[int, str]:
    """Graph breaks Dynamo recorded since its counters were cleared, and the first reason."""
    breaks = _dynamo_counters().get("graph_break", {})
    total = int(sum(breaks.values()))
    message = str(next(iter(breaks), ""))
    first = _one_line(message, 120)
    context = next(
        (ln.strip() for ln in message.splitlines() if "debug context:" in ln.lower()), ""
    )
    if context:
        first += " -- " + context.split(":", 1)[1].strip()
    return total, _one_line(first)


def _call_unseeded(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Pass-through stand-in for OpInfo's ``wrapper_set_seed``."""
    return op(*args, **kwargs)


@contextlib.contextmanager
def _without_seed_wrapper() -> Iterator[None]:
    """Temporarily replace ``wrapper_set_seed`` in ``common_methods_invocations``.

    Several OpInfo callables are ``lambda *a, **k: wrapper_set_seed(f, *a, **k)``,
    which re-seeds the RNG inside ``freeze_rng_state()``.  Dynamo cannot trace
    that (RNG state save/restore), so e.g. ``scaled_dot_product_attention``
    would never reach the backend.  The seeding only matters for random ops,
    which are skipped (and the eager-vs-eager check catches any left over), so
    eager and compiled runs both call the op directly instead.  The lambdas look
    the name up in the module globals at call time, so patching it there works.
    """
    if not STRIP_SEED_WRAPPER:
        yield
        return
    import torch.testing._internal.common_methods_invocations as cmi

    original = getattr(cmi, "wrapper_set_seed", None)
    if original is None:
        yield
        return
    setattr(cmi, "wrapper_set_seed", _call_unseeded)  # noqa: B010
    try:
        yield
    finally:
        setattr(cmi, "wrapper_set_seed", original)  # noqa: B010


def _make_op_fn(op: OpInfo) -> Callable[..., Any]:
    def op_fn(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    op_fn.__name__ = "opinfo_" + op.full_name.replace(".", "_")
    return op_fn


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


def run_sample(
    op: OpInfo,
    sample: SampleInput,
    backend: CountingBackend,
    *,
    index: int = 0,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> SampleRecord:
    """Run one sample eagerly and compiled, and classify it.

    Never raises (other than ``KeyboardInterrupt``/``SystemExit``): every
    exception is turned into a record.
    """
    record = SampleRecord(
        op=op.full_name, sample_index=index, status=Status.PASS, reached_backend=False
    )
    try:
        record.sample = _one_line(sample.summary(), 200)
    except Exception:
        record.sample = "<unprintable sample>"
    backend.reset()
    _dynamo_counters().clear()
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), _without_seed_wrapper(), _time_limit(timeout_s):
            warnings.simplefilter("ignore")
            _run_sample_unguarded(op, sample, backend, record)
    except SampleTimeout as exc:
        # Which stage timed out decides the status: before compiling, eager is to blame.
        compiled_stage = record.status is Status.ERROR
        record.status = Status.ERROR if compiled_stage else Status.EAGER_ERROR
        record.reason = _exc_reason(exc) + (" (compiled run)" if compiled_stage else " (eager run)")
    except Exception as exc:  # harness bug; keep going but make it visible
        record.status, record.reason = Status.ERROR, f"harness: {_exc_reason(exc)}"
    record.seconds = round(time.perf_counter() - start, 4)
    record.graphs, record.graph_nodes = backend.graphs, backend.nodes
    record.reached_backend = backend.graphs > 0
    try:
        record.graph_breaks, break_reason = _graph_break_summary()
        if record.graph_breaks and not record.reason:
            record.reason = f"graph break: {break_reason}"
    finally:
        # Drop compiled artifacts (and any half-finished state after a timeout).
        torch._dynamo.reset()
    return record


def _run_sample_unguarded(
    op: OpInfo, sample: SampleInput, backend: CountingBackend, record: SampleRecord
) -> None:
    """Body of :func:`run_sample`; fills in ``record`` (status, reason)."""
    fn = _make_op_fn(op)
    # Eager reference, twice, to detect nondeterminism.
    try:
        expected = _call(fn, sample)
    except Exception as exc:
        record.status, record.reason = Status.EAGER_ERROR, _exc_reason(exc)
        return
    try:
        _compare_call(_call(fn, sample), expected)
    except _Mismatch as exc:
        record.status = Status.NONDETERMINISTIC
        record.reason = _one_line(f"eager runs disagree: {exc}")
        return
    except Exception as exc:
        record.status = Status.NONDETERMINISTIC
        record.reason = _one_line(f"second eager run failed: {_exc_reason(exc)}")
        return

    # Compiled run.  The status is provisionally ERROR so that a timeout from
    # here on is attributed to the compiled run.
    record.status = Status.ERROR
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    try:
        with torch._dynamo.config.patch(suppress_errors=False):
            actual = _call(compiled, sample)
    except Exception as exc:
        record.reason = _exc_reason(exc)
        return
    try:
        _compare_call(actual, expected)
    except _Mismatch as exc:
        record.status, record.reason = Status.MISMATCH, _one_line(str(exc))
        return
    except Exception as exc:  # the comparison itself blew up
        record.status = Status.MISMATCH
        record.reason = _one_line(f"comparison failed: {_exc_reason(exc)}")
        return
    record.status = Status.PASS


def _iter_samples(op: OpInfo, num_samples: int) -> Iterator[tuple[int, SampleInput]]:
    """First ``num_samples`` deterministic samples, with their original indices."""
    sample_filter = RANDOM_SAMPLE_FILTERS.get(op.full_name)
    torch.manual_seed(SEED)
    samples = op.sample_inputs(DEVICE, DTYPE, requires_grad=False)
    kept = 0
    for index, sample in enumerate(samples):
        if kept >= num_samples:
            return
        if sample_filter is not None and sample_filter(sample) is not None:
            continue
        kept += 1
        yield index, sample


def run_op(
    op: OpInfo,
    backend: CountingBackend,
    *,
    num_samples: int = DEFAULT_SAMPLES,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
) -> list[SampleRecord]:
    """Run the first ``num_samples`` samples of ``op``. Never raises.

    Sample generation failures yield a single ``eager-error`` record with
    ``sample_index == -1``; an op without samples yields no records.
    """
    start = time.perf_counter()
    try:
        # Materialize up front: sample generation draws from the (seeded) RNG,
        # which running earlier samples must not perturb.
        with warnings.catch_warnings(), _time_limit(timeout_s):
            warnings.simplefilter("ignore")
            samples = list(_iter_samples(op, num_samples))
    except (Exception, SampleTimeout) as exc:
        return [
            SampleRecord(
                op=op.full_name,
                sample_index=-1,
                status=Status.EAGER_ERROR,
                reached_backend=False,
                reason=_one_line(f"sample_inputs failed: {_exc_reason(exc)}"),
                seconds=round(time.perf_counter() - start, 4),
            )
        ]
    return [
        run_sample(op, sample, backend, index=index, timeout_s=timeout_s)
        for index, sample in samples
    ]


def run_ops(
    ops: Sequence[OpInfo] | None = None,
    *,
    backend: str | CompilerFn | None = None,
    num_samples: int = DEFAULT_SAMPLES,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    progress: Callable[[int, int, OpInfo, list[SampleRecord]], None] | None = None,
) -> list[SampleRecord]:
    """Run the harness over ``ops`` (default: :func:`eligible_ops`).

    ``backend`` is a name for :func:`resolve_backend`, a backend callable, or
    ``None`` for :func:`default_backend_name`.  ``progress`` is called after
    each op with ``(position, total, op, records_of_that_op)``.
    """
    if ops is None:
        ops = eligible_ops()
    if backend is None or isinstance(backend, str):
        backend = resolve_backend(backend or default_backend_name())
    counting = CountingBackend(backend)
    records: list[SampleRecord] = []
    for position, op in enumerate(ops, 1):
        op_records = run_op(op, counting, num_samples=num_samples, timeout_s=timeout_s)
        records.extend(op_records)
        if progress is not None:
            progress(position, len(ops), op, op_records)
    return records


# --------------------------------------------------------------------------- #
# Summaries and CLI
# --------------------------------------------------------------------------- #


def summarize(records: Sequence[SampleRecord]) -> dict[str, Any]:
    """Aggregate counts, failing ops and ops whose samples never reached the backend."""
    counts = {status.value: 0 for status in Status}
    for r in records:
        counts[r.status.value] += 1
    compared = [r for r in records if r.status.compared]
    failing: dict[str, str] = {}
    for r in records:
        if r.status.failed and r.op not in failing:
            failing[r.op] = f"{r.status.value} (sample {r.sample_index}): {r.reason}"
    by_op: dict[str, list[SampleRecord]] = {}
    for r in compared:
        by_op.setdefault(r.op, []).append(r)
    return {
        "samples": len(records),
        "ops": len({r.op for r in records}),
        "counts": counts,
        "reached_backend": sum(r.reached_backend for r in compared),
        "not_reached_backend": sum(not r.reached_backend for r in compared),
        "samples_with_graph_breaks": sum(r.graph_breaks > 0 for r in compared),
        "failing_ops": failing,
        "ops_never_reaching_backend": sorted(
            op for op, rs in by_op.items() if not any(r.reached_backend for r in rs)
        ),
        "ops_without_compared_samples": sorted({r.op for r in records} - set(by_op)),
    }


def _format_summary(summary: dict[str, Any], backend: str, seconds: float) -> str:
    c = summary["counts"]
    lines = [
        f"backend={backend}  ops={summary['ops']}  samples={summary['samples']}  "
        f"time={seconds:.1f}s",
        f"  pass={c['pass']}  mismatch={c['mismatch']}  error={c['error']}  "
        f"(skipped: eager-error={c['eager-error']}  nondeterministic={c['nondeterministic']})",
        f"  compared samples reaching the backend: {summary['reached_backend']}, "
        f"not reaching it (ran eagerly under Dynamo): {summary['not_reached_backend']}, "
        f"with graph breaks: {summary['samples_with_graph_breaks']}",
    ]
    never = summary["ops_never_reaching_backend"]
    if never:
        lines.append(f"  ops whose compared samples never reached the backend ({len(never)}):")
        lines.append("    " + ", ".join(never))
    failing = summary["failing_ops"]
    lines.append(f"failing ops ({len(failing)}):")
    lines.extend(f"  {op}: {reason}" for op, reason in failing.items())
    return "\n".join(lines)


def _print_progress(position: int, total: int, op: OpInfo, records: list[SampleRecord]) -> None:
    marks = {
        Status.PASS: ".",
        Status.MISMATCH: "M",
        Status.ERROR: "E",
        Status.EAGER_ERROR: "s",
        Status.NONDETERMINISTIC: "n",
    }
    status = "".join(
        marks[r.status]
        if r.reached_backend or not r.status.compared
        else marks[r.status].lower() + "~"
        for r in records
    )
    seconds = sum(r.seconds for r in records)
    print(
        f"[{position}/{total}] {op.full_name}: {status or '-'} ({seconds:.1f}s)",
        file=sys.stderr,
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 1 when any sample fails, else 0."""
    parser = argparse.ArgumentParser(
        description="Compare torch.compile against eager over PyTorch's OpInfo database.",
        epilog="Progress marks: . pass, M mismatch, E error, s eager-error, n nondeterministic; "
        "'~' marks a compared sample that never reached the backend.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--ops", help="comma-separated OpInfo names (full 'name.variant' or base name)"
    )
    which.add_argument("--all", action="store_true", help="all eligible OpInfos")
    which.add_argument("--list-skipped", action="store_true", help="print the skip list and exit")
    parser.add_argument(
        "--samples", type=int, default=DEFAULT_SAMPLES, help="samples per op (default %(default)s)"
    )
    parser.add_argument(
        "--backend",
        default=default_backend_name(),
        help=f"backend name or module:attr (default: ${BACKEND_ENV_VAR} or %(default)r)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="per-sample time limit in seconds (0: none)",
    )
    parser.add_argument("--json", metavar="FILE", help="write records and summary as JSON")
    args = parser.parse_args(argv)

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    logging.getLogger("torch._inductor").setLevel(logging.ERROR)

    if args.list_skipped:
        for op in load_op_db():
            reason = skip_reason(op)
            if reason is not None:
                print(f"{op.full_name}: {reason}")
        return 0

    if args.all:
        ops = eligible_ops()
    else:
        requested = find_ops(
            [n.strip() for n in args.ops.split(",") if n.strip()], include_skipped=True
        )
        ops = []
        for op in requested:
            reason = skip_reason(op)
            if reason is None:
                ops.append(op)
            else:
                print(f"skipping {op.full_name}: {reason}", file=sys.stderr)
    backend = resolve_backend(args.backend)
    print(
        f"running {len(ops)} ops x {args.samples} samples on backend {args.backend!r}",
        file=sys.stderr,
    )
    start = time.perf_counter()
    records = run_ops(
        ops,
        backend=backend,
        num_samples=args.samples,
        timeout_s=args.timeout or None,
        progress=_print_progress,
    )
    seconds = time.perf_counter() - start
    summary = summarize(records)
    if args.json:
        payload = {
            "backend": args.backend,
            "torch_version": torch.__version__,
            "samples_per_op": args.samples,
            "seconds": round(seconds, 2),
            "summary": summary,
            "records": [r.to_json() for r in records],
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    print(_format_summary(summary, args.backend, seconds))
    return 1 if any(r.status.failed for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
