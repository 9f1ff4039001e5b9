"""Building kernels in parallel, in worker processes.

``triton.compile`` holds the GIL for most of its work, so threads do not overlap it. Worker
processes do: each builds one (kernel, configuration) into Triton's on-disk cache, and the
parent's own ``triton.compile`` of the same kernel is then a cache hit. Workers are separate
interpreters (``python -m coil_cuda_triton.compile_worker``, reading jobs as JSON lines):
never forked, since the parent holds a CUDA context, and not ``multiprocessing`` spawns,
which would re-run the user's main script. They start in the background on the first
compile. ``COIL_TRITON_COMPILE_WORKERS=0`` turns them off.

Builds are queued (:func:`submit`) and the compile returns without waiting for them: the
graph's first run starts at once, and each launcher takes its binaries when its first launch
needs them (:func:`wait`). So the builds overlap the first run (cuDNN's first convolutions,
library calls, launches of kernels already built) and the compile of the next graph (a
training step's backward). While workers serve, a launch that needs a build moves it to the
front of the queue and waits; while none is up yet (they take seconds to import torch and
Triton), the launching thread builds what it needs, and what is queued before it, itself:
nothing waits for a worker still starting, and when the workers fail, kernels build
in-process as without them, so the pool can only save time.

:class:`BuildCount` counts a graph's kernels as they are built, in the pool or in-process, for
the progress line of long compiles (:mod:`coil.sdk.progress`)."""
from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import threading
from collections import Counter
from typing import Any, Callable

from coil.sdk.progress import build_progress

log = logging.getLogger(__name__)

_lock = threading.Lock()
_workers: list["_Worker"] | None = None


def triton_settings() -> dict[str, Any]:
    """What this process's ``triton.compile`` depends on beyond a job's own fields: the
    ``TRITON_*`` and cache-invalidating environment and the libdevice Triton links. A worker
    takes these over before each build (:func:`.compile_worker.adopt`), so it builds what this
    process would, under the key this process looks up, even when they changed after the
    workers started (torch's Inductor sets ``TRITON_PTXAS_PATH`` and may point the libdevice
    at the CUDA toolkit's when it first compiles in a process)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("TRITON_") and k != "TRITON_INTERPRET"}
    try:  # optional: the pool only runs where Triton compiles
        from triton import knobs
        from triton.compiler.compiler import get_cache_invalidating_env_vars
        env.update({k: os.environ[k] for k in get_cache_invalidating_env_vars() if k in os.environ})
        libdevice = knobs.nvidia.libdevice_path
    except (ImportError, AttributeError):
        libdevice = None
    return {"env": env, "libdevice": libdevice}


#: Most workers started by default. On the H200's 16-core host, MobileNetV2's cold training
#: first call took 27.7 s with 15 workers against 33.8 with 8 (two runs each, one host).
MOST_WORKERS = 16


def count() -> int:
    """Workers to start: ``COIL_TRITON_COMPILE_WORKERS``, else one per CPU this process may
    run on but one (the compiling thread builds too), at most :data:`MOST_WORKERS`."""
    env = os.environ.get("COIL_TRITON_COMPILE_WORKERS")
    if env is not None:
        return max(0, int(env))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(MOST_WORKERS, max(0, cpus - 1))


class _Worker:
    def __init__(self, arch: int) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.proc = subprocess.Popen([sys.executable, "-m", "coil_cuda_triton.compile_worker", str(arch)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = threading.Event()
        self.dead = False
        threading.Thread(target=self._await_ready, daemon=True).start()

    def _await_ready(self) -> None:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() == "ready":
            self.ready.set()
            _serve(self)  # this thread serves the queue from now on
        else:
            self.dead = True

    def run(self, job: list[Any]) -> dict[str, Any]:
        """The worker's answer: ``{"ok": True, "hit": bool}`` or ``{"ok": False, ...}``."""
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            answer = dict(json.loads(self.proc.stdout.readline()))
        except Exception as exc:  # the worker died: stop using it
            self.dead = True
            log.debug("coil: compile worker failed: %s", exc)
            return {"ok": False}
        if not answer.get("ok"):
            _report_failure(job, answer.get("error", "no reason given"))
        return answer


