"""Linear layers' biases as pointwise adds for devices whose GEMM library does not add them
in its epilogue (core/matmul_bias.py; the C++ plugin declares
``Capabilities.gemm_bias_epilogue`` False): forward and gradients against eager, the add
inside the consumer's kernel, and the cases left alone."""
from __future__ import annotations

import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from coil.matmul_bias import split_matmul_bias
from helpers import check

aten = torch.ops.aten


def test_the_bias_fuses_into_the_activation():
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    x = torch.randn(6, 24)
    with torch.no_grad():
        report = check(lambda x: torch.nn.functional.gelu(lin(x)), x, atol=1e-5, rtol=1e-4)
    (graph,) = report.graphs
    assert "addmm" not in " ".join(graph.library_ops) and "mm" in " ".join(graph.library_ops), graph.library_ops
    (kernel,) = [k for k in report.kernels if "erf" in k.name]
    assert "add" in kernel.name, kernel.name


def test_training_gradients_of_an_mlp():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 5))
    x = torch.randn(7, 12, requires_grad=True)
    expected = net(x).square().sum()
    grads = torch.autograd.grad(expected, [x, *net.parameters()])
    got = torch.compile(net, backend="coil")(x).square().sum()
    got_grads = torch.autograd.grad(got, [x, *net.parameters()])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    for g, e in zip(got_grads, grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)


def _traced(fn, *args) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def _targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_a_library_that_adds_the_bias_keeps_addmm():
    gm = _traced(lambda b, a, w: torch.addmm(b, a, w), torch.randn(8), torch.randn(4, 3), torch.randn(3, 8))
    assert split_matmul_bias(gm, lambda device: True) == 0
    assert aten.addmm.default in _targets(gm)
    assert split_matmul_bias(gm, lambda device: False) == 1
    assert aten.addmm.default not in _targets(gm) and aten.mm.default in _targets(gm)


def test_scaled_or_two_dimensional_biases_are_left_alone():
    a, w = torch.randn(4, 3), torch.randn(3, 8)
    for fn, bias in ((lambda b, a, w: torch.addmm(b, a, w, beta=0.5), torch.randn(8)),
                     (lambda b, a, w: torch.addmm(b, a, w, alpha=2), torch.randn(8)),
                     (lambda b, a, w: torch.addmm(b, a, w), torch.randn(4, 8))):
        gm = _traced(fn, bias, a, w)
        assert split_matmul_bias(gm, lambda device: False) == 0
        torch.testing.assert_close(gm(bias, a, w), fn(bias, a, w))


def test_sixteen_bit_products_keep_addmm():
    """A bf16 ``addmm`` rounds once, after the bias; rounding the product first would move
    outputs by a bf16 ulp, so 16-bit linear layers are left alone."""
    args = (torch.randn(8, dtype=torch.bfloat16), torch.randn(4, 3, dtype=torch.bfloat16),
            torch.randn(3, 8, dtype=torch.bfloat16))
    gm = _traced(lambda b, a, w: torch.addmm(b, a, w), *args)
    assert split_matmul_bias(gm, lambda device: False) == 0
