"""Kernels iterate in the memory order of what they write (core/loop_order.py): the unit
rules, and compiled results against eager for layouts where the order changes."""
from __future__ import annotations

import sympy
import torch

from coil import ir
from coil.kernel import KernelNode
from coil.loop_order import memory_order, permute

from helpers import check

X = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(4)]


def _store(index: sympy.Expr, buf: str = "buf0") -> KernelNode:
    load = ir.Load(torch.float32, buffer="arg0", index=index)
    node = ir.PointwiseNode(name=buf, layout=None, ranges=(), body=load, store_index=index)  # type: ignore[arg-type]
    return KernelNode(node, "x", load, index, (buf,))


def test_channels_last_store_puts_channels_innermost():
    n, c, h, w = X
    ranges = (2, 8, 5, 6)
    nhwc = 240 * n + c + 48 * h + 8 * w
    perm = memory_order(ranges, [_store(nhwc)], {"buf0"})
    assert perm == (0, 2, 3, 1)
    new_ranges, (kn,) = permute(perm, ranges, [_store(nhwc)])
    assert new_ranges == (2, 5, 6, 8)
    assert kn.store_index == 240 * X[0] + 48 * X[1] + 8 * X[2] + X[3]
    assert kn.body.index == kn.store_index  # the body is re-indexed with the store


def test_logical_order_is_kept_when_already_in_memory_order():
    n, c, h, w = X
    assert memory_order((2, 8, 5, 6), [_store(240 * n + 30 * c + 6 * h + w)], {"buf0"}) is None


def test_no_permutation_when_stores_disagree_or_index_is_not_linear():
    a, b = X[:2]
    row, col = _store(8 * a + b, "buf0"), _store(a + 4 * b, "buf1")
    assert memory_order((4, 8), [row, col], {"buf0", "buf1"}) is None
    assert memory_order((4, 8), [row, col], {"buf1"}) == (1, 0)  # buf0 stays in the kernel
    assert memory_order((4, 8), [_store(sympy.floor(a / 2) + 8 * b)], {"buf0"}) is None


def test_size_one_dims_do_not_cause_a_permutation():
    n, c, h, w = X
    # (N, C, 1, 1) in channels-last: strides (C, 1, C, C)
    assert memory_order((2, 8, 1, 1), [_store(8 * n + c + 8 * h + 8 * w)], {"buf0"}) is None


def _nhwc(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(memory_format=torch.channels_last)


def test_channels_last_pointwise_matches_eager_and_keeps_layout():
    x = _nhwc(2, 8, 5, 6)
    report = check(lambda x: torch.relu(x * 2 + 1), x)
    assert report.result.stride() == x.stride()


def test_channels_last_batch_norm_relu_residual():
    x, res = _nhwc(2, 16, 7, 5), _nhwc(2, 16, 7, 5)
    mean, var, w, b = torch.randn(16), torch.rand(16) + 0.5, torch.randn(16), torch.randn(16)

    def f(x, res, mean, var, w, b):
        y = torch.nn.functional.batch_norm(x, mean, var, w, b, training=False)
        return torch.relu(y + res)

    check(f, x, res, mean, var, w, b)


def test_channels_last_pool_and_broadcast_back():
    check(lambda x: x * torch.sigmoid(x.mean((2, 3), keepdim=True)), _nhwc(2, 16, 7, 5))


def test_transposed_output_and_mixed_layouts():
    a = torch.randn(33, 17)
    check(lambda a: (a.t() * 3).contiguous(), a)
    check(lambda a, b: a + b, _nhwc(2, 3, 4, 5), torch.randn(2, 3, 4, 5))
    check(lambda a: torch.cat([a * 2, a.sin()], dim=1), _nhwc(2, 3, 4, 5))
