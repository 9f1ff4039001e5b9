"""The order of a backward graph's steps keeps its memory peak low (:meth:`coil.scheduler.
Scheduler._topo_order`): a step that frees a saved activation (its last reader) and allocates
less runs before one that allocates a buffer as large, so the two are not alive together.

In an MLP's backward, the second linear's weight gradient is the last reader of the saved
GELU output, and its input gradient allocates a buffer of the same size. Run in the other
order (as the graph lists them), both 512x256 blocks are alive at once; on the H200, ViT-tiny's
training step peaked 18.5 MiB (one such block) above Inductor's for this reason."""
from __future__ import annotations

import re

import torch

from coil import compile as coil_compile
from coil import config

ROWS, HIDDEN = 512, 256


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, HIDDEN), torch.nn.Linear(HIDDEN, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def test_a_saved_activation_dies_before_a_block_as_large_is_allocated():
    torch.manual_seed(0)
    net, ref = _MLP(), _MLP()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(ROWS, 64)
    reports: list[coil_compile.GraphReport] = []
    coil_compile.add_observer(reports.append)
    torch._dynamo.reset()
    try:
        with config.override(graph_cache=False):
            torch.compile(net, backend="coil")(x).square().sum().backward()
    finally:
        coil_compile.remove_observer(reports.append)
    ref(x).square().sum().backward()
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)

    lines = next(r for r in reports if r.kind == "backward").wrapper_source.splitlines()
    big = f"({ROWS}, {HIDDEN})"
    saved = {m.group(1) for line in lines
             if (m := re.match(rf"\s*if (arg\d+)\.stride\(\).*restride\(arg\d+, \({ROWS}, {HIDDEN}\)", line))}
    assert len(saved) == 2, saved  # the first linear's output and the GELU's
    first_free = next(i for i, line in enumerate(lines) if line.strip() in {f"del {a}" for a in saved})
    # a new block: allocated by the wrapper, or returned by a library call (its layout check)
    first_new = next(i for i, line in enumerate(lines) if big in line
                     and re.match(r"\s*(buf\d+ = new_\d+\(|if buf\d+\.stride\(\))", line))
    assert first_free < first_new, "\n".join(lines)
