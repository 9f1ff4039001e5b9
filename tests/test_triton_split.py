"""Split reductions in the Triton plugin under Triton's interpreter: whole-tensor, column and
per-channel reductions cut into a partial and a combining kernel (``coil_cuda_triton.split``),
with epilogues, stored values, Welford state, tiles fitted to few kept points, and the
gradients of batch and layer norms."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import check
from test_triton import _clean_language, _sources, backend, interpreted  # noqa: F401 (fixtures)

SPLIT_CASES = {
    "mse_loss": (lambda a, b: F.mse_loss(a, b), lambda: (torch.randn(256, 512), torch.randn(256, 512))),
    "whole_amax_epilogue": (lambda a: a.amax() * 3 + 1, lambda: (torch.randn(64, 2000),)),
    "column_mean": (lambda a: a.mean(0), lambda: (torch.randn(4096, 48),)),
    "column_sum_times_bias": (lambda a, c: a.sum(0) * c + 1, lambda: (torch.randn(4096, 48), torch.randn(48))),
    "stored_and_summed": (lambda a: ((a * 2).sin(), (a * 2).sin().sum()), lambda: (torch.randn(256, 512),)),
    # Welford's (mean, m2, count) partials: kept points contiguous, one kept point, and the
    # per-channel statistics of an NCHW tensor (kept points strided: one long row per program)
    "column_var_mean": (lambda a: torch.var_mean(a, 0), lambda: (torch.randn(4096, 48) + 3,)),
    "whole_var": (lambda a: a.var(), lambda: (torch.randn(300, 301) * 2 + 5,)),
    "channel_var_mean": (lambda a: torch.var_mean(a, (0, 2, 3), correction=0),
                         lambda: (torch.randn(6, 5, 61, 67) + 1,)),
    "channel_sum_and_max": (lambda a: (a.sum((0, 2, 3)) * 2, a.amax((0, 2, 3))),
                            lambda: (torch.randn(6, 5, 61, 67),)),
    # a few contiguous kept points: channels-last statistics (tiles 32 wide), five columns
    # (tiles 8 wide, three rows masked)
    "channels_last_var_mean": (lambda a: torch.var_mean(a, (0, 2, 3), correction=0),
                               lambda: (torch.randn(4, 32, 24, 24).to(memory_format=torch.channels_last) + 2,)),
    "five_columns_sum": (lambda a: a.sum(0) * 2, lambda: (torch.randn(20000, 5),)),
}


def test_split_partial_tiles_fit_few_kept_points():
    """The partial kernel's tiles are as wide as the kept points need (at least 8, at most 64),
    every candidate the same width (the grid depends on it), 2048 and 4096 elements."""
    from coil_cuda_triton import split
    for xn, xblock in ((5, 8), (16, 16), (32, 32), (48, 64), (1000, 64)):
        configs = split.partial_configs(xn)
        assert {c.xblock for c in configs} == {xblock}
        assert sorted(c.xblock * c.rblock for c in configs) == [2048, 4096]


@pytest.mark.parametrize("case", sorted(SPLIT_CASES))
def test_split_reductions_with_epilogues_and_stores(backend, case):
    """Whole-tensor and column reductions split into a partial and a combining kernel, with
    the epilogue at the kept points (a mean's division, a scale) in the second one and the
    pointwise values the reduced loop stores in the first."""
    fn, make = SPLIT_CASES[case]
    report = check(fn, *make(), atol=1e-4, rtol=1e-4)
    (source,) = _sources(report)
    assert "_combine(" in source, source


def test_batch_norm_training_splits_its_channel_statistics(backend):
    """ResNet's batch norms in training: per-channel statistics of an NCHW activation (and
    their gradients' sums) split across programs, forward and backward equal to eager's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(5), torch.nn.ReLU())
    x = torch.randn(6, 5, 61, 67, requires_grad=True)
    twin = {k: v.clone() for k, v in model.state_dict().items()}
    reports = []
    from coil.compile import add_observer, remove_observer
    add_observer(reports.append)
    try:
        out = torch.compile(model, backend="coil")(x)
        out.square().sum().backward()
    finally:
        remove_observer(reports.append)
    got = (out.detach(), x.grad, model[0].weight.grad, model[0].bias.grad, model[0].running_var.clone())
    model.load_state_dict(twin)
    model[0].weight.grad = model[0].bias.grad = None
    x2 = x.detach().clone().requires_grad_()
    want_out = model(x2)
    want_out.square().sum().backward()
    want = (want_out.detach(), x2.grad, model[0].weight.grad, model[0].bias.grad, model[0].running_var)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    sources = [k.source for r in reports for k in r.kernels]
    assert sum("_combine(" in s for s in sources) >= 2, "statistics and gradient sums both split"


def test_layer_norm_weight_gradient_of_merged_patches_splits(backend):
    """Swin's patch merging: a layer norm over 2x2 patches gathered by a permute. Its weight
    gradient is a column sum read across the kept points (each row's statistics, read along
    the rows only, do not count against that): split across programs, equal to eager's."""
    b, h, c = 2, 56, 8
    x = torch.randn(b, h, h, c, requires_grad=True)
    w, bias = torch.randn(4 * c, requires_grad=True), torch.randn(4 * c, requires_grad=True)

    def fn(x, w, bias):
        y = x.reshape(b, h // 2, 2, h // 2, 2, c).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return F.layer_norm(y, (4 * c,), w, bias)
    reports = []
    from coil.compile import add_observer, remove_observer
    add_observer(reports.append)
    try:
        out = torch.compile(fn, backend="coil")(x, w, bias)
        dy = torch.randn_like(out)
        got = torch.autograd.grad(out, (x, w, bias), dy)
    finally:
        remove_observer(reports.append)
    want = torch.autograd.grad(fn(x, w, bias), (x, w, bias), dy)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    assert any("_combine(" in k.source for r in reports for k in r.kernels), "the weight gradient's sum splits"
