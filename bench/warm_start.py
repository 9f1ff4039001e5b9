"""First call in a fresh process: cold, with a warm local cache, and with only a remote
(Redis) cache; Inductor against Coil, per workload and per model.

Usage::

    python bench/warm_start.py [--backends inductor,coil] [--workloads gpt_block,softmax,...]
                               [--models tv_resnet18,hf_bert,...] [--size small|real]
                               [--model-mode infer|train] [--modes cold,warm,remote]
                               [--repeat 3] [--device cpu|cuda] [--redis auto|URL]
                               [--json-out FILE]
    python bench/warm_start.py --merge FILE [FILE ...]   # one table from several --json-out runs

Every measurement is one process that runs ``torch.compile`` and the first call (+ a device
synchronize) of one target and reports their wall seconds; for Coil also the seconds spent
inside Coil's ``compile_graph`` (its own share: key, load or compile, wrapper) and how many
graphs came from the graph cache. Per target and backend:

* ``cold``: empty cache folders (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``,
  ``COIL_CACHE_DIR``), one process.
* ``warm``: ``--repeat`` more processes sharing the cold one's folders (warm local caches).
* ``remote`` (Coil only): one process with fresh folders and ``COIL_REMOTE_CACHE`` fills the
  Redis server, then ``--repeat`` processes each with fresh, empty folders and the same
  server: every graph must come from Redis. ``--redis auto`` (the default) starts a
  ``redis-server`` on a free port of 127.0.0.1 for the run; a URL uses that server, under a
  prefix of its own (removed afterwards).

Warm and remote processes alternate (warm, remote, warm, ...) so that load from other work on
the machine weighs on both alike; each figure is the median of ``--repeat``. Workloads are
``bench/cpu.py``'s (their sizes on the CPU; ``--device cuda`` puts them on the GPU); models
are ``tests/models`` zoo entries (``--size small`` on the CPU, ``real`` for the GPU), in
inference (``--model-mode infer``, no_grad) or as one training step. Prints a markdown table:
per target, Inductor cold / warm, Coil cold / warm / remote (and Coil's own share of warm and
remote), warm Coil / warm Inductor, remote / warm. ``--merge`` pools the warm and remote
runs of several passes (each figure: the median of them all; cold: the first pass's), for a
machine whose load from other work varies over a run."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = ["gpt_block", "cross_entropy", "softmax", "layernorm", "mlp_train"]
CACHE_ENV_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COIL_CACHE_DIR")
MARKER = "@@warm-start@@ "


# --------------------------------------------------------------------------- the child


def _workload_step(name: str, backend: str, device: str) -> Any:
    sys.path.insert(0, HERE)
    import torch
    import cpu as cpu_bench
    w = cpu_bench.WORKLOADS[name]
    with torch.device(device):
        inputs = w.make_inputs()
    return cpu_bench.make_step(w, torch.compile(w.fn, backend=backend), inputs)


def _model_step(name: str, backend: str, device: str, size: str, mode: str) -> Any:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import torch
    from models import zoo
    with torch.device(device):
        built = zoo.build(name, size)
    model = built.model
    model.train(mode == "train")
    fn = torch.compile(model, backend=backend)
    if mode != "train":
        def infer() -> Any:
            with torch.no_grad():
                return fn(*built.args, **built.kwargs)
        return infer

    def train() -> Any:
        loss = built.loss_fn(fn(*built.args, **built.kwargs, **built.train_kwargs))
        loss.backward()
        return loss
    return train


@contextmanager
def _coil_share(backend: str) -> Iterator[dict[str, Any]]:
    """Seconds inside Coil's ``compile_graph``, its key and load of the layer before
    AOTAutograd (``coil.aot_cache``), the graphs it saw (cached or not) and how many came from
    that layer (``aot_hits``: no AOTAutograd trace)."""
    share: dict[str, Any] = {}
    if backend != "coil":
        yield share
        return
    import coil.backend
    from coil.compile import add_observer, remove_observer
    from coil.sdk import cachestats
    wrapped = ("compile_graph", "load_compiled", "_aot_cache_key")  # the names the Dynamo backend calls
    inner = {name: getattr(coil.backend, name) for name in wrapped}
    share.update(coil_s=0.0, graphs=0, cached=0, aot_hits=0)

    def timed(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = inner[name](*args, **kwargs)
                share["aot_hits"] += name == "load_compiled" and out is not None
                return out
            finally:
                share["coil_s"] += time.perf_counter() - t0
        return call

    reports: list[Any] = []

    def observe(report: Any) -> None:
        share["graphs"] += 1
        share["cached"] += bool(report.cached)
        reports.append(report)

    for name in wrapped:
        setattr(coil.backend, name, timed(name))
    add_observer(observe)
    before = cachestats.snapshot()
    try:
        yield share
    finally:
        for name in wrapped:
            setattr(coil.backend, name, inner[name])
        remove_observer(observe)
        share["cache"] = (cachestats.snapshot() - before).summary()
        stages: dict[str, float] = {}  # per stage over every graph; first-run stages included
        for report in reports:          # once the first call has run (it has, by now)
            for stage, seconds in report.stage_seconds.items():
                stages[stage] = round(stages.get(stage, 0.0) + seconds, 4)
        share["stages"] = stages


def child(args: argparse.Namespace) -> None:
    """One process: compile and first call of one target; prints seconds as JSON."""
    kind, name = args.child
    import torch
    step = (_workload_step(name, args.backend, args.device) if kind == "workload"
            else _model_step(name, args.backend, args.device, args.size, args.model_mode))
    with _coil_share(args.backend) as share:
        t0 = time.perf_counter()
        step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    print(MARKER + json.dumps({"seconds": seconds, **share}), flush=True)


# --------------------------------------------------------------------------- the parent


def _run(args: argparse.Namespace, target: tuple[str, str], backend: str, dirs: dict[str, str],
         remote: str | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "COIL_REMOTE_CACHE"}
    env.update(dirs)
    if remote:
        env["COIL_REMOTE_CACHE"] = remote
    command = [sys.executable, __file__, "--child", *target, "--backend", backend, "--device", args.device,
               "--size", args.size, "--model-mode", args.model_mode]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(MARKER)]
    if done.returncode or not lines:
        raise RuntimeError(f"{backend} {target[1]}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARKER):])


def _fresh_dirs(root: str) -> dict[str, str]:
    folder = tempfile.mkdtemp(dir=root)
    return {name: os.path.join(folder, name) for name in CACHE_ENV_VARS}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _redis(spec: str) -> Iterator[str]:
    """A Redis URL for the run: a server started here (``auto``) or ``spec`` with a prefix
    of this run's own, emptied afterwards."""
    if spec != "auto":
        prefix = f"warmstart-{uuid.uuid4().hex[:8]}"
        url = spec + ("&" if "?" in spec else "?") + f"prefix={prefix}"
        try:
            yield url
        finally:
            from coil.sdk.remotecache import RemoteCache
            RemoteCache(url).clear()
        return
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("warm_start: --modes remote needs redis-server (apt-get install redis-server) "
                         "or --redis URL")
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="warm-start-redis-") as folder:
        proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", folder],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait()


