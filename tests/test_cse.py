"""Coil's common-subexpression pass on joint graphs (coil.cse), which stands in for the
partitioner's own: what it merges, what it must leave apart, and that it merges as much as
torch's pass on real models' joint graphs."""
from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil.cse import eliminate_common_subexpressions

aten = torch.ops.aten


def _graph(fn, *args):
    return make_fx(fn)(*args)


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def _check_same_result(fn, *args):
    gm = _graph(fn, *args)
    expected = gm(*args)
    eliminate_common_subexpressions(gm)
    torch.testing.assert_close(gm(*args), expected)
    return gm


def test_repeated_pure_calls_are_merged():
    def f(x, y):
        a = torch.sin(x) * y
        b = torch.sin(x) * y
        return a + b, torch.cos(x) + torch.cos(x)

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    gm = _graph(f, x, y)
    assert len(_calls(gm, aten.sin.default)) == 2
    expected = gm(x, y)
    assert eliminate_common_subexpressions(gm) == 3  # a sin, a mul, a cos
    assert len(_calls(gm, aten.sin.default)) == 1 and len(_calls(gm, aten.cos.default)) == 1
    torch.testing.assert_close(gm(x, y), expected)


def test_random_and_empty_calls_stay_apart():
    def f(x):
        return torch.rand_like(x) + torch.rand_like(x), torch.bernoulli(x) - torch.bernoulli(x), \
            torch.empty_like(x).fill_(1) + torch.empty_like(x).fill_(2)

    gm = _graph(f, torch.rand(8))
    eliminate_common_subexpressions(gm)
    assert len(_calls(gm, aten.rand_like.default)) == 2
    assert len(_calls(gm, aten.bernoulli.default)) == 2
    assert len(_calls(gm, aten.empty_like.default)) == 2


def test_nothing_is_merged_across_a_mutation():
    def f(x, buf):
        a = buf * 2
        buf.add_(1)  # what buf * 2 reads changes here
        b = buf * 2
        return x + a, x + b

    x, buf = torch.randn(4), torch.randn(4)
    gm = _graph(f, x, buf.clone())
    eliminate_common_subexpressions(gm)
    assert len(_calls(gm, aten.mul.Tensor)) == 2
    got = gm(x, buf.clone())
    ref = f(x, buf.clone())
    torch.testing.assert_close(got, ref)


def test_a_graph_that_writes_into_its_own_values_is_left_alone():
    def f(x):
        a = torch.zeros(4)
        b = torch.zeros(4)  # equal to a, but a is written below and b must stay zero
        a.add_(x)
        return a, b + 1

    x = torch.randn(4)
    gm = _graph(f, x)
    assert eliminate_common_subexpressions(gm) == 0
    assert len(_calls(gm, aten.zeros.default)) == 2
    torch.testing.assert_close(gm(x)[1], torch.ones(4))


def test_writes_into_graph_inputs_only_are_barriers_not_a_stop():
    def f(x, buf):
        buf.mul_(2)  # an input mutation, as a functionalized graph's epilogue has
        return torch.sin(x) + torch.sin(x)

    gm = _check_same_result(f, torch.randn(4), torch.randn(4))
    assert len(_calls(gm, aten.sin.default)) == 1


def test_constants_compare_by_type_and_sign():
    def f(x):
        return aten.add.Tensor(x, 1), aten.add.Tensor(x, 1.0), aten.mul.Tensor(x, 0.0), aten.mul.Tensor(x, -0.0)

    gm = _graph(f, torch.ones(3))
    assert eliminate_common_subexpressions(gm) == 0


def test_outputs_that_alias_stay_separate_tensors():
    def f(x):
        return x.view(2, 3), x.view(2, 3)

    gm = _graph(f, torch.randn(6))
    eliminate_common_subexpressions(gm)
    assert len(_calls(gm, aten.view.default)) == 2
    a, b = gm(torch.randn(6))
    assert a is not b


def test_other_namespaces_are_barriers():
    lib = torch.library.Library("coil_cse_test", "FRAGMENT")  # noqa: F841  (kept alive)
    lib.define("touch(Tensor x) -> Tensor")
    lib.impl("touch", lambda x: x.clone(), "CompositeExplicitAutograd")

    def f(x):
        a = torch.sin(x)
        t = torch.ops.coil_cse_test.touch(x)  # a custom op may have effects Coil cannot see
        b = torch.sin(x)
        return a + b + t

    gm = _check_same_result(f, torch.randn(5))
    assert len(_calls(gm, aten.sin.default)) == 2


def _joint_graphs_of_a_training_step():
    """The joint graphs AOTAutograd hands the partitioner for a small transformer block, traced
    with Coil's decompositions."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from coil.decompositions import table

    joints = []

    def partition(joint, *args, **kwargs):
        joints.append(copy.deepcopy(joint))
        return min_cut_rematerialization_partition(joint, *args, **kwargs)

    def backend(gm, inputs):
        from functorch.compile import make_boxed_func
        return aot_module_simplified(gm, inputs, fw_compiler=lambda g, _: make_boxed_func(g),
                                     partition_fn=partition, decompositions=table())

    block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    out = torch.compile(block, backend=backend)(torch.randn(2, 6, 32))
    out.sum().backward()
    return joints


def test_merges_what_torchs_own_pass_merges():
    from torch._functorch.compile_utils import fx_graph_cse

    joints = _joint_graphs_of_a_training_step()
    merged = []
    for joint in joints:
        nodes = len(joint.graph.nodes)
        theirs = nodes - len(fx_graph_cse(copy.deepcopy(joint).graph).nodes)
        assert eliminate_common_subexpressions(copy.deepcopy(joint)) == theirs
        merged.append(theirs)
    assert sum(merged) > 0, merged  # the block's joint graph repeats work (Coil's decompositions)


def test_a_training_compile_imports_no_inductor():
    code = textwrap.dedent("""
        import sys, torch, coil
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
        x = torch.randn(3, 8)
        out = torch.compile(model, backend="coil")(x)
        out.sum().backward()
        print(sorted(m for m in sys.modules if m.startswith("torch._inductor.pattern_matcher")
                     or m.startswith("torch._inductor.lowering")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_an_inference_graph_is_merged_too():
    """Each SDPA call of a BERT layer converts the model's bool padding mask to a float bias
    anew: 12 identical [16, 1, 512, 512] masks, written in one 330 us kernel per call on the
    H100 (session 32), where one serves every layer."""
    import coil
    import torch.nn.functional as F

    def f(q, mask):
        out = q
        for _ in range(3):
            out = F.scaled_dot_product_attention(out, q, q, attn_mask=mask)
        return out

    q, mask = torch.randn(2, 4, 8, 16), torch.rand(2, 1, 8, 8) > 0.3
    mask[..., 0] = True
    torch._dynamo.reset()
    with torch.no_grad():
        report = coil.explain(f, q, mask)
    torch.testing.assert_close(report.result, f(q, mask))
    (graph,) = report.graphs
    masks = [line for line in graph.wrapper_source.splitlines() if "new_0((2, 1, 8, 8)" in line]
    assert len(masks) == 1, graph.wrapper_source
