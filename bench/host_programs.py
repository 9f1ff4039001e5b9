"""Per-call time of launch-bound graphs on the CPU with host programs on and off (issue 12's
C++ wrapper; ``coil.host_programs``), beside eager and Inductor, in one process.

    OMP_NUM_THREADS=1 python bench/host_programs.py [--rounds 9] [--calls 2000]

Each workload is compiled three ways (Coil with ``host_programs`` on, off, and Inductor);
the timed rounds rotate which goes first; microseconds per call, the median round. Small
tensors, so that a call's time is the wrapper's and Dynamo's rather than the kernels'."""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F


def pointwise(x: torch.Tensor) -> torch.Tensor:
    """Five pointwise ops: one kernel, no program (the control)."""
    return ((x * 2 + 1).sin() * x).relu() + 3


def norm_block(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer norm, GELU, residual, softmax and a column sum: two kernels."""
    y = F.layer_norm(x, (x.shape[-1],))
    z = F.gelu(y) + x
    return z.softmax(-1).sum(0), z


def reductions(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain of reductions over alternating dims and a scan: five kernels."""
    a = x.softmax(-1)
    b = (a * x).sum(-1, keepdim=True)
    c = (x - b).abs().amax(0)
    d = (x / c).cumsum(-1)
    e = (d * d).mean(-1, keepdim=True)
    return (d - e).sum(), e


WORKLOADS: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "pointwise (1 kernel)": (pointwise, (64,)),
    "norm_block (2 kernels)": (norm_block, (8, 64)),
    "reductions (5 kernels)": (reductions, (16, 33)),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); us per call, median of {args.rounds} rounds")
    print("| workload | eager | Inductor | Coil, programs off | Coil, programs on | on / off |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (fn, shape) in WORKLOADS.items():
        torch._dynamo.reset()
        x = torch.randn(*shape)
        fns = {"eager": fn, "inductor": torch.compile(fn),
               "off": torch.compile(fn, backend="coil", options={"host_programs": False}),
               "on": torch.compile(fn, backend="coil", options={"host_programs": True})}
        for f in fns.values():
            f(x)
            f(x)
        times: dict[str, list[float]] = {k: [] for k in fns}
        order = list(fns)
        for r in range(args.rounds):
            for k in order[r % len(order):] + order[:r % len(order)]:
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fns[k](x)
                times[k].append((time.perf_counter() - t0) / args.calls * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {name} | {med['eager']:.1f} | {med['inductor']:.1f} | {med['off']:.1f} | {med['on']:.1f} | "
              f"{med['on'] / med['off']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