def _median(runs: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values else None


def measure(args: argparse.Namespace, target: tuple[str, str], backend: str, root: str,
            redis_url: str | None) -> dict[str, Any]:
    """Cold, warm and (Coil) remote-only runs of one target."""
    modes = args.modes
    warm_dirs = _fresh_dirs(root)
    out: dict[str, Any] = {}
    if "cold" in modes or "warm" in modes:
        out["cold"] = _run(args, target, backend, warm_dirs)
    remote = redis_url if backend == "coil" and "remote" in modes else None
    if remote:
        out["fill"] = _run(args, target, backend, _fresh_dirs(root), remote)
    warm, from_remote = [], []
    for _ in range(args.repeat):
        if "warm" in modes:
            warm.append(_run(args, target, backend, warm_dirs))
        if remote:
            run = _run(args, target, backend, _fresh_dirs(root), remote)
            if run.get("cached") != run.get("graphs"):
                print(f"  warning: {target[1]} remote-only run compiled {run['graphs'] - run['cached']} "
                      f"of {run['graphs']} graph(s) ({run.get('cache')})", file=sys.stderr)
            from_remote.append(run)
    out["warm"], out["remote"] = warm, from_remote
    return out


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[tuple[str, dict[str, dict[str, Any]]]], backends: list[str]) -> list[str]:
    head = ["target"]
    for b in backends:
        head += [f"{b} cold s", f"{b} warm s"]
        if b == "coil":
            head += ["coil remote s", "coil share warm s", "coil share remote s"]
    head += ["warm coil / inductor", "remote / warm (coil)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, result in rows:
        cells = [name]
        for b in backends:
            r = result.get(b, {})
            cells += [_cell(r.get("cold", {}).get("seconds")), _cell(_median(r.get("warm", []), "seconds"))]
            if b == "coil":
                cells += [_cell(_median(r.get("remote", []), "seconds")),
                          _cell(_median(r.get("warm", []), "coil_s"), 3),
                          _cell(_median(r.get("remote", []), "coil_s"), 3)]
        coil_warm = _median(result.get("coil", {}).get("warm", []), "seconds")
        ind_warm = _median(result.get("inductor", {}).get("warm", []), "seconds")
        coil_remote = _median(result.get("coil", {}).get("remote", []), "seconds")
        cells.append(_cell(coil_warm / ind_warm if coil_warm and ind_warm else None))
        cells.append(_cell(coil_remote / coil_warm if coil_remote and coil_warm else None))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="inductor,coil")
    p.add_argument("--workloads", default=",".join(DEFAULT), help="bench/cpu.py workloads ('' for none)")
    p.add_argument("--models", default="", help="tests/models zoo entries, e.g. tv_resnet18,hf_bert")
    p.add_argument("--size", default="small", choices=["small", "real"])
    p.add_argument("--model-mode", default="infer", choices=["infer", "train"])
    p.add_argument("--modes", default="cold,warm,remote", help="any of cold, warm, remote")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--redis", default="auto", help="'auto' (start redis-server) or redis://host:port/db")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per process")
    p.add_argument("--json-out", default="")
    p.add_argument("--merge", nargs="+", metavar="FILE", help="print one table from --json-out files")
    p.add_argument("--child", nargs=2, metavar=("KIND", "NAME"), help=argparse.SUPPRESS)
    p.add_argument("--backend", default="coil", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.modes = set(filter(None, args.modes.split(",")))
    return args


def merge(files: list[str]) -> None:
    """One table from several ``--json-out`` files: warm and remote runs pooled."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    backends: list[str] = []
    for name in files:
        with open(name) as f:
            data = json.load(f)
        for b in data["args"]["backends"].split(","):
            if b not in backends:
                backends.append(b)
        for target, result in data["rows"]:
            into = rows.setdefault(target, {})
            for b, r in result.items():
                pooled = into.setdefault(b, {"warm": [], "remote": []})
                pooled.setdefault("cold", r.get("cold", {}))
                pooled["warm"] += r.get("warm", [])
                pooled["remote"] += r.get("remote", [])
    print("\n".join(table(list(rows.items()), backends)))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    if args.merge:
        merge(args.merge)
        return
    backends = args.backends.split(",")
    targets = [("workload", w) for w in filter(None, args.workloads.split(","))]
    targets += [("model", m) for m in filter(None, args.models.split(","))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="warm-start-") as root:
        with (_redis(args.redis) if "remote" in args.modes and "coil" in backends
              else _no_redis()) as redis_url:
            for target in targets:
                result = {}
                for backend in backends:
                    result[backend] = measure(args, target, backend, root, redis_url)
                    r = result[backend]
                    print(f"{target[1]} {backend}: cold {_cell(r.get('cold', {}).get('seconds'))} s, "
                          f"warm {_cell(_median(r['warm'], 'seconds'))} s, "
                          f"remote {_cell(_median(r['remote'], 'seconds'))} s", file=sys.stderr, flush=True)
                rows.append((target[1], result))
                if args.json_out:  # after every target: a run cut short keeps what it measured
                    with open(args.json_out, "w") as f:
                        json.dump({"args": {k: (sorted(v) if isinstance(v, set) else v)
                                            for k, v in vars(args).items()}, "rows": rows}, f, indent=1)
    print("\n".join(table(rows, backends)))


@contextmanager
def _no_redis() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
