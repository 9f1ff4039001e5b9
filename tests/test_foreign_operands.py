"""Operands on another device reach an op as copies on its device (``coil.foreign_operands``):
a 0-dim CPU tensor read by a CUDA kernel was read through a host pointer (an illegal address
on the H100, session 31). The pass is checked here on a graph traced with fake tensors, the
``meta`` device standing for the accelerator; ``tests/test_triton_gpu.py`` runs it on CUDA."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from coil.foreign_operands import bring_foreign_operands

aten = torch.ops.aten


def _traced(f, *shapes_devices):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        args = [torch.empty(shape, device=device) for shape, device in shapes_devices]
        return make_fx(f)(*args)


def _reads(gm, target):
    node = next(n for n in gm.graph.nodes if n.target is target)
    return [a.meta["val"].device.type for a in node.all_input_nodes]


def test_a_cpu_scalar_input_is_copied_to_the_device_of_its_reader():
    gm = _traced(lambda x, s: x * s + 1, ((5,), "meta"), ((), "cpu"))
    assert _reads(gm, aten.mul.Tensor) == ["meta", "cpu"]
    assert bring_foreign_operands(gm) == 1
    assert _reads(gm, aten.mul.Tensor) == ["meta", "meta"]
    copy = next(n for n in gm.graph.nodes if n.target is aten._to_copy.default)
    assert copy.kwargs["device"] == torch.device("meta") and copy.args[0].op == "placeholder"


def test_a_cpu_constant_is_copied_once_at_compile_time():
    gm = _traced(lambda x: (x <= torch.tensor(3.3, device="cpu"), x + torch.tensor(2.0, device="cpu")), ((5,), "meta"))
    assert bring_foreign_operands(gm) == 2
    assert _reads(gm, aten.le.Tensor) == ["meta", "meta"]
    # no copy at run time, and the CPU constants' reads are gone
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten._to_copy.default not in targets and aten.lift_fresh_copy.default not in targets
    consts = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(consts) == 2 and all(c.device.type == "meta" for c in consts)


def test_ops_that_move_data_and_ops_on_one_device_are_left_alone():
    gm = _traced(lambda x, s: (x.cpu() + s, x * 2), ((5,), "meta"), ((), "cpu"))
    before = [(n.op, n.target) for n in gm.graph.nodes]
    assert bring_foreign_operands(gm) == 0
    assert [(n.op, n.target) for n in gm.graph.nodes] == before


def test_one_copy_serves_every_reader_on_a_device():
    gm = _traced(lambda x, s: (x * s, x + s, x - s), ((5,), "meta"), ((), "cpu"))
    assert bring_foreign_operands(gm) == 3
    assert sum(n.target is aten._to_copy.default for n in gm.graph.nodes) == 1


def test_ops_left_to_the_library_keep_their_operands():
    """A library call takes mixed devices as eager does; some want a CPU operand."""
    gm = _traced(lambda x, s: x * s + 1, ((5,), "meta"), ((), "cpu"))
    assert bring_foreign_operands(gm, lambda node, device: node.target is not aten.mul.Tensor) == 0
    assert _reads(gm, aten.mul.Tensor) == ["meta", "cpu"]


def test_a_constant_copied_inside_the_fake_mode_is_a_real_tensor():
    """AOTAutograd calls the backend inside its fake mode: the copy of a constant made there
    was a fake tensor (no data pointer on the H100) or refused as a real input (session 32)."""
    gm = _traced(lambda x: x <= torch.tensor(3.3, device="cpu"), ((5,), "meta"))
    for mode in (FakeTensorMode(), FakeTensorMode(allow_non_fake_inputs=True)):
        with mode:
            assert bring_foreign_operands(gm) == 1
        const = next(getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr")
        assert type(const) is torch.Tensor and const.device.type == "meta"
        gm = _traced(lambda x: x <= torch.tensor(3.3, device="cpu"), ((5,), "meta"))
