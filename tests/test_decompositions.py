"""Coil's decomposition table against the ops it replaces, output by output.

A decomposed forward op whose backward stays an ATen kernel hands that kernel the
decomposition's saved outputs (mean, rstd, log-sum-exp, buffers); a decomposition that returns
something else in a secondary output gives wrong gradients with no error. Each multi-output
op the table decomposes and a model uses is checked here on every output."""
from __future__ import annotations

import pytest
import torch

import functools

from coil.decompositions import core_table, table

aten = torch.ops.aten


def _cases():
    torch.manual_seed(0)
    x4 = torch.randn(2, 6, 5, 5)
    w6, b6 = torch.randn(6), torch.randn(6)
    x3 = torch.randn(3, 4, 8)
    target = torch.randint(0, 8, (3,))
    yield aten.native_layer_norm.default, (x3, [8], torch.randn(8), torch.randn(8), 1e-5)
    yield aten.native_group_norm.default, (x4, w6, b6, 2, 6, 25, 3, 1e-5)
    yield aten.native_batch_norm.default, (x4, w6, b6, torch.zeros(6), torch.ones(6), True, 0.1, 1e-5)
    yield aten._native_batch_norm_legit_functional.default, (x4, w6, b6, torch.zeros(6), torch.ones(6), True, 0.1, 1e-5)
    yield aten._native_batch_norm_legit_no_training.default, (x4, w6, b6, torch.randn(6), torch.rand(6) + 0.5, 0.1, 1e-5)
    yield aten._fused_rms_norm.default, (x3, [8], torch.randn(8), 1e-6)
    yield aten.nll_loss_forward.default, (torch.randn(3, 8).log_softmax(-1), target, None, 1, -100)
    yield aten.log_sigmoid_forward.default, (torch.randn(4, 5),)
    yield aten.var_mean.correction, (x3, [1]), {"correction": 1}
    yield aten._softmax.default, (x3 * 4, -1, False)
    yield aten._softmax.default, (x4.double(), 1, False)
    yield aten._scaled_dot_product_attention_math.default, (torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8))


def _ids():
    return [str(c[0]) for c in _cases()]


@pytest.mark.parametrize("case", list(_cases()), ids=_ids())
def test_decomposition_matches_the_op_on_every_output(case):
    op, args, kwargs = (*case, {})[:3]
    decomp = table().get(op)
    if decomp is None:
        pytest.skip(f"{op} is not decomposed by Coil")
    expected = op(*args, **kwargs)
    got = decomp(*args, **kwargs)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        if e is None or (isinstance(e, torch.Tensor) and e.numel() == 0):
            continue
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5, msg=f"{op} output {i}")


def test_attention_forward_is_never_decomposed():
    """Its backward reads the forward's log-sum-exp; the decomposition returns the weights."""
    assert aten._scaled_dot_product_flash_attention_for_cpu.default not in table()


def _same_decomposition(a, b) -> bool:
    """One function, or the same composite-implicit wrapper (a closure made per lookup)."""
    if a is b:
        return True
    return (isinstance(a, functools.partial) and isinstance(b, functools.partial)
            and a.func.__code__ is b.func.__code__ and a.args == b.args and a.keywords == b.keywords)


def test_core_table_is_pytorchs_core_aten_table(tmp_path):
    """Coil's build of the core-ATen table has PyTorch's entries, op for op: walking the
    ops, writing their list, and reading it back in a later call."""
    from torch._decomp import core_aten_decompositions
    slow = dict(core_aten_decompositions())
    for fast in (core_table(None), core_table(str(tmp_path)), core_table(str(tmp_path))):
        assert set(fast) == set(slow)
        differ = [op for op in slow if not _same_decomposition(fast[op], slow[op])]
        assert not differ, differ[:5]
    assert len(list(tmp_path.glob("cia-*.json"))) == 1


def test_cia_list_is_walked_again_when_unreadable(tmp_path):
    from coil import cia_ops
    first = cia_ops.cia_ops(str(tmp_path))
    (path,) = tmp_path.glob("cia-*.json")
    path.write_text('[["aten", "no_such_op", "default"]]')
    assert cia_ops.cia_ops(str(tmp_path)) == first  # a name that does not resolve: walked


def test_softmax_multiplies_by_the_reciprocal_and_keeps_empty_inputs_whole():
    """ATen's CPU softmax multiplies by the row sum's reciprocal; empty inputs are PyTorch's."""
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda x: aten._softmax.default(x, -1, False),
                 decomposition_table=table())(torch.randn(3, 5))
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.reciprocal.default in targets and aten.div.Tensor not in targets
    assert table()[aten._softmax.default](torch.randn(0, 4), -1, False) is NotImplemented


def _exact(fn, *args, **options):
    torch._dynamo.reset()
    from coil import config
    with config.override(**options):
        got = torch.compile(fn, backend="coil")(*args)
    want = fn(*args)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    torch._dynamo.reset()


@pytest.mark.parametrize("templates", ["auto", "force"])
def test_addmm_with_alpha_zero_skips_the_product(templates):
    """Eager's library skips the product when ``alpha`` is 0: an inf in it made NaN rows when
    the product was computed and multiplied by 0 (a hunt, session 37)."""
    torch.manual_seed(0)
    bias, a, b = torch.randn(17), torch.randn(33, 129), torch.randn(129, 17)
    a[3, 5] = float("inf")
    _exact(lambda bias, a, b: torch.relu(torch.addmm(bias, a, b, alpha=0)), bias, a, b, templates=templates)
    _exact(lambda s, x, y: torch.baddbmm(s, x, y, alpha=0, beta=0.5), torch.randn(2, 33, 17),
           a.expand(2, 33, 129), b.expand(2, 129, 17), templates=templates)


def test_scaled_and_half_precision_products_round_once_as_the_library():
    """``beta * self + alpha * (a @ b)`` decomposed rounds the product, its scaling and the
    sum apart: BLOOM's ``baddbmm(alibi, q, k.mT, alpha=0.125)`` under bf16 autocast differed
    from eager in 4703 of 16384 elements, a bf16 ``addmm`` with a 2-D bias by up to 2 ulps;
    these stay the library's call."""
    torch.manual_seed(0)
    q, k, alibi = torch.randn(4, 64, 32), torch.randn(4, 64, 32), torch.randn(4, 64, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _exact(lambda s, q, k: torch.baddbmm(s, q, k.mT, alpha=0.125), alibi, q, k)
    x, w, r = (torch.randn(64, 64).bfloat16() for _ in range(3))
    _exact(lambda r, x, w: torch.addmm(r, x, w), r, x, w)
    x, w, r = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 64)
    _exact(lambda r, x, w: torch.addmm(r, x, w, alpha=0.37, beta=1.3), r, x, w)
