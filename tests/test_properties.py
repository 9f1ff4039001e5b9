"""Property tests: random small programs of pointwise, reduction and view ops compiled by
Coil agree with eager; the scheduler orders every read after its write and its fusion
never changes results; the memory planner never hands a live buffer to another."""
from __future__ import annotations

from unittest import mock

import sympy
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import coil
import coil.compile as compile_module  # the scheduler test watches its ``schedule``
from coil import ir, plugins
from coil.graph import LoweredGraph
from coil.kernel import Kernel
from coil.memory import plan_memory
from coil.scheduler import Schedule
from coil.sdk.reference import ReferenceBackend

UNARY = [torch.sin, torch.tanh, torch.abs, torch.neg, torch.relu, torch.sigmoid, lambda v: v * 0.5]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum]


@st.composite
def programs(draw, kinds: int = 7, max_size: int = 8):
    """Sizes (a, b) and steps (kind, i, j): step kinds below ``kinds`` (see :func:`_step` and
    :func:`run_graph`), over earlier values ``i`` and ``j``."""
    a, b = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    steps = draw(st.lists(st.tuples(st.integers(0, kinds - 1), st.integers(0, 50), st.integers(0, 50)),
                          min_size=1, max_size=max_size))
    return a, b, steps


def _step(kind: int, i: int, j: int, v: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One step of a random program: a (a, b) value from earlier ones ``v`` and ``w``."""
    if kind == 0:
        return UNARY[i % len(UNARY)](v)
    if kind == 1:
        return BINARY[j % len(BINARY)](v, w)
    if kind == 2:
        return v - v.amax(-1, keepdim=True) if i % 2 else v / (v.abs().sum(-1, keepdim=True) + 1)
    if kind == 3:
        return v + bias
    if kind == 4:
        return v.t().reshape(v.shape[1], v.shape[0]).t() * 2
    if kind == 5:
        return torch.softmax(v, -1 if i % 2 else 0)
    return v * v.mean(0, keepdim=True)


def run_program(x: torch.Tensor, bias: torch.Tensor, steps) -> tuple[torch.Tensor, ...]:
    values = [x]
    for kind, i, j in steps:
        values.append(_step(kind, i, j, values[i % len(values)], values[j % len(values)], bias))
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


def run_graph(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor, steps) -> tuple[torch.Tensor, ...]:
    """A random program with three more kinds of step: a matmul (an ATen call between
    kernels), a cumulative sum (a scan kernel) and a normalisation by a variance (Welford's
    two-output reduction)."""
    values = [x]
    for kind, i, j in steps:
        v, w = values[i % len(values)], values[j % len(values)]
        if kind == 7:
            out = v @ weight
        elif kind == 8:
            out = v.cumsum(i % 2)
        elif kind == 9:
            out = (v - v.mean(-1, keepdim=True)) / (v.var(-1, keepdim=True, correction=0) + 1)
        else:
            out = _step(kind, i, j, v, w, bias)
        values.append(out)
    return values[-1], values[len(values) // 2], values[1]


def _compiled(fn, args, **knobs) -> tuple[object, list[Schedule]]:
    """``fn(*args)`` compiled by Coil with the reference executor (:mod:`coil.sdk.reference`,
    the kernel IR's definition: what it computes is what the scheduler's kernels mean, with
    no code generator in between), and each graph's schedule, checked by :func:`_check_order`
    as it is made (a failure fails the compile, with the check's message)."""
    seen: list[Schedule] = []
    real = compile_module.schedule

    def recording(lowered, policies, **kwargs):
        sched = real(lowered, policies, **kwargs)
        _check_order(lowered, sched)
        seen.append(sched)
        return sched
    plugins.reset()
    coil.register_backend_for_device("cpu", ReferenceBackend(), name="scheduler-properties")
    try:
        with mock.patch.object(compile_module, "schedule", recording), \
                coil.config.override(graph_cache=False, **knobs):
            result = coil.explain(fn, *args).result
    finally:
        plugins.reset()
    return result, seen


def _check_order(lowered: LoweredGraph, sched: Schedule) -> None:
    """Every step reads only buffers the graph's inputs or earlier steps provide (so the
    steps' dependencies have no cycle), each IR node runs in one step, every graph output
    is written, and inside each kernel every read follows its write."""
    def storage(name: str) -> str:
        buf = lowered.buffers.get(name)
        return buf.storage if buf is not None and buf.storage else name
    ready = {i.name for i in lowered.inputs if i.name} | set(lowered.constants)
    placed: set[int] = set()
    for step in sched.steps:
        if isinstance(step, Kernel):
            nodes = [kn.node for kn in step.nodes] + [n for n in (step.special,) if n is not None]
            reads, writes, name = set(step.inputs), set(step.outputs), step.name
            _check_kernel_order(step)
        else:  # an ATen call
            nodes = [step]
            reads = {storage(n) for n in step.reads()}
            writes, name = {storage(n) for n in step.outputs()}, step.name
        for node in nodes:
            assert id(node) not in placed, f"{node.name} is in two steps"
            placed.add(id(node))
        assert reads <= ready, f"{name} reads {sorted(reads - ready)} before a step writes them"
        ready |= writes
    outputs = {storage(o.name) for o in lowered.outputs if o.name}
    assert outputs <= ready, f"graph outputs {sorted(outputs - ready)} never written"


def _check_kernel_order(k: Kernel) -> None:
    """A node reads a buffer another node of the kernel writes only after that node, and a
    reduction's result only in a later loop (the result is final when its loop ends)."""
    writer = {b: (li, ni) for li, loop in enumerate(k.loops) for ni, kn in enumerate(loop.nodes)
              for b in (*kn.stores, *kn.node.outputs())}
    reductions = {b for loop in k.loops for kn in loop.nodes if kn.is_reduction
                  for b in (*kn.stores, *kn.node.outputs())}
    for li, loop in enumerate(k.loops):
        for ni, kn in enumerate(loop.nodes):
            for ld in ir.loads(kn.body):
                at = writer.get(ld.buffer)
                if at is None or at == (li, ni):  # read from memory, or a mutation's old value
                    continue
                assert at < (li, ni), f"{k.name}: {kn.node.name} reads {ld.buffer} before it is written"
                assert ld.buffer not in reductions or at[0] < li, (
                    f"{k.name}: {kn.node.name} reads reduction {ld.buffer} in the loop computing it")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(kinds=10, max_size=10))
def test_scheduler_orders_reads_after_writes_and_fusion_keeps_results(program):
    """Random graphs of kernels, ATen calls and scans, compiled with fusion (the default) and
    without (``max_fusion_size=1``: one IR node per kernel): both schedules are in dependency
    order (:func:`_check_order`), and both compute what eager does."""
    a, b, steps = program
    args = (torch.randn(a, b), torch.randn(b), torch.randn(b, b))
    expected = run_graph(*args, steps)

    def fn(x, bias, weight):
        return run_graph(x, bias, weight, steps)
    fused, fused_schedules = _compiled(fn, args)
    unfused, unfused_schedules = _compiled(fn, args, max_fusion_size=1)
    assert fused_schedules and unfused_schedules, "no graph reached Coil's scheduler"
    for sched in unfused_schedules:
        assert all(len(k.nodes) <= 1 for k in sched.steps if isinstance(k, Kernel))
        assert not any(d.fused for d in sched.decisions)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(unfused, expected, atol=1e-5, rtol=1e-4)


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
