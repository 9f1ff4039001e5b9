"""Differential OpInfo harness: compiled (``torch.compile``) results versus eager.

This module drives PyTorch's OpInfo database
(``torch.testing._internal.common_methods_invocations.op_db``) through a
``torch.compile`` backend and compares every result against plain eager
execution.  It is shared by ``tests/test_opinfo.py`` (pytest) and usable as a
command-line tool::

    python tests/opinfo_harness.py --all --backend aot_eager --json report.json
    python tests/opinfo_harness.py --ops add,sum,nn.functional.relu --samples 4
    python tests/opinfo_harness.py --mode grad --all --json grad.json

``--mode`` picks what is compared (``coil.sdk.testing.opinfo_modes``): ``forward`` (the
default: the op on the sample), ``grad`` (outputs and the gradients of a random projection of
them, the backward compiled as in training), ``grad-joint`` (the same with ``autograd.grad``
traced into one graph), ``autocast`` (the sample under ``torch.autocast(bfloat16)``, output
dtypes must match) and ``layout`` (the sample again with transposed, stepped/offset and
channels-last tensors).

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
Dynamo cannot trace, is bypassed for both runs (see
``coil.sdk.testing.opinfo_db.without_seed_wrapper``).

The machinery (skip lists, sample copies, comparison, the per-sample runner) lives in
``coil.sdk.testing`` (``opinfo_db``, ``compare``, ``opinfo``), shared with the conformance
kit's device-parametrized opinfo tier; this module re-exports it and adds the backend lookup,
``run_ops`` and the command line.

The backend is chosen by name.  The default is :data:`DEFAULT_BACKEND_NAME`
(``"coil"``), overridable with the ``COIL_OPINFO_BACKEND`` environment variable
or ``--backend``; any Dynamo-registered backend name (e.g. ``aot_eager``) or a
``module:attribute`` path to a backend callable is accepted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch._dynamo

from coil.sdk.testing.compare import ATOL, RTOL
from coil.sdk.testing.opinfo import (DEFAULT_SAMPLES, DEFAULT_TIMEOUT_S, CountingBackend, SampleRecord,
                                     SampleTimeout, Status, run_op, run_sample, summarize)
from coil.sdk.testing.opinfo_db import (DEVICE, DTYPE, RANDOM_SAMPLE_FILTERS, SEED, SKIPPED_OPS,
                                        STRIP_SEED_WRAPPER, eligible_ops, find_ops, load_op_db,
                                        skip_reason)
from coil.sdk.testing.opinfo_modes import Mode, mode_skip_reason

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

__all__ = [
    "ATOL",
    "CI_OPS",
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
    "Mode",
    "assert_op_matches_eager",
    "main",
    "mode_ops",
    "quiet_trace_log",
    "resolve_backend",
    "run_op",
    "run_ops",
    "run_sample",
    "skip_reason",
    "summarize",
]
# Also importable from here, as before the move: DEVICE, DTYPE, SEED, STRIP_SEED_WRAPPER,
# RANDOM_SAMPLE_FILTERS, SampleTimeout.
_REEXPORTED = (DEVICE, DTYPE, SEED, STRIP_SEED_WRAPPER, RANDOM_SAMPLE_FILTERS, SampleTimeout)

#: The backend under test.  Change this one line (or set COIL_OPINFO_BACKEND).
DEFAULT_BACKEND_NAME = "coil"
#: Environment variable that overrides :data:`DEFAULT_BACKEND_NAME`.
BACKEND_ENV_VAR = "COIL_OPINFO_BACKEND"


#: Fixed, representative CI sample (OpInfo full names), shared by the CI tests of every mode
#: (``tests/test_opinfo*.py``).  Every op here has at least one sample that Dynamo hands to
#: the backend (checked by the tests), so none of these can pass vacuously by running eagerly.
CI_OPS: tuple[str, ...] = (
    # pointwise unary
    "abs",
    "exp",
    "tanh",
    "sigmoid",
    "rsqrt",
    # pointwise binary
    "add",
    "mul",
    "div.no_rounding_mode",
    "pow",
    # comparisons / selection
    "eq",
    "lt",
    "where",
    "masked_fill",
    "clamp",
    # reductions
    "sum",
    "mean",
    "amax",
    "argmax",
    "var",
    "std",
    "prod",
    "any",
    "all",
    "logsumexp",
    "max.reduction_with_dim",
    # normalizations over a dim
    "softmax",
    "log_softmax",
    # views and reshapes
    "view",
    "reshape",
    "permute",
    "transpose",
    "expand",
    "squeeze",
    "unsqueeze",
    "__getitem__",  # basic and advanced slicing
    "narrow",
    "select",
    # concatenation
    "cat",
    "stack",
    # indexing / scatter-gather
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "index_put",
    "index_add",
    "nn.functional.embedding",
    # scans
    "cumsum",
    "cumprod",
    "linalg.vander",  # a scan of one row (its store broadcast to the block: an interpreter error once)
    # in-place mutation of an input
    "zero_",
    # nn.functional
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.layer_norm",
    "nn.functional.linear",
    "nn.functional.conv2d",
    "nn.functional.cross_entropy",
    "nn.functional.scaled_dot_product_attention",
    # matrix multiplication
    "matmul",
    "mm",
    "addmm",
    "bmm",
    # casts
    "to",
    # factories
    "full",
    "arange",
    "zeros_like",
)


def default_backend_name() -> str:
    """Return the backend name: ``$COIL_OPINFO_BACKEND`` or :data:`DEFAULT_BACKEND_NAME`."""
    return os.environ.get(BACKEND_ENV_VAR) or DEFAULT_BACKEND_NAME


#: Settings the pytest files (``tests/test_opinfo*.py``) read from the environment.
FULL: bool = os.environ.get("COIL_OPINFO_FULL", "") == "1"
TIMEOUT_S: float | None = float(os.environ.get("COIL_OPINFO_TIMEOUT") or DEFAULT_TIMEOUT_S) or None


def env_samples(default: int) -> int:
    """Samples per op: ``$COIL_OPINFO_SAMPLES``, else ``default``."""
    return int(os.environ.get("COIL_OPINFO_SAMPLES") or default)


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


def mode_ops(mode: Mode | str = Mode.FORWARD) -> list[OpInfo]:
    """Every eligible OpInfo that ``mode`` applies to (``grad``: those with a float32
    backward on the CPU)."""
    return [op for op in eligible_ops() if mode_skip_reason(Mode(mode), op) is None]


def run_ops(
    ops: Sequence[OpInfo] | None = None,
    *,
    backend: str | CompilerFn | None = None,
    num_samples: int = DEFAULT_SAMPLES,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    progress: Callable[[int, int, OpInfo, list[SampleRecord]], None] | None = None,
    mode: Mode | str = Mode.FORWARD,
) -> list[SampleRecord]:
    """Run the harness over ``ops`` (default: :func:`mode_ops`) in ``mode``.

    ``backend`` is a name for :func:`resolve_backend`, a backend callable, or
    ``None`` for :func:`default_backend_name`.  ``progress`` is called after
    each op with ``(position, total, op, records_of_that_op)``.
    """
    if ops is None:
        ops = mode_ops(mode)
    if backend is None or isinstance(backend, str):
        backend = resolve_backend(backend or default_backend_name())
    counting = CountingBackend(backend)
    records: list[SampleRecord] = []
    for position, op in enumerate(ops, 1):
        op_records = run_op(op, counting, num_samples=num_samples, timeout_s=timeout_s, mode=mode)
        records.extend(op_records)
        if progress is not None:
            progress(position, len(ops), op, op_records)
    return records


@contextlib.contextmanager
def quiet_trace_log() -> Iterator[None]:
    """Keep torch's structured-trace records out of pytest failure reports.

    pytest attaches its capture handlers even to the non-propagating ``torch.__trace``
    logger, which then fills every failure report with dozens of empty DEBUG lines.  Left
    alone when ``TORCH_TRACE`` is set (tlparse).
    """
    logger = logging.getLogger("torch.__trace")
    saved = logger.disabled
    if not os.environ.get("TORCH_TRACE"):
        logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = saved


def assert_op_matches_eager(
    op_name: str,
    backend: CountingBackend,
    *,
    mode: Mode | str = Mode.FORWARD,
    num_samples: int = DEFAULT_SAMPLES,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    require_reached: bool = True,
) -> list[SampleRecord]:
    """The pytest check of one op in one mode: fail on any mismatch or error, skip when no
    case could be compared, and (``require_reached``) fail when no compared case reached the
    backend: a CI op list must only hold ops that compile. ``op_name`` must be the full name
    of an eligible OpInfo that ``mode`` applies to."""
    import pytest

    mode = Mode(mode)
    ops = [op for op in find_ops([op_name]) if op.full_name == op_name]
    assert len(ops) == 1, f"{op_name!r} is not the full name of an eligible OpInfo"
    reason = mode_skip_reason(mode, ops[0])
    assert reason is None, f"{op_name!r} is not run in mode {mode.value}: {reason}"
    records = run_op(ops[0], backend, num_samples=num_samples, timeout_s=timeout_s, mode=mode)
    failures = [r for r in records if r.status.failed]
    if failures:
        lines = [f"mode {mode.value}: torch.compile disagrees with eager:"]
        for r in failures:
            where = f"sample {r.sample_index}" + (f" ({r.variant})" if r.variant else "")
            lines.append(f"  {where}: {r.status.value}: {r.reason}")
            lines.append(f"    {r.sample}")
        pytest.fail("\n".join(lines), pytrace=False)
    compared = [r for r in records if r.status.compared]
    if not compared:
        reasons = "; ".join(f"{r.status.value}: {r.reason}" for r in records) or "no samples"
        pytest.skip(f"no case could be compared ({reasons})")
    if require_reached and not any(r.reached_backend for r in compared):
        pytest.fail(
            f"{op_name}: no {mode.value} case reached the backend (Dynamo ran it eagerly: "
            f"{compared[0].reason}); the CI op list must only hold ops that compile",
            pytrace=False,
        )
    return records


# --------------------------------------------------------------------------- #
# Summaries and CLI
# --------------------------------------------------------------------------- #


def _format_summary(summary: dict[str, Any], backend: str, seconds: float, mode: str) -> str:
    c = summary["counts"]
    lines = [
        f"mode={mode}  backend={backend}  ops={summary['ops']}  cases={summary['samples']}  "
        f"time={seconds:.1f}s",
        f"  pass={c['pass']}  mismatch={c['mismatch']}  error={c['error']}  "
        f"(skipped: eager-error={c['eager-error']}  nondeterministic={c['nondeterministic']})",
        f"  compared samples reaching the backend: {summary['reached_backend']}, "
        f"not reaching it (ran eagerly under Dynamo): {summary['not_reached_backend']}, "
        f"with graph breaks: {summary['samples_with_graph_breaks']}; "
        f"ops with a compared case reaching the backend: {summary['ops_reached']}",
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


ProgressFn = Callable[[int, int, "OpInfo", list[SampleRecord]], None]


def _jsonl_progress(path: str, then: ProgressFn) -> ProgressFn:
    """A progress callback appending each op's records to ``path`` (one JSON object a line)."""
    def progress(position: int, total: int, op: OpInfo, records: list[SampleRecord]) -> None:
        with open(path, "a") as f:
            for r in records:
                f.write(json.dumps(r.to_json()) + "\n")
        then(position, total, op, records)

    return progress


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
    which.add_argument(
        "--list-skipped", action="store_true", help="print the skip list (of --mode) and exit"
    )
    parser.add_argument(
        "--samples", type=int, default=DEFAULT_SAMPLES, help="samples per op (default %(default)s)"
    )
    parser.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.FORWARD.value,
        help="what to compare (default %(default)s): the op, its gradients, the op under "
        "bfloat16 autocast, or the op on re-strided inputs",
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
    parser.add_argument(
        "--jsonl",
        metavar="FILE",
        help="append each op's records to FILE as JSON lines while the run goes on "
        "(a long sweep can be read, or resumed by hand, before it ends)",
    )
    args = parser.parse_args(argv)

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    logging.getLogger("torch._inductor").setLevel(logging.ERROR)

    if args.list_skipped:
        for op in load_op_db():
            reason = skip_reason(op) or mode_skip_reason(Mode(args.mode), op)
            if reason is not None:
                print(f"{op.full_name}: {reason}")
        return 0

    mode = Mode(args.mode)
    if args.all:
        ops = mode_ops(mode)
    else:
        requested = find_ops(
            [n.strip() for n in args.ops.split(",") if n.strip()], include_skipped=True
        )
        ops = []
        for op in requested:
            reason = skip_reason(op) or mode_skip_reason(mode, op)
            if reason is None:
                ops.append(op)
            else:
                print(f"skipping {op.full_name}: {reason}", file=sys.stderr)
    backend = resolve_backend(args.backend)
    print(
        f"running {len(ops)} ops x {args.samples} samples in mode {mode.value} "
        f"on backend {args.backend!r}",
        file=sys.stderr,
    )
    progress = _print_progress
    if args.jsonl:
        progress = _jsonl_progress(args.jsonl, progress)
    start = time.perf_counter()
    records = run_ops(
        ops,
        backend=backend,
        num_samples=args.samples,
        timeout_s=args.timeout or None,
        progress=progress,
        mode=mode,
    )
    seconds = time.perf_counter() - start
    summary = summarize(records)
    if args.json:
        payload = {
            "backend": args.backend,
            "mode": mode.value,
            "torch_version": torch.__version__,
            "samples_per_op": args.samples,
            "seconds": round(seconds, 2),
            "summary": summary,
            "records": [r.to_json() for r in records],
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    print(_format_summary(summary, args.backend, seconds, mode.value))
    return 1 if any(r.status.failed for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
