"""Building kernels in parallel, in worker processes.

``triton.compile`` holds the GIL for most of its work, so threads do not overlap it. Worker
processes do: each builds one (kernel, configuration) into Triton's on-disk cache, and the
parent's own ``triton.compile`` of the same kernel is then a cache hit. Workers are separate
interpreters (``python -m coil_cuda_triton.compile_worker``, reading jobs as JSON lines):
never forked, since the parent holds a CUDA context, and not ``multiprocessing`` spawns,
which would re-run the user's main script. They start in the background on the first
compile; until they are up, and whenever anything goes wrong with them, kernels build
in-process as before, so the pool can only save time. ``COIL_TRITON_COMPILE_WORKERS=0``
turns it off.

:class:`BuildCount` counts a graph's kernels as they are built, in the pool or in-process, for
the progress line of long compiles (:mod:`coil.sdk.progress`)."""
from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
from collections import Counter
from typing import Any, Callable

from coil.sdk.progress import build_progress

log = logging.getLogger(__name__)

_lock = threading.Lock()
_workers: list["_Worker"] | None = None


def count() -> int:
    env = os.environ.get("COIL_TRITON_COMPILE_WORKERS")
    if env is not None:
        return max(0, int(env))
    return min(8, max(0, (os.cpu_count() or 1) - 1))


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
        else:
            self.dead = True

    def run(self, job: list[Any]) -> dict[str, Any]:
        """The worker's answer: ``{"ok": True, "hit": bool}`` or ``{"ok": False, ...}``."""
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            return dict(json.loads(self.proc.stdout.readline()))
        except Exception as exc:  # the worker died: stop using it
            self.dead = True
            log.debug("coil: compile worker failed: %s", exc)
            return {"ok": False}


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


def build(jobs: list[list[Any]], on_done: Callable[[int], None] | None = None,
          local: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Build ``[source_path, kernel fields, config fields, aligned, debug, arch]`` jobs into
    Triton's cache in the workers; returns each job's answer when all are done (failures are
    left for the in-process build, which reports them). ``on_done(i)`` is called, from a
    pool thread, as job ``i`` ends, built or not.

    With ``local`` (``local(i)`` builds job ``i`` in this process), the calling thread builds
    too, from the same queue, and workers still starting join as they come up: nothing waits
    for a worker. (A first graph used to build everything in-process because its workers
    were not up yet, and waiting for them lost more than it gained.) Jobs built locally
    answer ``{"ok": True, "local": True}``."""
    answers: list[dict[str, Any]] = [{"ok": False} for _ in jobs]
    if not jobs or (local is None and not ready()):
        return answers
    todo: "queue.Queue[tuple[int, list[Any]]]" = queue.Queue()
    for i, job in enumerate(jobs):
        todo.put((i, job))

    def drain(worker: _Worker) -> None:
        while not worker.ready.is_set():  # still importing Triton: join once up, if work is left
            if worker.dead or todo.empty():
                return
            worker.ready.wait(0.05)
        while not worker.dead:
            try:
                i, job = todo.get_nowait()
            except queue.Empty:
                return
            answers[i] = worker.run(job)
            if on_done is not None:
                on_done(i)

    helpers = _serving() if local is None else _live()
    threads = [threading.Thread(target=drain, args=(w,), daemon=True) for w in helpers]
    for t in threads:
        t.start()
    while local is not None:
        try:
            i, _ = todo.get_nowait()
        except queue.Empty:
            break
        try:
            local(i)
            answers[i] = {"ok": True, "local": True}
        except Exception as exc:  # noqa: BLE001 - reported by the in-process build after
            log.debug("coil: in-process build failed: %s", exc)
        if on_done is not None:
            on_done(i)
    for t in threads:
        t.join()
    return answers


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
