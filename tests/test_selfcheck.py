"""Self-check mode (``coil.selfcheck``) and repro scripts (``coil.repro``): a deliberately wrong
lowering is caught and named, its repro script re-creates the mismatch (``coil repro FILE`` in a
subprocess), and correct graphs pass: a training step, a graph that mutates an input, symbolic
sizes."""
from __future__ import annotations

import copy
import logging
import operator
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import coil
from coil import plugins, repro, repro_writer, selfcheck
from coil.errors import CheckError
from coil.lowering import GENERIC

aten = torch.ops.aten


@pytest.fixture
def wrong_lowering(monkeypatch):
    """``wrong_lowering(op, like)``: lower ``op`` as ``like`` (a wrong result, no error) for
    the rest of the test, as a plugin's lowering override would."""
    reg = plugins.registry()
    monkeypatch.setattr(reg, "lowerings", list(reg.lowerings))

    def install(op, like):
        reg.lowerings.append((op, GENERIC.lookup(like, None), None))

    return install


@pytest.fixture
def checking(tmp_path):
    """Self-check mode on, repro scripts under ``tmp_path/repro``."""
    with coil.config.override(check=True, debug_dir=str(tmp_path)):
        yield tmp_path / "repro"


@pytest.fixture
def compared(monkeypatch):
    """Counts the values the self-check compares (proof that it ran)."""
    calls = []
    real = selfcheck.compare

    def counting(actual, expected):
        calls.append(type(expected).__name__)
        return real(actual, expected)

    monkeypatch.setattr(selfcheck, "compare", counting)
    return calls


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COIL_CHECK", None)
    env.pop("COIL_DEBUG_DIR", None)
    return env


