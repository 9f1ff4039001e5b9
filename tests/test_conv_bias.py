"""Convolution biases become pointwise adds that fuse into the consumer (core/conv_bias.py):
forward and gradients against eager, and the add inside the consumer's kernel."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import check

CONVS = {
    "conv1d": (lambda: nn.Conv1d(6, 10, 3), (2, 6, 17)),
    "conv2d_grouped_strided": (lambda: nn.Conv2d(8, 12, 3, stride=2, padding=1, groups=4), (2, 8, 9, 11)),
    "conv3d": (lambda: nn.Conv3d(3, 5, 2), (2, 3, 5, 6, 4)),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(6, 4, 3, stride=2), (2, 6, 5, 7)),
}


@pytest.mark.parametrize("case", sorted(CONVS))
def test_bias_fuses_into_the_activation(case):
    make, shape = CONVS[case]
    torch.manual_seed(0)
    conv = make()
    x = torch.randn(*shape)
    with torch.no_grad():
        report = check(lambda x: torch.relu(conv(x)), x, atol=1e-5, rtol=1e-4)
    # (a device with channels-last convolutions also has kernels that lay the operands out)
    (kernel,) = [k for k in report.kernels if "relu" in k.name]
    assert "add" in kernel.name, kernel.name


def test_training_gradients_of_a_biased_conv_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 4, 1), nn.Sigmoid())
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    compiled = torch.compile(net, backend="coil")
    expected = net(x).square().sum()
    grads = torch.autograd.grad(expected, [x, *net.parameters()])
    got = compiled(x).square().sum()
    got_grads = torch.autograd.grad(got, [x, *net.parameters()])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for g, e in zip(got_grads, grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)
