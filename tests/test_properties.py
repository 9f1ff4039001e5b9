"""Property tests: random small programs of pointwise, reduction and view ops compiled by
Coil agree with eager; the memory planner never hands a live buffer to another."""
from __future__ import annotations

import sympy
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import coil
from coil import ir
from coil.kernel import Kernel
from coil.memory import plan_memory

UNARY = [torch.sin, torch.tanh, torch.abs, torch.neg, torch.relu, torch.sigmoid, lambda v: v * 0.5]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum]


@st.composite
def programs(draw):
    a, b = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    steps = draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 50), st.integers(0, 50)),
                          min_size=1, max_size=8))
    return a, b, steps


def run_program(x: torch.Tensor, bias: torch.Tensor, steps) -> tuple[torch.Tensor, ...]:
    values = [x]
    for kind, i, j in steps:
        v, w = values[i % len(values)], values[j % len(values)]
        if kind == 0:
            out = UNARY[i % len(UNARY)](v)
        elif kind == 1:
            out = BINARY[j % len(BINARY)](v, w)
        elif kind == 2:
            out = v - v.amax(-1, keepdim=True) if i % 2 else v / (v.abs().sum(-1, keepdim=True) + 1)
        elif kind == 3:
            out = v + bias
        elif kind == 4:
            out = v.t().reshape(v.shape[1], v.shape[0]).t() * 2
        elif kind == 5:
            out = torch.softmax(v, -1 if i % 2 else 0)
        else:
            out = v * v.mean(0, keepdim=True)
        values.append(out)
    return values[-1], values[len(values) // 2]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_eager(program):
    a, b, steps = program
    x, bias = torch.randn(a, b), torch.randn(b)
    expected = run_program(x, bias, steps)
    torch._dynamo.reset()
    report = coil.explain(lambda x, bias: run_program(x, bias, steps), x, bias)
    torch.testing.assert_close(report.result, expected, atol=1e-5, rtol=1e-4)
    assert not report.fallbacks


def _kernel(name: str, reads: list[str], writes: list[str]) -> Kernel:
    return Kernel(name, (), (), [], [], reads, writes, set(), [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 30), max_size=3), st.integers(1, 3)),
                min_size=1, max_size=12),
       st.sets(st.integers(0, 11), max_size=3))
def test_planner_never_reuses_a_live_buffer(spec, kept):
    buffers = {"arg0": ir.Buffer("arg0", _layout(4))}
    steps = []
    for i, (reads, size) in enumerate(spec):
        name = f"buf{i}"
        buffers[name] = ir.Buffer(name, _layout(size * 4))
        sources = ["arg0"] + [f"buf{j}" for j in range(i)]
        steps.append(_kernel(f"k{i}", sorted({sources[r % len(sources)] for r in reads}), [name]))
    keep = {f"buf{k}" for k in kept if k < len(spec)}
    plan = plan_memory(steps, buffers, keep, {"arg0"}, lambda e: int(e))
    last_use = {}
    for i, step in enumerate(steps):
        for name in step.inputs + step.outputs:
            last_use[name] = i
    # the wrapper's view: a name must exist (not deleted) whenever it is used or taken over
    deleted: set[str] = set()
    for i, step in enumerate(steps):
        for alloc in plan.allocs[i]:
            assert alloc.reuse is None or alloc.reuse not in deleted
        assert not (set(step.inputs) | set(step.outputs)) & deleted
        deleted |= set(plan.frees[i])
    owner = {}
    for i, allocs in enumerate(plan.allocs):
        for alloc in allocs:
            if alloc.reuse:
                donor = owner.get(alloc.reuse, alloc.reuse)
                assert donor not in keep and donor != "arg0"
                assert last_use[alloc.reuse] < i, "reused a buffer still in use"
                assert buffers[alloc.reuse].layout.storage_span() == alloc.layout.storage_span()
                last_use[alloc.reuse] = max(last_use.get(alloc.name, i), i)
                owner[alloc.name] = donor
    assert plan.peak_bytes >= max(int(b.layout.storage_span()) * 4 for b in buffers.values() if b.name != "arg0")


def _layout(n: int) -> ir.Layout:
    return ir.Layout(torch.float32, torch.device("cpu"), (sympy.Integer(n),), (sympy.Integer(1),))
