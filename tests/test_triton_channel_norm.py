"""A layer norm over the channels of an NCHW tensor (timm's ``LayerNorm2d``, after a permute)
through the Triton plugin under the interpreter, forward and backward. Its reductions over
the channels (the forward's statistics, the backward's sums) read each row H*W elements
apart; the convolution's bias and the norm's weight, indexed by the channel alone, do not
vote for the row layout (``_contiguous_along_x``), so those kernels tile along the input's
contiguous dim instead of running one row per program. The backward's sums ran one row per
program before."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from coil.report import recording
from helpers import cpu_routed_to, cpu_tensors


def _norm2d(x: torch.Tensor, bias: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """ConvNeXt's order: a convolution's per-channel bias, then the norm over channels."""
    y = x + bias[:, None, None]
    return F.layer_norm(y.permute(0, 2, 3, 1), (x.shape[1],), w, b).permute(0, 3, 1, 2)


def test_channel_norm_statistics_tile_along_the_contiguous_dim():
    with cpu_tensors():
        torch.manual_seed(0)
        x = torch.randn(2, 40, 6, 7, requires_grad=True)
        params = [torch.randn(40, requires_grad=True) for _ in range(3)]
        g = torch.randn(2, 40, 6, 7)
        (_norm2d(x, *params) * g).sum().backward()
        want = [t.grad.clone() for t in (x, *params)]
        for t in (x, *params):
            t.grad = None
        with cpu_routed_to("triton", "channel-norm-tests"), recording() as report:
            (torch.compile(_norm2d, backend="coil")(x, *params) * g).sum().backward()
    for t, ref in zip((x, *params), want):
        torch.testing.assert_close(t.grad, ref, atol=1e-4, rtol=1e-4)
    # every reduction over the channels (rows H*W = 42 elements apart), in the forward's
    # statistics and the backward's sums, tiles kept points along the contiguous dim and loops
    # over the channels; a one-row program (the persistent shape) would hold its row instead
    over_channels = [k for g in report.graphs for k in g.kernels
                     if "tl.sum(" in k.source and "rindex * 42" in k.source]
    assert len(over_channels) >= 2, [k.name for g in report.graphs for k in g.kernels]
    assert all("for roffset in range" in k.source for k in over_channels), [k.name for k in over_channels]