def test_wrong_kernel_is_caught_named_and_reproduced(wrong_lowering, tmp_path):
    wrong_lowering(aten.sin.default, aten.cos.default)

    def f(x, y):
        return (x.sin() * 2 + y).relu(), y.sum()

    x, y = torch.randn(4, 8), torch.randn(8)
    compiled = torch.compile(f, backend="coil", options={"check": True, "debug_dir": str(tmp_path)})
    with pytest.raises(CheckError) as info:
        compiled(x, y)
    err = info.value
    assert err.output == 0 and err.max_abs > 0.1
    assert err.producer.startswith("kernel k") and "aten.sin.default" in err.producer
    assert err.producer.split()[1] in str(err)  # the kernel's name is in the message
    path = Path(err.repro_path)
    assert path.parent == tmp_path / "repro" and path.exists()
    assert "torch.ops.aten.sin.default" in path.read_text()

    # `coil repro FILE` in a fresh process: no mismatch with Coil as it is, then the mismatch,
    # named, once the same wrong lowering is installed (with the saved and with random inputs)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent("""
        import sys, torch
        from coil import plugins
        from coil.cli import main
        from coil.lowering import GENERIC
        aten = torch.ops.aten
        codes = [main(["repro", sys.argv[1]])]
        plugins.registry().lowerings.append((aten.sin.default, GENERIC.lookup(aten.cos.default, None), None))
        codes += [main(["repro", sys.argv[1]]), main(["repro", sys.argv[1], "--random", "--seed", "3"])]
        sys.exit(int("".join(map(str, codes)), 2))
    """))
    out = subprocess.run([sys.executable, str(driver), str(path)], capture_output=True, text=True,
                         timeout=300, env=_subprocess_env())
    assert out.returncode == 0b011, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and lines[0] == "no mismatch", out.stdout
    assert all(line.startswith("mismatch: output 0") and "aten.sin.default" in line for line in lines[1:3])


def test_env_variable_turns_it_on_and_repros_default_to_the_cwd(wrong_lowering, monkeypatch, tmp_path):
    wrong_lowering(aten.exp.default, aten.expm1.default)
    monkeypatch.setenv("COIL_CHECK", "1")
    monkeypatch.delenv("COIL_DEBUG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    coil.config.reload_from_env()
    try:
        with pytest.raises(CheckError, match="aten.exp.default") as info:
            torch.compile(lambda x: x.exp() + 1, backend="coil")(torch.randn(16))
    finally:
        monkeypatch.delenv("COIL_CHECK")
        coil.config.reload_from_env()
    assert Path(info.value.repro_path).parent == tmp_path / "coil-repro"


def test_correct_training_step_passes(checking, compared):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.GELU(),
                                torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="coil")
    x = torch.randn(6, 8)
    compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)  # mutated inputs
    # forward outputs, backward outputs (one gradient per parameter) and inputs were compared
    assert compared.count("Tensor") > 2 * len(list(model.parameters()))
    assert not checking.exists()  # nothing differed, no repro


def test_mismatch_in_backward_is_named(wrong_lowering, checking):
    wrong_lowering(aten.le.Scalar, aten.ge.Scalar)  # ReLU's backward mask
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    loss = torch.compile(model, backend="coil")(torch.randn(4, 8)).square().mean()
    with pytest.raises(CheckError) as info:
        loss.backward()
    assert "aten.le.Scalar" in info.value.producer
    assert "_backward_" in Path(info.value.repro_path).name


def test_input_mutation_is_checked(wrong_lowering, checking, compared):
    def f(x, acc):
        acc.mul_(x)
        return x + 2

    x, acc = torch.randn(5), torch.full((5,), 3.0)
    torch.compile(f, backend="coil")(x, acc)
    torch.testing.assert_close(acc, 3 * x)
    assert compared  # ran

    torch._dynamo.reset()
    wrong_lowering(aten.mul.Tensor, aten.div.Tensor)
    with pytest.raises(CheckError) as info:
        torch.compile(f, backend="coil")(x, torch.full((5,), 3.0))
    err = info.value
    assert "mutated in place" in err.what
    # the kernel that writes the input (its ATen ops leave out the inlined mul for now)
    assert err.producer.startswith("kernel k") and "aten.copy_.default" in err.producer


def test_random_graphs_are_skipped_with_a_note(checking, compared, caplog):
    with caplog.at_level(logging.INFO, logger="coil.selfcheck"):
        out = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5) + 1, backend="coil")(torch.ones(64))
    assert out.shape == (64,) and not compared
    assert "draws random numbers" in caplog.text and "native_dropout" in caplog.text


def test_attention_without_dropout_is_checked(checking, compared, caplog):
    """Attention ops are tagged as random (their dropout), but with dropout 0 they are not."""
    q = torch.randn(2, 2, 5, 8, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="coil.selfcheck"):
        f = torch.compile(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True),
                          backend="coil")
        f(q).sum().backward()
    assert "draws random numbers" not in caplog.text
    assert len(compared) >= 3  # forward outputs, the gradient, the inputs


def test_outputs_without_meaning_are_not_compared():
    graph = torch.fx.Graph()
    q = graph.placeholder("q")
    empty = graph.call_function(aten.empty.memory_format, ([2],))
    attn = graph.call_function(aten._scaled_dot_product_efficient_attention.default, (q, q, q, None, True))
    outs = [graph.call_function(operator.getitem, (attn, i)) for i in range(4)]
    graph.output((empty, *outs))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert sorted(selfcheck.unchecked_outputs(gm)) == [0, 3, 4]  # empty, philox seed and offset
    assert selfcheck.random_ops(gm) == [] and selfcheck.seeded_ops(gm)


def test_off_costs_nothing(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("self-check code ran with check off")

    monkeypatch.setattr(selfcheck, "checked", never)
    monkeypatch.setattr(selfcheck, "reference_graph", never)
    out = torch.compile(lambda x: x.sin() + 1, backend="coil")(torch.zeros(3))
    torch.testing.assert_close(out, torch.ones(3))


def test_fallback_producer_is_named(checking, monkeypatch):
    def differs_at_0(actual, expected):
        return (1.0, 1.0, "forced") if expected.shape == (4, 2) else None

    monkeypatch.setattr(selfcheck, "compare", differs_at_0)
    with pytest.raises(CheckError) as info:
        torch.compile(lambda x: (torch.topk(x, 2).values, x * 2), backend="coil")(torch.randn(4, 6))
    assert info.value.producer == "the ATen fallback call aten.topk.default"


def test_compare_tolerances():
    x = torch.randn(100)
    assert selfcheck.compare(x, x * (1 + 1e-6)) is None
    assert selfcheck.compare(x, x + 1e-2) is not None
    nan = torch.tensor([float("nan"), float("inf"), 1.0])
    assert selfcheck.compare(nan, nan.clone()) is None
    assert selfcheck.compare(nan, torch.tensor([0.0, float("inf"), 1.0])) is not None
    assert selfcheck.compare(nan, torch.tensor([float("nan"), float("-inf"), 1.0])) is not None
    ints = torch.arange(10)
    assert selfcheck.compare(ints, ints + 0) is None and selfcheck.compare(ints, ints + 1) is not None
    bf = torch.randn(100).bfloat16()
    one_ulp = (bf.float() * (1 + 2**-8)).bfloat16()
    assert selfcheck.compare(one_ulp, bf) is None
    assert "shape" in selfcheck.compare(x, x[:10])[2]
    assert "dtype" in selfcheck.compare(x, x.double())[2]
    big = torch.randn(1000) * 1e4  # the absolute floor grows with the output's magnitude
    assert selfcheck.compare(big + 1e-2, big) is None


def test_repro_round_trip_symbolic_constants_indices(wrong_lowering, checking, monkeypatch):
    """A symbolic graph with a tensor constant, an index input and a transposed input: its
    repro replays the mismatch with saved and with random inputs, and passes once fixed."""
    monkeypatch.setattr(repro_writer, "SAVE_INPUTS_LIMIT", 1 << 20)
    wrong_lowering(aten.sin.default, aten.cos.default)
    table = torch.randn(10, 3)

    def f(x, idx):
        return (table[idx] * torch.tensor([1.0, 2.0, 3.0])).sin() + x.t()

    x, idx = torch.randn(3, 7), torch.randint(0, 10, (7,))
    compiled = torch.compile(f, backend="coil", dynamic=True)
    with pytest.raises(CheckError) as info:
        compiled(x, idx)
    path = info.value.repro_path
    text = Path(path).read_text()
    assert "'symbolic': {'size'" in text and "'low': " in text
    first = repro.replay(path)
    assert first is not None and "aten.sin.default" in first.producer
    assert first.max_abs == pytest.approx(info.value.max_abs)  # the saved inputs
    assert repro.replay(path, use_saved=False, seed=1) is not None
    plugins.registry().lowerings.pop()  # the "fix"
    assert repro.replay(path) is None
    assert repro.replay(path, use_saved=False) is None