def start(arch: int) -> None:
    """Start workers building for ``sm_<arch>`` in the background (idempotent). The processes
    are spawned by a thread of their own: the pipes and the ``fork_exec`` of eight workers
    took 60 ms of the caller's first call on the H200, where a warm cache needs no worker."""
    global _workers
    with _lock:
        if _workers is None and count() >= 2:
            _workers = []
            threading.Thread(target=_spawn, args=(arch, count()), daemon=True).start()


def _spawn(arch: int, n: int) -> None:
    for _ in range(n):
        try:
            worker = _Worker(arch)
        except OSError as exc:
            log.info("coil: no more compile workers (%s); building kernels in-process", exc)
            return
        with _lock:
            assert _workers is not None
            _workers.append(worker)


_failures: Counter[str] = Counter()


def _report_failure(job: list[Any], error: str) -> None:
    """Say once per kind of error that a worker could not build a kernel (it is then built in
    this process, the slow way): a pool whose every job fails only costs time, so this line
    is the only sign of it."""
    kind = error.split(":", 1)[0]
    with _lock:
        _failures[kind] += 1
        first = _failures[kind] == 1
    if first:
        name = job[1].get("name", "?") if len(job) > 1 and isinstance(job[1], dict) else "?"
        log.warning("coil: a compile worker could not build %s (%s); such kernels build in "
                    "this process instead", name, error)


def failures() -> dict[str, int]:
    """Worker builds that failed in this process, by kind of error."""
    with _lock:
        return dict(_failures)


def _serving() -> list[_Worker]:
    return [w for w in _workers or [] if w.ready.is_set() and not w.dead]


def ready() -> bool:
    """Whether at least two workers are up and warm."""
    return len(_serving()) >= 2


def _live() -> list[_Worker]:
    return [w for w in _workers or [] if not w.dead]


def started() -> bool:
    """Whether there are workers, up or still starting."""
    return bool(_live())


