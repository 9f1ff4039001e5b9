"""The Triton plugin's compile pool (``coil_cuda_triton.compile_pool``) with fake workers and
launchers, no GPU needed: builds are queued and the compile returns at once; a worker runs
what it takes; a thread that needs a binary no worker took builds it in-process, and one
waiting for a worker builds other queued jobs meanwhile; the graph's count reaches every
launcher once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import types

import pytest

from coil.sdk.progress import listening
from coil_cuda_triton import compile_pool, launch
from coil_cuda_triton import backend as triton_backend
from coil_cuda_triton.compile_pool import Job


class _Worker:
    """A worker that answers each job after ``delay`` seconds (``ready`` once up)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.dead = False
        self.jobs: list = []
        self.delay = delay
        self.ready = threading.Event()

    def run(self, job) -> dict:
        time.sleep(self.delay)
        self.jobs.append(job)
        return {"ok": True, "hit": False}


@pytest.fixture
def pool(monkeypatch):
    """A pool of fake workers: ``up(worker)`` starts one serving the queue."""
    workers: list[_Worker] = []
    monkeypatch.setattr(compile_pool, "started", lambda: True)
    real = compile_pool._live()  # a GPU run's own workers (earlier tests) stop serving meanwhile
    for w in real:
        compile_pool.retire(w)
    compile_pool._queue.clear()
    monkeypatch.setattr(compile_pool, "_serving", lambda: [w for w in workers if w.ready.is_set() and not w.dead])

    def up(worker: _Worker) -> _Worker:
        workers.append(worker)
        worker.ready.set()
        threading.Thread(target=compile_pool._serve, args=(worker,), daemon=True).start()
        return worker

    yield up
    for w in workers:
        compile_pool.retire(w)
    compile_pool._queue.clear()
    for w in real:
        w.dead = False
        threading.Thread(target=compile_pool._serve, args=(w,), daemon=True).start()


