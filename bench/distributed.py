"""Overlap of a collective with independent compute: one graph, two schedules.

Usage::

    python bench/distributed.py [--elements 4194304] [--matrix 512] [--chain 4]
                                [--iters 60] [--world 2] [--threads 1] [--skew-ms 0]

Starts ``--world`` CPU processes with gloo on 127.0.0.1. Each compiles, with Coil, one step
that all-reduces a float32 tensor of ``--elements`` elements and, independently of it, runs
``--chain`` matmul + tanh layers on a ``--matrix`` square matrix, then combines the two:

* ``overlapped``: Coil's schedule (the ``collective_overlap`` knob on, the default): the
  all-reduce starts first and its wait lands after the matmul chain, just before the add
  that reads its result;
* ``wait forced``: the same graph compiled with ``collective_overlap=False``: the wait comes
  right after the all-reduce, so the chain runs only once the communication is done;
* for scale, the all-reduce alone and the chain alone (each compiled with Coil), and eager.

Runs alternate between the variants (so other load on the machine weighs on each alike);
ranks meet at a barrier before every step, every call is timed on each rank, and a step's
time is the slower rank's. ``--skew-ms`` makes the last rank sleep that long inside each
timed step before calling it: a late peer, whose data arrives later while this rank's CPU is
free (gloo on one machine otherwise spends the same cores on the transfer as the chain does,
so there is nothing to overlap with). Prints the median and the 20th-80th percentiles per
variant and per rank, and where the wait landed in each wrapper."""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FUNCOL = torch.ops._c10d_functional


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _step_fns(group: str, chain: int) -> dict[str, Callable[..., Any]]:
    def layers(x: torch.Tensor, ws: list[torch.Tensor]) -> torch.Tensor:
        for w in ws:
            x = torch.tanh(x @ w)
        return x

    def step(g: torch.Tensor, x: torch.Tensor, *ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        reduced = FUNCOL.wait_tensor(FUNCOL.all_reduce(g, "sum", group))
        h = layers(x, list(ws))  # needs nothing from the all-reduce
        return reduced * 0.5, h + reduced[: h.numel()].view_as(h)

    def comm(g: torch.Tensor, x: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        return FUNCOL.wait_tensor(FUNCOL.all_reduce(g, "sum", group)) * 0.5

    def compute(g: torch.Tensor, x: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        return layers(x, list(ws)) + 1

    return {"step": step, "comm": comm, "compute": compute}


def _worker(rank: int, world: int, port: int, opts: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(opts.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    import coil  # noqa: F401 - registers the backend
    from coil import compile as coil_compile
    fns = _step_fns(dist.group.WORLD.group_name, opts.chain)
    torch.manual_seed(rank)
    g = torch.randn(opts.elements)
    x = torch.randn(opts.matrix, opts.matrix)
    ws = [torch.randn(opts.matrix, opts.matrix) / opts.matrix ** 0.5 for _ in range(opts.chain)]
    args = (g, x, *ws)
    reports: list[Any] = []
    coil_compile.add_observer(reports.append)
    variants: dict[str, Callable[..., Any]] = {
        "overlapped": torch.compile(fns["step"], backend="coil"),
        "wait forced": torch.compile(fns["step"], backend="coil", options={"collective_overlap": False}),
        "all-reduce alone": torch.compile(fns["comm"], backend="coil"),
        "chain alone": torch.compile(fns["compute"], backend="coil"),
        "eager": fns["step"],
    }
    wrappers = {}
    for name, fn in variants.items():  # compile (and check) every variant once
        before = len(reports)
        got = fn(*args)
        if name in ("overlapped", "wait forced"):
            want = fns["step"](*args)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            wrappers[name] = reports[before].wrapper_source if len(reports) > before else ""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(opts.warmup):
        for fn in variants.values():
            fn(*args)
    for _ in range(opts.iters):
        for name, fn in variants.items():
            dist.barrier()  # every rank starts the step together
            t0 = time.perf_counter()
            if rank == world - 1 and opts.skew_ms:
                time.sleep(opts.skew_ms / 1e3)  # a late peer: its data comes later, no CPU spent here
            fn(*args)
            times[name].append(time.perf_counter() - t0)
    torch.save({"times": times, "wrappers": wrappers}, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wait_position(wrapper: str) -> str:
    """Where the wait sits relative to the chain's kernels, from the wrapper's lines."""
    lines = [line.strip() for line in wrapper.splitlines()]
    start = next((i for i, line in enumerate(lines) if "# start" in line), None)
    wait = next((i for i, line in enumerate(lines) if "# wait for" in line), None)
    if start is None or wait is None:
        return "?"
    between = [line for line in lines[start + 1:wait] if "mod_" in line or "= c" in line]
    return f"{len(between)} call(s) between start and wait"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=4 * 2**20, help="float32 elements all-reduced")
    parser.add_argument("--matrix", type=int, default=512, help="side of the chain's square matrices")
    parser.add_argument("--chain", type=int, default=4, help="matmul + tanh layers independent of the all-reduce")
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--skew-ms", type=float, default=0.0,
                        help="the last rank sleeps this long before each step (a late peer)")
    opts = parser.parse_args()
    out = tempfile.mkdtemp(prefix="coil-bench-dist-")
    mp.start_processes(_worker, args=(opts.world, _free_port(), opts, out), nprocs=opts.world,
                       start_method="spawn")
    per_rank = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(opts.world)]
    names = list(per_rank[0]["times"])
    steps = {name: [max(rank["times"][name][i] for rank in per_rank) for i in range(opts.iters)]
             for name in names}
    skew = f"; the last rank {opts.skew_ms:g} ms late" if opts.skew_ms else ""
    print(f"{opts.world} CPU processes, gloo, {opts.threads} thread(s) each{skew}; all-reduce of "
          f"{opts.elements} float32 ({opts.elements * 4 / 2**20:.0f} MiB), {opts.chain} x "
          f"(matmul {opts.matrix}^2 + tanh); {opts.iters} timed steps, slower rank per step")
    ranks = " | ".join(f"rank {r} median ms" for r in range(opts.world))
    print(f"| variant | step median ms | p20-p80 ms | {ranks} |\n|{' --- |' * (3 + opts.world)}")
    for name in names:
        ms = [t * 1e3 for t in steps[name]]
        own = " | ".join(f"{statistics.median(rank['times'][name]) * 1e3:.2f}" for rank in per_rank)
        print(f"| {name} | {statistics.median(ms):.2f} | {_percentile(ms, 0.2):.2f}-{_percentile(ms, 0.8):.2f} | {own} |")
    over, forced = statistics.median(steps["overlapped"]), statistics.median(steps["wait forced"])
    print(f"overlapped / wait forced: {over / forced:.2f}")
    for name, wrapper in per_rank[0]["wrappers"].items():
        print(f"{name}: {_wait_position(wrapper)}")


if __name__ == "__main__":
    sys.exit(main())
