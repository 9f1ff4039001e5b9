"""Running OpInfo samples through ``torch.compile`` on a device and classifying each against
eager on the CPU (pass, mismatch, error; eager-error and nondeterministic are skips). Shared by
the conformance kit's opinfo tier and ``tests/opinfo_harness.py`` (its CLI and CI tests).

Each sample becomes one or more :class:`~.opinfo_case.Case` s, depending on the mode
(:class:`~.opinfo_modes.Mode`: forward, grad, grad-joint, autocast, layout). For every case:
eager runs twice on CPU copies (they must agree), then Dynamo is reset,
``torch.compile(fn, backend=CountingBackend(real), dynamic=False)`` runs on a copy moved to the
device (strides, offsets and aliasing kept), and its outputs *and* the post-call inputs are
copied back and compared (so in-place ops are checked). The counting backend records whether a
graph reached the backend at all: Dynamo may run a sample eagerly."""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from .compare import DtypeMismatch, Mismatch, clone_call_args, compare_call, compare_with_reference, exc_reason, one_line
from .opinfo_db import without_seed_wrapper
from .opinfo_case import FP64_MULTIPLIER, Case, CaseFactory, SkipSample
from .opinfo_modes import Mode, mode_skip_reason, op_fn, select_cases

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput

#: Samples taken per OpInfo (after dropping random samples).
DEFAULT_SAMPLES = 2
#: Wall-clock guard for one sample (eager runs + compile + compiled run).
DEFAULT_TIMEOUT_S = 60.0

#: The opinfo tier's default ops (``--coil-opinfo-ops=all`` takes every eligible OpInfo):
#: one or two per family Coil lowers, each known to reach the backend.
DEFAULT_OPS: tuple[str, ...] = (
    "abs", "exp", "tanh", "sigmoid", "rsqrt", "add", "mul", "div.no_rounding_mode", "pow",
    "eq", "where", "masked_fill", "clamp", "sum", "mean", "amax", "argmax", "var", "prod",
    "any", "logsumexp", "softmax", "log_softmax", "view", "permute", "expand", "__getitem__",
    "narrow", "cat", "stack", "index_select", "gather", "scatter_add", "index_put",
    "nn.functional.embedding", "cumsum", "zero_", "nn.functional.relu", "nn.functional.gelu",
    "nn.functional.layer_norm", "nn.functional.cross_entropy", "to", "full", "arange",
)

CompilerFn = Callable[..., Callable[..., Any]]


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
    variant: str = ""  #: Which case of the sample, in modes with several (layout).

    def to_json(self) -> dict[str, Any]:
        """JSON-serializable dict."""
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data


class SampleTimeout(BaseException):
    """Raised by the alarm handler when a sample exceeds its time budget.

    Derives from ``BaseException`` so that ``except Exception`` blocks inside
    Dynamo/the backend do not swallow or re-wrap it.
    """


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`SampleTimeout` after ``seconds`` (main thread, POSIX only).

    Uses ``SIGALRM``, so it cannot interrupt a long-running C++ kernel until it
    returns to Python.  An outer ``ITIMER_REAL`` timer (e.g. pytest-timeout's
    signal method) is re-armed afterwards with its remaining time.
    """
    if (seconds is None or seconds <= 0 or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()):
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


def _call(fn: Callable[..., Any], case: Case, device: torch.device | None = None
          ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Call ``fn`` on fresh copies of the case's sample (on ``device``) inside its context;
    return (output, args, kwargs)."""
    args, kwargs = clone_call_args(case.sample, device)
    with case.context(device):
        if device is None:
            return fn(*args, **kwargs), args, kwargs
        # Factories and ``to`` name the CPU: ask for the device instead. The returned args
        # keep the CPU names (and the same tensors), so they compare equal to eager's.
        out = fn(*_retarget(args, device), **_retarget(kwargs, device))
    return out, args, kwargs


