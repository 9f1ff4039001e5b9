"""First call in a fresh process with warm caches: Inductor vs Coil, per workload.

Usage::

    python bench/warm_start.py [--backends inductor,coil] [--workloads gpt_block,softmax,...]
                               [--repeat 3] [--device cpu|cuda]

For each backend and workload: one process with empty cache directories
(``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, ``COIL_CACHE_DIR``) compiles and runs the
workload (cold), then ``--repeat`` more processes sharing those directories do the same
(warm); each reports the wall time of ``torch.compile`` + the first call (+ a device
synchronize). The CPU workloads are ``bench/cpu.py``'s. Prints a markdown table: cold s, the
median warm s, and warm Coil / warm Inductor."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = ["gpt_block", "cross_entropy", "softmax", "layernorm", "mlp_train"]


def child(backend: str, workload: str, device: str) -> None:
    """One process: compile, first call, print seconds as JSON."""
    sys.path.insert(0, HERE)
    import torch
    import cpu as cpu_bench
    w = cpu_bench.WORKLOADS[workload]
    with torch.device(device):
        inputs = w.make_inputs()
    fn = torch.compile(w.fn, backend=backend)
    step = cpu_bench.make_step(w, fn, inputs)
    t0 = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def run(backend: str, workload: str, device: str, dirs: dict[str, str]) -> float:
    env = dict(os.environ, **dirs)
    done = subprocess.run([sys.executable, __file__, "--child", backend, workload, "--device", device],
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{backend} {workload}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="inductor,coil")
    p.add_argument("--workloads", default=",".join(DEFAULT))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--child", nargs=2, metavar=("BACKEND", "WORKLOAD"))
    args = p.parse_args()
    if args.child:
        child(*args.child, args.device)
        return
    backends = args.backends.split(",")
    rows = []
    for workload in args.workloads.split(","):
        result = {}
        for backend in backends:
            with tempfile.TemporaryDirectory(prefix="warm-start-") as root:
                dirs = {name: os.path.join(root, name) for name in
                        ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COIL_CACHE_DIR")}
                cold = run(backend, workload, args.device, dirs)
                warm = statistics.median(run(backend, workload, args.device, dirs) for _ in range(args.repeat))
            result[backend] = (cold, warm)
            print(f"{workload} {backend}: cold {cold:.2f} s, warm {warm:.2f} s", file=sys.stderr, flush=True)
        rows.append((workload, result))
    print("| workload | " + " | ".join(f"{b} cold s | {b} warm s" for b in backends) + " | warm coil / inductor |")
    print("|---|" + "---:|" * (2 * len(backends) + 1))
    for workload, result in rows:
        cells = " | ".join(f"{result[b][0]:.2f} | {result[b][1]:.2f}" for b in backends)
        ratio = (f"{result['coil'][1] / result['inductor'][1]:.2f}"
                 if "coil" in result and "inductor" in result else "-")
        print(f"| {workload} | {cells} | {ratio} |")


if __name__ == "__main__":
    main()