def _wait_all(jobs: list[Job], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not all(j.done for j in jobs):
        assert time.monotonic() < end, "the pool did not finish"
        time.sleep(0.01)


def test_workers_run_every_job_and_report_it(pool):
    workers = [pool(_Worker()), pool(_Worker())]
    done: list[int] = []
    jobs = compile_pool.submit([[i] for i in range(7)], [lambda: None] * 7,
                               [(lambda i=i: done.append(i)) for i in range(7)])
    assert jobs is not None
    _wait_all(jobs)
    assert sorted(done) == list(range(7)) and sum(len(w.jobs) for w in workers) == 7
    assert all(j.answer == {"ok": True, "hit": False} for j in jobs)


def test_submit_without_a_pool_returns_none(monkeypatch):
    monkeypatch.setattr(compile_pool, "started", lambda: False)
    assert compile_pool.submit([[0], [1]], [lambda: None] * 2) is None


def test_a_waiting_thread_builds_queued_jobs_itself(pool):
    """No worker is up: waiting for a job builds it (and whatever is queued before it) in
    this thread; a worker that comes up meanwhile takes what is left."""
    here: list[int] = []
    late = _Worker()

    def local(i: int) -> None:
        here.append(i)
        if i == 1:
            pool(late)  # a worker comes up while this thread builds
            time.sleep(0.3)

    jobs = compile_pool.submit([[i] for i in range(6)], [(lambda i=i: local(i)) for i in range(6)])
    assert compile_pool.wait(jobs[2])["ok"] and 2 in here + [j[0] for j in late.jobs]
    _wait_all(jobs)
    assert sorted(here + [j[0] for j in late.jobs]) == list(range(6))
    assert here[:2] == [0, 1] and late.jobs, "the worker that came up took jobs"


def test_a_failed_in_process_build_answers_not_ok(pool):
    def boom() -> None:
        raise RuntimeError("no")

    jobs = compile_pool.submit([[0]], [boom])
    assert compile_pool.wait(jobs[0]) == {"ok": False}


def test_a_claimed_job_is_never_run_by_a_worker(pool):
    jobs = compile_pool.submit([[0], [1]], [lambda: None] * 2)
    assert jobs[0].claim() and not jobs[0].claim()
    worker = pool(_Worker())
    _wait_all([jobs[1]])
    assert [j[0] for j in worker.jobs] == [1] and not jobs[0].done
    jobs[0].finish({"ok": True, "local": True})


# ----------------------------------------------------------------------------- a launcher's binaries


def _launcher(monkeypatch, built: list) -> launch.Launcher:
    monkeypatch.setattr(launch, "compile_for", lambda fn, src, cfg, **kw: built.append(cfg) or f"binary {cfg}")
    src = types.SimpleNamespace(name="k", params=["p"], types=["*fp32"], shape="pointwise", buffers=["p"],
                                xnumel=1, configs=[launch.Config(1024), launch.Config(2048)])
    return launch.Launcher(src, None, interpret=False, tune_key=lambda bucket: "0" * 32)


def test_a_launcher_claims_a_build_no_worker_took(pool, monkeypatch):
    built: list = []
    la = _launcher(monkeypatch, built)
    cfg = la.src.configs[0]
    jobs = compile_pool.submit([[0]], [lambda: la.build_queued(cfg)])
    la.queue(cfg, jobs[0])
    assert la.binary(cfg) == f"binary {cfg}" and built == [cfg]
    assert jobs[0].answer == {"ok": True, "local": True}


def test_a_launcher_waits_for_its_worker_then_loads_the_binary(pool, monkeypatch):
    built: list = []
    la = _launcher(monkeypatch, built)
    cfg = la.src.configs[1]
    worker = pool(_Worker(delay=0.2))
    jobs = compile_pool.submit([["job"]], [lambda: la.build_queued(cfg)])
    la.queue(cfg, jobs[0])
    while not worker.jobs and jobs[0].queued:
        time.sleep(0.01)
    assert la.binary(cfg) == f"binary {cfg}"
    assert worker.jobs == [["job"]] and (cfg, True) in la.counted  # the load hit what the worker built


# ----------------------------------------------------------------------------- a graph's precompile


class _Config:  # a launch configuration: hashable, its fields in __dict__
    def __init__(self, num_warps: int) -> None:
        self.num_warps = num_warps


class _FakeLauncher:
    debug = False

    def __init__(self, name: str, configs: int, indexed: int = 0) -> None:
        self.src = types.SimpleNamespace(name=name, params=[], types=[], shape="", buffers=[],
                                         xnumel=1, rnumel=1, configs=[])
        self.configs = [_Config(w) for w in range(configs)]
        self.indexed = set(self.configs[:indexed])  # in Coil's build index: loaded, not built
        self.precompiled = False
        self.queued: dict = {}
        self.here: list = []

    def build_queued(self, cfg) -> None:
        self.here.append(cfg)

    def queue(self, cfg, job) -> None:
        self.queued[cfg] = job

    def load_indexed(self, cfg) -> bool:
        return cfg in self.indexed

    def to_build(self):
        return self.configs[:1] if self.indexed else self.configs

    def precompile(self) -> None:
        self.precompiled = True


def test_precompile_queues_the_builds_and_returns(pool, monkeypatch):
    """``TritonBackend._precompile``: the builds go to the pool and the compile does not wait
    for them; a kernel whose function lies in an earlier module, and one whose builds are in
    the build index, are built (loaded) in-process; the count reaches every launcher once."""
    monkeypatch.setattr(triton_backend.torch.cuda, "get_device_capability", lambda: (9, 0))
    monkeypatch.setattr(compile_pool, "start", lambda arch: None)
    monkeypatch.setattr(triton_backend.TritonBackend, "_apply_budget", lambda self, las: None)
    launchers = [_FakeLauncher("k_a", 2), _FakeLauncher("k_b", 1), _FakeLauncher("k_old", 3),
                 _FakeLauncher("k_warm", 1, indexed=1)]
    seen: list[tuple[int, int]] = []
    with listening(lambda done, total: seen.append((done, total))):
        triton_backend.TritonBackend()._precompile(launchers, "/tmp/k.py", {"k_a", "k_b", "k_warm"})
    a, b, old, warm = launchers
    assert len(a.queued) == 2 and len(b.queued) == 1 and not old.queued and not warm.queued
    assert old.precompiled and warm.precompiled and not a.precompiled and not b.precompiled
    jobs = list(a.queued.values()) + list(b.queued.values())
    assert not any(j.done for j in jobs)  # nothing waited for the builds
    worker = pool(_Worker())
    _wait_all(jobs)
    assert len(worker.jobs) == 3 and not any(job[1]["name"] in ("k_old", "k_warm") for job in worker.jobs)
    assert sorted(seen) == seen and seen[-1] == (4, 4) and len(seen) == 4, seen


def test_a_launcher_with_workers_up_moves_its_build_forward_and_waits(pool, monkeypatch):
    """While a worker serves, the launching thread builds nothing itself (a compile here
    would hold the GIL the pool's threads need): the build it needs goes to the front."""
    built: list = []
    la = _launcher(monkeypatch, built)
    cfg = la.src.configs[0]
    worker = pool(_Worker(delay=0.1))
    here: list = []
    jobs = compile_pool.submit([[f"j{i}"] for i in range(5)], [(lambda i=i: here.append(i)) for i in range(5)])
    la.queue(cfg, jobs[4])
    la.binary(cfg)
    assert jobs[4].answer == {"ok": True, "hit": False} and not here
    assert worker.jobs.index(["j4"]) <= 1, worker.jobs  # ahead of j1..j3
    _wait_all(jobs)


# ----------------------------------------------------------------------------- a real worker


_KERNEL = '''
@jit
def coil_test_double(p_x, p_y, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(p_y + i, tl.load(p_x + i) * 2.0)
'''


def test_a_worker_builds_for_hopper_without_importing_torch(tmp_path):
    """What a worker runs for a job: the kernel built for sm_90 into Triton's cache, in a
    process that never imports torch (importing it was most of a worker's start-up)."""
    pytest.importorskip("triton")
    path = tmp_path / "coil_kernels.py"
    path.write_text(_KERNEL)
    fields = {"name": "coil_test_double", "params": ["p_x", "p_y"], "types": ["*fp32", "*fp32"],
              "shape": "pointwise", "buffers": ["p_x", "p_y"]}
    job = json.dumps([str(path), fields, {"xblock": 128, "num_warps": 4}, True, False, 90])
    code = ("import json, sys\n"
            "from coil_cuda_triton import compile_worker\n"
            f"hit = compile_worker.build(*json.loads({job!r}))\n"
            "print(json.dumps({'hit': hit, 'torch': 'torch' in sys.modules}))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), COIL_CACHE_DIR=str(tmp_path / "coil"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer == {"hit": False, "torch": False}
    assert list((tmp_path / "triton").rglob("*.cubin")), "no binary in Triton's cache"


_PARENT = """
import json, os, subprocess, sys
from types import SimpleNamespace
import triton
from triton.backends.compiler import GPUTarget
from coil_cuda_triton import compile_pool, loader
from coil_cuda_triton.build import compile_for
from coil_cuda_triton.configs import Config

KERNEL = '''
@jit
def coil_test_erfc(p_x, p_y, XBLOCK: tl.constexpr):
    i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(p_y + i, coil_erfc(tl.load(p_x + i)))
'''
adopt, case = sys.argv[1] == "1", sys.argv[2]
if case == "ptxas":  # what Inductor does in this process before Coil's workers start
    from triton.compiler.compiler import make_backend
    make_backend(GPUTarget("cuda", 90, 32)).hash()  # Triton keeps this ptxas version from now on
    real = triton.knobs.nvidia.ptxas.path
    fake = os.path.join(sys.argv[3], "ptxas")
    with open(fake, "w") as f:
        f.write('#!/bin/sh\\nif [ "$1" = --version ]; then echo "Cuda compilation tools, release 12.7, V12.7.99"; '
                f'else exec {real} "$@"; fi\\n')
    os.chmod(fake, 0o755)
    os.environ["TRITON_PTXAS_PATH"] = fake
worker = subprocess.Popen([sys.executable, "-c", "import json, sys\\n"
                           "from coil_cuda_triton import compile_worker\\n"
                           "print(json.dumps(compile_worker.build(*json.loads(sys.stdin.read()))))"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
if case == "late":
    os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"  # a setting taken after the worker started
path = loader.write(KERNEL)
fields = {"name": "coil_test_erfc", "params": ["p_x", "p_y"], "types": ["*fp32", "*fp32"],
          "shape": "pointwise", "buffers": ["p_x", "p_y"]}
cfg = {"xblock": 128, "num_warps": 4}
job = [path, fields, cfg, True, False, 90] + ([compile_pool.triton_settings()] if adopt else [])
worker_hit = json.loads(worker.communicate(json.dumps(job))[0].strip().splitlines()[-1])
module = loader.load(KERNEL, interpret=False)
hits = []
compile_for(module.coil_test_erfc, SimpleNamespace(**fields), Config(**cfg),
            target=GPUTarget("cuda", 90, 32), on_cache=hits.append)
print(json.dumps({"worker_hit": worker_hit, "hits": hits}))
"""


@pytest.mark.parametrize("adopt, case, found", [(True, "late", True), (False, "late", False),
                                               (True, "ptxas", True)])
def test_a_worker_builds_under_the_parents_triton_settings(tmp_path, adopt, case, found):
    """Triton settings a process takes after its workers started (a cache-invalidating
    environment variable here; torch's Inductor, run first in the same process, points
    Triton's libdevice at the CUDA toolkit's) travel with each job: the worker builds under them, and the process then finds the build in the
    cache instead of compiling the kernel a second time. Without them (``adopt=False``, the
    old payload) the same kernel is built twice. ``ptxas``: Inductor moved Triton to another
    ptxas before the workers started, after Triton had hashed its first one, which it keeps;
    the build index keys the ptxas that runs, so the parent finds what the workers built.
    Run in a process of its own: the tests run Triton's interpreter, which cannot compile."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION", "TRITON_PTXAS_PATH")}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), COIL_CACHE_DIR=str(tmp_path / "coil"))
    out = subprocess.run([sys.executable, "-c", _PARENT, "1" if adopt else "0", case, str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer == {"worker_hit": False, "hits": [found]}


def test_a_failed_worker_build_is_reported_once_per_kind(caplog, monkeypatch):
    monkeypatch.setattr(compile_pool, "_failures", compile_pool.Counter())
    job = ["p.py", {"name": "coil_k"}, {}, True, False, 90]
    with caplog.at_level("WARNING", logger="coil_cuda_triton.compile_pool"):
        compile_pool._report_failure(job, "CompilationError: at 3:4")
        compile_pool._report_failure(job, "CompilationError: at 5:6")
    assert compile_pool.failures() == {"CompilationError": 2}
    assert len(caplog.records) == 1 and "coil_k" in caplog.text
