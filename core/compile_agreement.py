"""Ranks agree on each compile, so one rank's failed compile fails every rank.

Under ``torch.distributed`` every rank compiles the same graphs. When Coil raises on one
rank, the others have compiled, run on and sit in the next collective, waiting for a rank
that will never join it: with gloo until that process exits (then a "connection closed"
error that names no cause), with NCCL until the process group's timeout (30 minutes by
default), and forever when the failing rank catches the error and waits elsewhere.

So, with the ``compile_agreement`` knob on (the default) and a default process group of more
than one rank, each compile of a Dynamo graph (tracing and the forward or inference graph)
and each lazily compiled backward graph is announced in the process group's store under a
key that names the graph (a digest of its code and its inputs' sizes, strides and dtypes,
and how many times this process compiled that graph before). A rank that fails records why
and raises its own error; a rank that succeeds waits, after its compile, until every rank
that started the same compile has finished it, and raises :class:`DistributedCompileError`
naming the failed rank and its error if one did. Three counters per compile (started,
finished, a failure's text), so the store sees the same few keys however many ranks there
are.

A rank that has not started the same compile within ``GRACE_SECONDS`` of this one finishing
is taken to run a different program (pipeline stages compile different graphs; a rank may
recompile for a shape only it sees): this rank stops waiting for it, logs it at debug level,
and from then on waits only for ranks that have already started a compile it finishes."""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Sequence, TypeVar

import torch

from .errors import DistributedCompileError

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds a rank that finished a compile waits for the others to start the same one.
GRACE_SECONDS = 5.0
#: Longest pause between two looks at the store while waiting.
POLL_SECONDS = 0.05
#: Characters of a failure's text kept in the store.
MAX_REASON = 4000


_local = threading.local()
_seen: Counter[str] = Counter()
#: Set once some rank did not start a compile this process finished within the grace time.
_asymmetric = False


def _group() -> tuple[Any, int, int] | None:
    """(store, rank, world size) of the default process group, or None outside one."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world < 2 or dist.get_backend() == "fake":  # one process tracing for many: nobody to agree with
        return None
    return dist.distributed_c10d._get_default_store(), dist.get_rank(), world


def graph_digest(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """A name for a graph that every rank computes alike: its code and its inputs' metadata."""
    h = hashlib.sha256(gm.code.encode())
    for t in example_inputs:
        if isinstance(t, torch.Tensor):
            h.update(f"{tuple(t.shape)}{t.stride()}{t.dtype}".encode())
        else:
            h.update(type(t).__name__.encode())
    return h.hexdigest()[:24]


def _is_control_flow(exc: BaseException) -> bool:
    """Dynamo's own signals (restart the analysis, skip the frame): no failure."""
    exc_mod = torch._dynamo.exc
    return isinstance(exc, (exc_mod.RestartAnalysis, exc_mod.SkipFrame))


def guarded(what: str, digest: Callable[[], str], enabled: bool, compile: Callable[[], T]) -> T:
    """``compile()`` under the agreement (see the module's docstring) when ``enabled`` and
    inside a process group of more than one rank; ``what`` names the graph in errors
    ("a Dynamo graph"). Nested calls (a forward compiled while its Dynamo graph is) agree
    once, at the outermost."""
    group = _group() if enabled and not getattr(_local, "inside", False) else None
    if group is None:
        return compile()
    store, rank, world = group
    name = digest()
    _seen[name] += 1
    key = f"coil/compile/{name}/{_seen[name]}"
    try:
        store.add(f"{key}/started", 1)
    except Exception as exc:  # noqa: BLE001 - a store without counters: compile on alone
        log.debug("coil: no compile agreement (%s: %s)", type(exc).__name__, exc)
        return compile()
    _local.inside = True
    try:
        result = compile()
    except BaseException as exc:
        if not _is_control_flow(exc):
            store.set(f"{key}/failed", f"{rank}\n{type(exc).__name__}: {exc}"[:MAX_REASON])
        store.add(f"{key}/finished", 1)
        raise
    finally:
        _local.inside = False
    store.add(f"{key}/finished", 1)
    _wait_for_peers(store, key, rank, world, what)
    return result


def _wait_for_peers(store: Any, key: str, rank: int, world: int, what: str) -> None:
    """Return once every rank that started compile ``key`` finished it; raise
    :class:`DistributedCompileError` if one of them failed."""
    global _asymmetric
    import torch.distributed as dist
    t0 = time.monotonic()
    limit = dist.constants.default_pg_timeout.total_seconds()
    pause = 0.001
    while True:
        started = store.add(f"{key}/started", 0)
        finished = store.add(f"{key}/finished", 0)
        # after the counters: a rank records its failure before it counts itself finished
        if store.check([f"{key}/failed"]):
            failed, reason = store.get(f"{key}/failed").decode(errors="replace").split("\n", 1)
            raise DistributedCompileError(int(failed), rank, what, reason)
        waited = time.monotonic() - t0
        if finished >= started and (started >= world or _asymmetric or waited > GRACE_SECONDS):
            if started < world:
                _asymmetric = True
                log.debug("coil: %d of %d ranks compiled %s (%s); not waiting for the others",
                          started, world, what, key)
            return
        if waited > limit:
            log.warning("coil: gave up waiting %.0f s for other ranks to compile %s", waited, what)
            return
        time.sleep(pause)
        pause = min(pause * 2, POLL_SECONDS)


__all__ = ["DistributedCompileError", "guarded", "graph_digest", "GRACE_SECONDS"]
