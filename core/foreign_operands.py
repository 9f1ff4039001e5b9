"""Operands on another device are brought to the device of the op that reads them.

Eager lets a CUDA op read a 0-dim CPU tensor (``x <= torch.tensor(3.3)`` with a default device,
a step count or learning rate kept on the CPU) and index with CPU index tensors: the kernel
gets the value or a copy on its own device. Coil's kernels read every operand through a
pointer on the kernel's device, so a CPU operand in a GPU kernel read host memory (an illegal
address on the H100, found by running the CPU-written edge tests on CUDA, session 31).

Before lowering, each foreign operand of an op is replaced by a copy on the op's device: a
constant of the graph (``get_attr``, through ``lift_fresh_copy`` or not) is copied once, at
compile time (outside the fake mode the backend is called in); any other value by an
``aten._to_copy`` node, which runs in ATen. Ops that move data between devices themselves are
left alone, as are ops whose outputs span devices."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

aten = torch.ops.aten

#: Ops that take operands from another device on purpose.
_MOVERS = frozenset({aten._to_copy.default, aten.copy.default, aten.copy_.default, aten.lift_fresh_copy.default})


def _devices(value: Any) -> set[torch.device]:
    if isinstance(value, torch.Tensor):
        return {value.device}
    if isinstance(value, (list, tuple)):
        return set().union(*map(_devices, value)) if value else set()
    return set()


def _constant_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The ``get_attr`` node ``node`` reads as it is: itself or through ``lift_fresh_copy``."""
    if node.op == "get_attr":
        return node
    if node.op == "call_function" and node.target is aten.lift_fresh_copy.default:
        src = node.args[0]
        return src if isinstance(src, torch.fx.Node) and src.op == "get_attr" else None
    return None


def _on(val: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``val``'s metadata on ``device`` (a fake tensor where ``val`` is one)."""
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return torch.empty_strided(val.size(), val.stride(), dtype=val.dtype, device="meta")
    with mode:
        return torch.empty_strided(val.size(), val.stride(), dtype=val.dtype, device=device)


def bring_foreign_operands(gm: torch.fx.GraphModule,
                           generated: Callable[[torch.fx.Node, torch.device], bool] = lambda n, d: True) -> int:
    """Rewrite ``gm`` in place so that every op that ``generated`` says Coil's kernels will
    compute reads operands on its own device; the number of operands replaced. Library calls
    are left alone: ATen takes mixed devices as eager does, and some want a CPU operand
    (``batch_sizes`` of a packed LSTM, cuDNN CTC's targets)."""
    graph = gm.graph
    copies: dict[tuple[torch.fx.Node, torch.device], torch.fx.Node] = {}
    names = (f"_coil_moved_constant{i}" for i in itertools.count())
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target in _MOVERS:
            continue
        devices = _devices(node.meta.get("val"))
        if len(devices) != 1:
            continue
        (device,) = devices
        foreign = [(arg, val) for arg in node.all_input_nodes
                   if isinstance(val := arg.meta.get("val"), torch.Tensor) and val.device != device]
        if not foreign or not generated(node, device):  # asked only where an operand is foreign
            continue
        for arg, val in foreign:
            moved = copies.get((arg, device))
            if moved is None:
                moved = copies[(arg, device)] = _moved(gm, arg, device, val, names)
            node.replace_input_with(arg, moved)
            replaced += 1
    for arg in {arg for arg, _ in copies}:
        _erase_if_unused(graph, arg)
    if replaced:
        graph.lint()
        gm.recompile()
    return replaced


def _erase_if_unused(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """Drop a constant's read (``get_attr``, ``lift_fresh_copy``) that nothing uses any more."""
    if node.users or _constant_source(node) is None:
        return
    inputs = node.all_input_nodes
    graph.erase_node(node)
    for n in inputs:
        _erase_if_unused(graph, n)


def _moved(gm: torch.fx.GraphModule, arg: torch.fx.Node, device: torch.device, val: torch.Tensor,
           names: Any) -> torch.fx.Node:
    source = _constant_source(arg)
    if source is not None:
        constant = getattr(gm, str(source.target))
        name = next(names)
        while hasattr(gm, name):
            name = next(names)
        with unset_fake_temporarily():  # AOTAutograd calls the backend inside its fake mode
            gm.register_buffer(name, constant.to(device))
        with gm.graph.inserting_after(arg):
            moved = gm.graph.get_attr(name)
    else:
        with gm.graph.inserting_after(arg):
            moved = gm.graph.call_function(aten._to_copy.default, (arg,), {"device": device})
    moved.meta["val"] = _on(val, device)
    return moved