def _retarget(value: Any, device: torch.device) -> Any:
    """``value`` with every CPU device (``"cpu"``, ``torch.device("cpu")``) replaced by
    ``device``; tensors are passed through as they are."""
    if isinstance(value, torch.device) and value.type == "cpu" or (isinstance(value, str) and value == "cpu"):
        return device
    if isinstance(value, list):
        return [_retarget(v, device) for v in value]
    if type(value) is tuple:
        return tuple(_retarget(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _retarget(v, device) for k, v in value.items()}
    return value


def _graph_break_summary(expected: Sequence[str] = ()) -> tuple[int, str]:
    """Graph breaks Dynamo recorded since its counters were cleared, and the first reason;
    breaks whose message holds one of the ``expected`` substrings are not counted."""
    from torch._dynamo.utils import counters  # torch._dynamo (seconds) only when a sample runs

    breaks = {message: count for message, count in counters.get("graph_break", {}).items()
              if not any(text in str(message) for text in expected)}
    total = int(sum(breaks.values()))
    message = str(next(iter(breaks), ""))
    first = one_line(message, 120)
    context = next((ln.strip() for ln in message.splitlines() if "debug context:" in ln.lower()), "")
    if context:
        first += " -- " + context.split(":", 1)[1].strip()
    return total, one_line(first)


def run_sample(op: OpInfo, sample: SampleInput, backend: CountingBackend, *, index: int = 0,
               timeout_s: float | None = DEFAULT_TIMEOUT_S, device: str | None = None) -> SampleRecord:
    """Run one sample eagerly (CPU) and compiled (on ``device``, default the CPU), as it is
    (the forward mode), and classify it. Never raises (other than ``KeyboardInterrupt``/
    ``SystemExit``)."""
    fn = op_fn(op)
    return run_case(op, lambda: Case(fn, sample), backend, index=index, summary=_summary(sample),
                    timeout_s=timeout_s, device=device)


def _summary(sample: SampleInput) -> str:
    try:
        return one_line(sample.summary(), 200)
    except Exception:
        return "<unprintable sample>"


def run_case(op: OpInfo, factory: CaseFactory, backend: CountingBackend, *, index: int = 0,
             variant: str = "", summary: str = "", timeout_s: float | None = DEFAULT_TIMEOUT_S,
             device: str | None = None) -> SampleRecord:
    """Build the case (``factory``), run it eagerly (CPU) and compiled (on ``device``, default
    the CPU), and classify it. Never raises (other than ``KeyboardInterrupt``/``SystemExit``)."""
    from torch._dynamo.utils import counters  # torch._dynamo (seconds) only when a sample runs

    record = SampleRecord(op=op.full_name, sample_index=index, status=Status.PASS,
                          reached_backend=False, sample=summary, variant=variant)
    backend.reset()
    counters.clear()
    start = time.perf_counter()
    expected_breaks: tuple[str, ...] = ()
    try:
        with warnings.catch_warnings(), without_seed_wrapper(), time_limit(timeout_s):
            warnings.simplefilter("ignore")
            case = _build_case(factory, record)
            if case is not None:
                expected_breaks = case.expected_breaks
                _run_case_unguarded(case, backend, record, torch.device(device) if device else None)
    except SampleTimeout as exc:
        # Which stage timed out decides the status: before compiling, eager is to blame.
        compiled_stage = record.status is Status.ERROR
        record.status = Status.ERROR if compiled_stage else Status.EAGER_ERROR
        record.reason = exc_reason(exc) + (" (compiled run)" if compiled_stage else " (eager run)")
    except Exception as exc:  # harness bug; keep going but make it visible
        record.status, record.reason = Status.ERROR, f"harness: {exc_reason(exc)}"
    record.seconds = round(time.perf_counter() - start, 4)
    record.graphs, record.graph_nodes = backend.graphs, backend.nodes
    record.reached_backend = backend.graphs > 0
    try:
        record.graph_breaks, break_reason = _graph_break_summary(expected_breaks)
        if record.graph_breaks and not record.reason:
            record.reason = f"graph break: {break_reason}"
    finally:
        # Drop compiled artifacts (and any half-finished state after a timeout).
        torch._dynamo.reset()
    return record


def _build_case(factory: CaseFactory, record: SampleRecord) -> Case | None:
    """The case, or None with ``record`` marked ``eager-error`` (the mode has nothing to
    compare for this sample, or building it ran eager and that raised)."""
    try:
        return factory()
    except SkipSample as exc:
        record.status, record.reason = Status.EAGER_ERROR, f"nothing to compare: {exc}"
    except Exception as exc:
        record.status, record.reason = Status.EAGER_ERROR, exc_reason(exc)
    return None


def _run_case_unguarded(case: Case, backend: CountingBackend, record: SampleRecord,
                        device: torch.device | None) -> None:
    """Body of :func:`run_case`; fills in ``record`` (status, reason)."""
    # Eager reference on the CPU, twice, to detect nondeterminism.
    try:
        expected = _call(case.fn, case)
    except Exception as exc:
        record.status, record.reason = Status.EAGER_ERROR, exc_reason(exc)
        return
    try:
        compare_call(_call(case.fn, case), expected, tol=case.tolerance)
    except Mismatch as exc:
        record.status, record.reason = Status.NONDETERMINISTIC, one_line(f"eager runs disagree: {exc}")
        return
    except Exception as exc:
        record.status = Status.NONDETERMINISTIC
        record.reason = one_line(f"second eager run failed: {exc_reason(exc)}")
        return
    # Compiled run: provisionally ERROR so that a timeout from here on is blamed on it.
    record.status = Status.ERROR
    torch._dynamo.reset()
    compiled = torch.compile(case.fn, backend=backend, dynamic=False)
    try:
        with torch._dynamo.config.patch(suppress_errors=False, **case.dynamo_config):
            actual = _call(compiled, case, device)
    except Exception as exc:
        record.reason = exc_reason(exc)
        return
    try:
        record.reason = _compare(case, actual, expected, device.type if device is not None else None)
    except Mismatch as exc:
        record.status, record.reason = Status.MISMATCH, one_line(str(exc))
        return
    except Exception as exc:  # the comparison itself blew up
        record.status, record.reason = Status.MISMATCH, one_line(f"comparison failed: {exc_reason(exc)}")
        return
    record.status = Status.PASS


def _compare(case: Case, actual: tuple[Any, ...], expected: tuple[Any, ...], device: str | None) -> str:
    """:func:`compare_call` with the case's tolerance; outputs beyond it get a second chance
    against the case's float64 reference, when it has one (low-precision modes). Returns ""
    or, for a pass the reference granted, the mismatch it excused (kept as the reason)."""
    try:
        compare_call(actual, expected, device, case.tolerance)
        return ""
    except Mismatch as first:
        if case.fp64_reference is None or isinstance(first, DtypeMismatch):
            raise
        try:
            reference = case.fp64_reference()
        except Exception:
            raise first from None
        compare_with_reference(actual[0], expected[0], reference, "out", case.tolerance,
                               multiplier=FP64_MULTIPLIER)
        # Outputs are within eager's own distance from float64; inputs must still match.
        compare_call((None, *actual[1:]), (None, *expected[1:]), device, case.tolerance)
        return one_line(f"passed against the float64 reference; beyond tolerance: {first}")


def run_op(op: OpInfo, backend: CountingBackend, *, num_samples: int = DEFAULT_SAMPLES,
           timeout_s: float | None = DEFAULT_TIMEOUT_S, device: str | None = None,
           mode: Mode | str = Mode.FORWARD) -> list[SampleRecord]:
    """Run the first ``num_samples`` samples of ``op`` (compiled on ``device``) in ``mode``.
    Never raises.

    Sample generation failures yield a single ``eager-error`` record with
    ``sample_index == -1``; an op without samples, or one ``mode`` does not apply to
    (:func:`~.opinfo_modes.mode_skip_reason`), yields no records.
    """
    mode = Mode(mode)
    if mode_skip_reason(mode, op) is not None:
        return []
    start = time.perf_counter()
    try:
        # Materialize up front: sample generation draws from the (seeded) RNG,
        # which running earlier samples must not perturb.
        with warnings.catch_warnings(), time_limit(timeout_s):
            warnings.simplefilter("ignore")
            cases = select_cases(mode, op, num_samples)
    except (Exception, SampleTimeout) as exc:
        return [SampleRecord(op=op.full_name, sample_index=-1, status=Status.EAGER_ERROR,
                             reached_backend=False,
                             reason=one_line(f"sample_inputs failed: {exc_reason(exc)}"),
                             seconds=round(time.perf_counter() - start, 4))]
    return [run_case(op, factory, backend, index=index, variant=variant, summary=_summary(sample),
                     timeout_s=timeout_s, device=device)
            for index, sample, factories in cases for variant, factory in factories]


def summarize(records: Sequence[SampleRecord]) -> dict[str, Any]:
    """Aggregate counts, failing ops and ops whose samples never reached the backend."""
    counts = {status.value: 0 for status in Status}
    for r in records:
        counts[r.status.value] += 1
    compared = [r for r in records if r.status.compared]
    failing: dict[str, str] = {}
    for r in records:
        if r.status.failed and r.op not in failing:
            where = f"sample {r.sample_index}" + (f", {r.variant}" if r.variant else "")
            failing[r.op] = f"{r.status.value} ({where}): {r.reason}"
    by_op: dict[str, list[SampleRecord]] = {}
    for r in compared:
        by_op.setdefault(r.op, []).append(r)
    return {
        "samples": len(records),
        "ops": len({r.op for r in records}),
        "counts": counts,
        "reached_backend": sum(r.reached_backend for r in compared),
        "ops_reached": sum(any(r.reached_backend for r in rs) for rs in by_op.values()),
        "not_reached_backend": sum(not r.reached_backend for r in compared),
        "samples_with_graph_breaks": sum(r.graph_breaks > 0 for r in compared),
        "failing_ops": failing,
        "ops_never_reaching_backend": sorted(
            op for op, rs in by_op.items() if not any(r.reached_backend for r in rs)
        ),
        "ops_without_compared_samples": sorted({r.op for r in records} - set(by_op)),
    }
