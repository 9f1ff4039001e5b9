"""Tier ``views_indexing``: views become index arithmetic (no copies, one kernel), gathers and
embeddings read through data-dependent indices, scatters and scans (when the device declares
them), concatenation and padding. Every op becomes a kernel on the device, none falls back."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("views_indexing")


def _kernels_only(kit: Kit, fn, *args, count: int | None = None) -> None:
    report = kit.check(fn, *args, atol=1e-5, rtol=1e-5)
    kit.assert_kernels(report, count=count)
    kit.assert_no_fallbacks(report)


def test_view_chain_is_one_kernel(coil_kit: Kit) -> None:
    x = torch.randn(4, 6, 8)
    _kernels_only(coil_kit, lambda x: x.permute(2, 0, 1).reshape(8, 24).t()[1:5, ::2] * 2, x, count=1)


def test_select_squeeze_expand(coil_kit: Kit) -> None:
    x = torch.randn(4, 6, 8)
    _kernels_only(coil_kit, lambda x: x[:, 2:3, 1:-1].squeeze(1) + x.select(2, 3).unsqueeze(-1)
                  .expand(4, 6, 6)[:, 0], x, count=1)


def test_as_strided(coil_kit: Kit) -> None:
    _kernels_only(coil_kit, lambda x: torch.as_strided(x, (4, 3), (12, 2), 1) + 1, torch.randn(48))


def test_gather_and_index_select(coil_kit: Kit) -> None:
    w = torch.randn(20, 8)
    idx = torch.tensor([[1, 7, 0], [3, 3, 5]])
    _kernels_only(coil_kit, lambda w, i: (torch.gather(w[:2], 1, i), torch.index_select(w, 0, i[0])), w, idx)


def test_embedding_and_advanced_indexing(coil_kit: Kit) -> None:
    w = torch.randn(20, 8)
    idx = torch.tensor([[1, 19, -1], [0, 3, 3]])
    _kernels_only(coil_kit, lambda w, i: (F.embedding(i.abs(), w) * 2, w[i, 2:5]), w, idx)


def test_scatter_add_and_index_put(coil_kit: Kit) -> None:
    coil_kit.require("scatter")
    x, src = torch.zeros(5, 6), torch.randn(5, 6)
    index = torch.randint(0, 6, (5, 6))
    rows = torch.tensor([0, 2, 2, 4])
    _kernels_only(coil_kit, lambda x, i, s, r: (torch.scatter_add(x, 1, i, s),
                                                torch.index_put(x, (r,), s[:4], accumulate=True)),
                  x, index, src, rows)


def test_scans(coil_kit: Kit) -> None:
    coil_kit.require("scans")
    x = torch.randn(5, 7)
    _kernels_only(coil_kit, lambda x: (torch.cumsum(x, 1), torch.cumprod(x.clamp(0.9, 1.1), 0)), x)


def test_cat_and_pad(coil_kit: Kit) -> None:
    x = torch.randn(5, 7)
    _kernels_only(coil_kit, lambda x: torch.cat([F.pad(x, (2, 1), value=1.5), x[:, :3] * 2], 1), x)