class Job:
    """One build queued for the workers. A worker runs it, or a thread that needs its binary
    before a worker took it claims it (:meth:`claim`) and builds it in-process; either way
    :meth:`finish` ends it. ``local()`` builds it in-process: what a thread waiting for another
    job runs meanwhile (:func:`wait`)."""

    def __init__(self, payload: list[Any], local: Callable[[], None],
                 on_done: Callable[[], None] | None = None) -> None:
        self.payload = payload
        self.local = local
        self.answer: dict[str, Any] = {"ok": False}
        self._state = "queued"  # then "running" (a worker has it) or "claimed" (in-process)
        self._done = threading.Event()
        self._on_done = on_done

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def queued(self) -> bool:
        """Whether nobody has taken the job yet."""
        return self._state == "queued"

    def take(self, by: str) -> bool:
        """Take a queued job, for a worker (``by="running"``) or this thread (``"claimed"``);
        False when it was taken already. Call holding the pool's lock."""
        if self._state != "queued":
            return False
        self._state = by
        return True

    def claim(self) -> bool:
        """Take the job to build it in this thread: False when a worker (or another thread)
        has it already."""
        with _lock:
            return self.take("claimed")

    def wait_done(self, timeout: float) -> bool:
        """Whether the job ended within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def finish(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self._done.set()
        if self._on_done is not None:
            self._on_done()


_queue: "collections.deque[Job]" = collections.deque()
_has_work = threading.Condition(_lock)


def _next_queued() -> Job | None:
    """The oldest job nobody took (call holding ``_lock``)."""
    while _queue:
        job = _queue.popleft()
        if job.queued:
            return job
    return None


def submit(payloads: list[list[Any]], local: list[Callable[[], None]],
           on_done: list[Callable[[], None]] | None = None) -> list[Job] | None:
    """Queue ``[source_path, kernel fields, config fields, aligned, debug, arch, settings]``
    builds (``settings``: :func:`triton_settings`) for
    the workers, in order (a graph's kernels in launch order: the first launches need the
    first builds). Returns at once with the jobs; None when there is no pool (workers
    disabled or failed), so the caller builds in-process. ``local[i]`` builds payload ``i``
    in this process; ``on_done[i]`` is called, from whichever thread ends it, once it ends."""
    if not started():
        return None
    jobs = [Job(p, fn, on_done[i] if on_done else None) for i, (p, fn) in enumerate(zip(payloads, local))]
    with _has_work:
        _queue.extend(jobs)
        _has_work.notify_all()
    return jobs


def wait(job: Job) -> dict[str, Any]:
    """``job``'s answer once it ends. While a worker serves the queue, ``job`` moves to its
    front and this thread only waits: a ``triton.compile`` here holds the GIL for most of
    its work, so the pool's threads could not hand the workers their next jobs meanwhile
    (on the H200 a first call that built other jobs here while waiting took 18.7 s instead
    of about 5 for ViT-tiny, whose template builds are slow). While no worker is up yet,
    this thread builds queued jobs itself, oldest first, until ``job`` is done. An
    in-process build that fails answers ``{"ok": False}``: its launcher builds again when it
    needs the binary, and reports the error then."""
    while not job.done:
        if _serving():
            with _lock:
                if job.queued:
                    _queue.appendleft(job)  # its older place in the queue is skipped later
            job.wait_done(0.05)  # again soon: the workers may die
            continue
        with _lock:
            other = _next_queued()
            if other is not None:
                other.take("claimed")
        if other is None:
            job.wait_done(0.05)
            continue
        answer: dict[str, Any] = {"ok": True, "local": True}
        try:
            other.local()
        except Exception as exc:  # noqa: BLE001 - reported by its own launcher's build later
            log.debug("coil: in-process build failed: %s", exc)
            answer = {"ok": False}
        other.finish(answer)
    return job.answer


def serving() -> bool:
    """Whether a worker is up and taking jobs."""
    return bool(_serving())


def _serve(worker: _Worker) -> None:
    """A worker's thread, from when it is ready: runs queued jobs until the worker dies."""
    while True:
        with _has_work:
            job = None
            while not worker.dead and (job := _next_queued()) is None:
                _has_work.wait()
            if job is None:
                return
            job.take("running")
        job.finish(worker.run(job.payload))


def retire(worker: _Worker) -> None:
    """Stop ``worker`` taking jobs (its thread ends once idle)."""
    with _has_work:
        worker.dead = True
        _has_work.notify_all()


class BuildCount:
    """How many of a graph's launchers are built, reported through :mod:`coil.sdk.progress`:
    a launcher counts once the last of its pool jobs ends or once it is built in-process,
    whichever comes first. Create it in the compiling thread; pool threads call
    :meth:`job_done`."""

    def __init__(self, total: int) -> None:
        self._report = build_progress()  # bound to this thread's compile
        self._total = total
        self._jobs_left: Counter[int] = Counter()
        self._counted: set[int] = set()
        self._lock = threading.Lock()

    def add_job(self, launcher: object) -> None:
        self._jobs_left[id(launcher)] += 1

    def job_done(self, launcher: object) -> None:
        with self._lock:
            self._jobs_left[id(launcher)] -= 1
            if self._jobs_left[id(launcher)] == 0:
                self._count(launcher)

    def built(self, launcher: object) -> None:
        with self._lock:
            self._count(launcher)

    def _count(self, launcher: object) -> None:
        if id(launcher) not in self._counted:
            self._counted.add(id(launcher))
            self._report(len(self._counted), self._total)
