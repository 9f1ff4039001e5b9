"""Autocast honoured: every matmul and convolution in the graphs Coil compiles takes the dtype
eager's autocast gives it, and every output has eager's dtype. (PyTorch's own addmm
decomposition computes in float32 and once turned every bf16 matmul into a float32 one.)"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import coil.compile as coil_compile

aten = torch.ops.aten
#: Library ops and which arguments are their matrix (or image and weight) operands.
OPERANDS = {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (1, 2),
            aten.baddbmm.default: (1, 2), aten.convolution.default: (0, 1)}


class _EagerDtypes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in OPERANDS:
            self.seen.add(tuple(str(args[i].dtype) for i in OPERANDS[func]))
        return func(*args, **(kwargs or {}))


def _compiled_dtypes(fn, *args) -> tuple[set[tuple[str, ...]], object]:
    seen: set[tuple[str, ...]] = set()
    original = coil_compile._compile_graph

    def spy(gm, example_inputs, config, kind, *rest):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in OPERANDS:
                seen.add(tuple(str(node.args[i].meta["val"].dtype) for i in OPERANDS[node.target]))
        return original(gm, example_inputs, config, kind, *rest)

    coil_compile._compile_graph = spy
    try:
        out = torch.compile(fn, backend="coil")(*args)
    finally:
        coil_compile._compile_graph = original
    return seen, out


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, 16)
        self.bias = nn.Parameter(torch.randn(4, 16, 16))

    def forward(self, x):
        h = F.relu(self.conv(x)).flatten(1)
        h = self.fc(h)
        return torch.baddbmm(self.bias, h.view(4, 16, 1), h.view(4, 1, 16)).softmax(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_library_ops_take_autocast_dtypes(dtype):
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(4, 3, 8, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        with _EagerDtypes() as mode:
            expected = net(x)
        seen, out = _compiled_dtypes(net, x)
    assert seen == mode.seen
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_training_under_autocast_keeps_matmuls_in_bf16():
    torch.manual_seed(0)
    net, x = _Net(), torch.randn(4, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with _EagerDtypes() as mode:
            net(x).sum().backward()
        seen, out = _compiled_dtypes(lambda x: net(x).sum(), x)
    assert seen <= mode.seen and seen, (seen, mode.seen)
