"""2-D pooling on the CPU through eager, Inductor and Coil, side by side in one process.

One function per row (a max pool, an average pool, or a batch norm + ReLU + max pool as a conv
net's stem has it), channels-last and NCHW, float32; each backend timed in rounds that rotate
which goes first, the figure being the median. Results are checked against eager's (max
pooling exactly, NaN included; the rest within 1e-5).

    python3 bench/cpu_pool_side_by_side.py --threads 1
    python3 bench/cpu_pool_side_by_side.py --shape 64,24,112,112 --rows max --backends eager,coil"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

#: name -> function of (x, per-channel weight, per-channel bias)
ROWS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "max": lambda x, w, b: F.max_pool2d(x, 3, 2, 1),
    "avg": lambda x, w, b: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "bn_relu_max": lambda x, w, b: F.max_pool2d(torch.relu(x * w[:, None, None] + b[:, None, None]), 3, 2, 1),
}


def _median_ms(fn: Callable[[], object], steps: int) -> float:
    began = time.perf_counter()
    for _ in range(steps):
        fn()
    return 1e3 * (time.perf_counter() - began) / steps


def run_row(name: str, shape: tuple[int, ...], channels_last: bool, backends: list[str],
            rounds: int, steps: int) -> dict[str, float]:
    x = torch.randn(shape)
    x.view(-1)[::97] = float("nan")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(shape[1]), torch.randn(shape[1])
    fn = ROWS[name]
    calls = {}
    with torch.no_grad():
        expected = fn(x, w, b)
        for backend in backends:
            torch._dynamo.reset()
            compiled = fn if backend == "eager" else torch.compile(fn, backend=backend)
            got = compiled(x, w, b)
            exact = name == "max"  # the others round x * w + b as each compiler contracts it
            torch.testing.assert_close(got, expected, equal_nan=True, atol=0 if exact else 1e-5,
                                       rtol=0 if exact else 1e-5)
            calls[backend] = (lambda c=compiled: c(x, w, b))
        times: dict[str, list[float]] = {b: [] for b in backends}
        for r in range(rounds):
            for backend in backends[r % len(backends):] + backends[:r % len(backends)]:
                times[backend].append(_median_ms(calls[backend], steps))
    return {b: statistics.median(t) for b, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8,64,56,56", help="N,C,H,W of the input")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    parser.add_argument("--backends", default="eager,inductor,coil")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: leave it)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = tuple(int(s) for s in args.shape.split(","))
    backends = args.backends.split(",")
    print(f"| row | layout | {' | '.join(f'{b} ms' for b in backends)} |")
    print(f"| --- | --- |{' ---: |' * len(backends)}")
    for name in args.rows.split(","):
        for channels_last in (True, False):
            ms = run_row(name, shape, channels_last, backends, args.rounds, args.steps)
            layout = "channels-last" if channels_last else "NCHW"
            print(f"| {name} {args.shape} | {layout} | {' | '.join(f'{ms[b]:.2f}' for b in backends)} |",
                  flush=True)


if __name__ == "__main__":
    main()
