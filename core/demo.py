"""Coil's demo (``python -m coil.demo``): compiles a small GPT block and an MLP training step
on the CPU, checks them against eager, prints the kernels Coil generated and the
eager-vs-Coil time."""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import coil


class Block(nn.Module):
    """A GPT-style block: layer norm, causal self-attention, GELU MLP, residuals."""

    def __init__(self, dim: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (c // h) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def _side_by_side(eager: Callable[[], Any], compiled: Callable[[], Any], rounds: int = 9,
                  calls: int = 10) -> tuple[float, float]:
    """Median ms per call of each function: ``rounds`` rounds of ``calls`` calls, the two
    functions taking turns round by round, so that a slow spell of the machine weighs on both."""
    eager(), compiled()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for fn, out in ((eager, times[0]), (compiled, times[1])):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times[0]), statistics.median(times[1])


def _show(title: str, report: Any, verbose: bool) -> None:
    print(f"\n=== {title}")
    for g in report.graphs:
        print(f"  {g.name} ({g.kind}): {len(g.kernels)} kernels, fallbacks {g.fallback_ops or 'none'}, "
              f"library calls {len(g.library_ops)}, planned peak {g.peak_bytes / 2**20:.2f} MiB, "
              f"compile {sum(g.stage_seconds.values()):.2f}s")
        for k in g.kernels:
            print(f"    {k.name}: fuses {', '.join(k.ops)}")
    if verbose:
        print(report)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", action="store_true", help="print the generated C++ too")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    block = Block().eval()
    x = torch.randn(8, 64, 128)
    with torch.no_grad():
        expected = block(x)
        report = coil.explain(block, x)
        torch.testing.assert_close(report.result, expected, atol=1e-4, rtol=1e-4)
        compiled = torch.compile(block, backend="coil")
        compiled(x)
        eager_ms, coil_ms = _side_by_side(lambda: block(x), lambda: compiled(x))
    _show("GPT block (inference)", report, args.source)
    print(f"  matches eager; eager {eager_ms:.3f} ms, coil {coil_ms:.3f} ms")

    torch._dynamo.reset()
    mlp = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    ref = copy.deepcopy(mlp)
    xb, yb = torch.randn(128, 256), torch.randint(0, 10, (128,))

    def step(model: nn.Module) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        return loss

    report = coil.explain(step, mlp)
    step(ref)
    for p, q in zip(mlp.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    compiled_step = torch.compile(step, backend="coil")
    eager_ms, coil_ms = _side_by_side(lambda: step(ref), lambda: compiled_step(mlp))
    _show("MLP training step (forward + backward)", report, args.source)
    print(f"  loss and gradients match eager; eager {eager_ms:.3f} ms, coil {coil_ms:.3f} ms")


if __name__ == "__main__":
    main()
