"""The layer before AOTAutograd for training graphs (``coil.aot_training``): a training graph
compiled once is loaded by a later compile without AOTAutograd's trace, in the
``autograd.Function`` torch rebuilds from the kept metadata, and gives eager's outputs and
gradients; input mutations, aliased and non-differentiable outputs, random ops, donated
buffers and a second backward behave on a hit as on the first compile; each part of the
key that AOTAutograd reads misses when it changes."""
from __future__ import annotations

import pickle
import textwrap
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from coil import aot_cache, aot_training, config, plugins
from coil.sdk.diskcache import DiskCache
from helpers import dynamo_graph, processes_in_turn

pytestmark = pytest.mark.graph_cache


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path) -> Any:
    with config.override(cache_dir=str(tmp_path)):
        yield


def _entries() -> list[Any]:
    folder = DiskCache.in_namespace(aot_cache.NAMESPACE, fanout=True).folder
    found = []
    for path in folder.rglob(f"*{aot_cache.SUFFIX}"):
        found.append(pickle.loads(path.read_bytes())["entry"])
    return [e for e in found if isinstance(e, aot_training.Entry)]


def _run(fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]], *, backward: Callable[[Any], Any]) -> Any:
    """``fn`` on fresh arguments, its backward run by ``backward(outputs)``; returns the
    outputs (detached) and the leaf inputs' gradients."""
    args = list(make_args())
    out = fn(*args)
    backward(out)
    outs = out if isinstance(out, tuple) else (out,)
    return ([o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs],
            [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad],
            args)


def _miss_then_hit(fn: Callable[..., Any], make_args: Callable[[], Sequence[Any]], traces: list[int], *,
                   backward: Callable[[Any], Any] = lambda out: out.sum().backward(),
                   seed: int | None = None, close: dict[str, float] | None = None) -> tuple[Any, Any, Any]:
    """Eager, Coil's first compile (a miss: one trace, one entry) and Coil's compile after
    Dynamo forgets it (a hit: no trace); outputs and gradients of the three."""
    results = []
    for compiled in (False, True, True):
        torch._dynamo.reset()
        if seed is not None:
            torch.manual_seed(seed)
        f = torch.compile(fn, backend="coil") if compiled else fn
        results.append(_run(f, make_args, backward=backward))
    assert len(traces) == 1, f"{len(traces)} AOTAutograd traces (the second compile should hit)"
    assert len(_entries()) == 1
    ref, miss, hit = results
    for got in (miss, hit):
        for a, b in zip(got[0] + got[1], ref[0] + ref[1]):
            torch.testing.assert_close(a, b, **(close or {}))
    return ref, miss, hit


def test_an_mlp_training_step_is_loaded_without_aotautograd(traces: list[int]) -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    grads = []
    for compiled in (False, True, True):
        torch._dynamo.reset()
        mlp.zero_grad()
        f = torch.compile(mlp, backend="coil") if compiled else mlp
        F.mse_loss(f(x), torch.ones(4, 8)).backward()
        grads.append([p.grad.clone() for p in mlp.parameters()])
    assert len(traces) == 1 and len(_entries()) == 1
    for got in grads[1:]:
        for a, b in zip(got, grads[0]):
            torch.testing.assert_close(a, b)


def test_batch_norm_running_stats_are_updated_on_a_hit(traces: list[int]) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 4, 5, 5)
    stats = []
    for compiled in (False, True, True):
        torch._dynamo.reset()
        torch.manual_seed(1)
        net = nn.Sequential(nn.Conv2d(4, 6, 3), nn.BatchNorm2d(6), nn.ReLU()).train()
        f = torch.compile(net, backend="coil") if compiled else net
        f(x).sum().backward()
        bn = net[1]
        stats.append((bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked),
                      net[0].weight.grad.clone()))
    assert len(traces) == 1
    for got in stats[1:]:
        torch.testing.assert_close(got[0], stats[0][0])
        torch.testing.assert_close(got[1], stats[0][1])
        assert got[2] == stats[0][2] == 1
        torch.testing.assert_close(got[3], stats[0][3], rtol=1e-4, atol=1e-4)


def _mutate_and_alias(x: torch.Tensor, w: torch.Tensor, buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    buf.add_(1)  # a mutation of an input that does not require grad
    y = x * w
    return y, y.view(-1), w.t(), (x * 3).argmax(-1)  # an alias of an output, of an input; an integer output


def test_mutations_aliases_and_integer_outputs_behave_as_on_the_first_compile(traces: list[int]) -> None:
    torch.manual_seed(0)
    x0, w0 = torch.randn(3, 4), torch.randn(3, 4)
    bufs = []

    def make() -> list[torch.Tensor]:
        buf = torch.zeros(2)
        bufs.append(buf)
        return [x0.clone().requires_grad_(), w0.clone().requires_grad_(), buf]

    def backward(out: tuple[torch.Tensor, ...]) -> None:
        (out[0].sum() + out[1].square().sum() + out[2].sum()).backward()

    ref, miss, hit = _miss_then_hit(_mutate_and_alias, make, traces, backward=backward)
    assert all(torch.equal(b, torch.ones(2)) for b in bufs)
    for got in (miss, hit):
        y, flat, wt, idx = got[0]
        assert idx.dtype == torch.int64 and not idx.requires_grad
        torch.testing.assert_close(flat, y.reshape(-1))
    x, w = hit[2][0], hit[2][1]
    out = torch.compile(_mutate_and_alias, backend="coil")(x.detach().requires_grad_(), w, torch.zeros(2))
    assert out[2]._base is w or out[2].data_ptr() == w.data_ptr()  # still a view of the input


def _dropout_block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.dropout(torch.tanh(x @ w), p=0.3, training=True) * 2


def test_random_ops_give_the_same_masks_on_a_hit_as_on_the_first_compile(traces: list[int]) -> None:
    torch.manual_seed(0)
    x0, w0 = torch.randn(16, 32), torch.randn(32, 32)

    def make() -> list[torch.Tensor]:
        return [x0.clone().requires_grad_(), w0.clone().requires_grad_()]

    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        torch.manual_seed(5)
        outs.append(_run(torch.compile(_dropout_block, backend="coil"), make, backward=lambda o: o.sum().backward()))
    assert len(traces) == 1 and len(_entries()) == 1
    miss, hit = outs
    torch.testing.assert_close(hit[0][0], miss[0][0], rtol=0, atol=0)
    torch.testing.assert_close(hit[1][1], miss[1][1], rtol=0, atol=0)
    mask = hit[0][0] != 0
    assert 0.6 < mask.float().mean().item() < 0.8  # about 1 - p of the elements kept
    x, w = make()  # eager with the same mask: the same output and gradients
    (torch.tanh(x @ w) * mask / 0.7 * 2).sum().backward()
    torch.testing.assert_close(hit[0][0], (torch.tanh(x0 @ w0) * mask / 0.7 * 2))
    torch.testing.assert_close(hit[1][0], x.grad)
    torch.testing.assert_close(hit[1][1], w.grad)


def test_a_second_backward_fails_or_passes_as_on_the_first_compile(traces: list[int]) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * x).sum()

    x0 = torch.randn(8)
    outcomes = []
    for _ in range(2):
        torch._dynamo.reset()
        x = x0.clone().requires_grad_()
        loss = torch.compile(fn, backend="coil")(x)
        loss.backward(retain_graph=True)
        try:
            loss.backward()
            outcomes.append(("passed", x.grad.clone()))
        except RuntimeError as exc:
            outcomes.append(("failed", type(exc).__name__))
        try:
            torch.autograd.grad(torch.compile(fn, backend="coil")(x), x, create_graph=True)[0].sum().backward()
            outcomes.append("double backward ran")
        except RuntimeError as exc:
            outcomes.append(f"double backward: {str(exc)[:60]}")
    assert len(traces) == 1
    assert outcomes[0][0] == outcomes[2][0] and outcomes[1] == outcomes[3], outcomes
    if outcomes[0][0] == "passed":  # twice eager's gradient
        x = x0.clone().requires_grad_()
        fn(x).backward()
        torch.testing.assert_close(outcomes[0][1], 2 * x.grad)
        torch.testing.assert_close(outcomes[2][1], 2 * x.grad)


def test_donated_buffers_behave_on_a_hit_as_on_the_first_compile(traces: list[int]) -> None:
    """A backward compiled with donated saved buffers (the first backward kept no graph)
    refuses a later ``retain_graph=True`` after a hit as it does after the first compile."""
    def fn(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ((x @ w).sin() @ v).sum()

    torch.manual_seed(0)
    args0 = [torch.randn(8, 8) for _ in range(3)]
    outcomes = []
    for _ in range(2):
        torch._dynamo.reset()
        args = [a.clone().requires_grad_() for a in args0]
        f = torch.compile(fn, backend="coil")
        f(*args).backward()
        first = [a.grad.clone() for a in args]
        loss = f(*args)
        try:
            loss.backward(retain_graph=True)
            outcomes.append(("passed", first))
        except RuntimeError as exc:
            outcomes.append((str(exc)[:40], first))
    assert len(traces) == 1 and len(_entries()) == 1
    assert _entries()[0].fields["runtime_metadata"].bw_donated_idxs  # the saved buffers were donated
    assert outcomes[0][0] == outcomes[1][0] != "passed", outcomes
    ref = [a.clone().requires_grad_() for a in args0]
    fn(*ref).backward()
    for got in (outcomes[0][1], outcomes[1][1]):
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b.grad)


def test_autocast_training_is_loaded_with_its_casts(traces: list[int]) -> None:
    torch.manual_seed(0)
    x0, w0 = torch.randn(8, 16), torch.randn(16, 16)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).float().sum(-1)

    def make() -> list[torch.Tensor]:
        return [x0.clone().requires_grad_(), w0.clone().requires_grad_()]

    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(_run(torch.compile(fn, backend="coil"), make, backward=lambda o: o.sum().backward()))
    assert len(traces) == 1
    assert outs[1][1][0].dtype == torch.float32
    torch.testing.assert_close(outs[1][0][0], outs[0][0][0], rtol=0, atol=0)
    torch.testing.assert_close(outs[1][1][1], outs[0][1][1], rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            ref = fn(x0, w0)
    torch.testing.assert_close(outs[1][0][0], ref, rtol=2e-2, atol=2e-1)
    torch._dynamo.reset()
    _run(torch.compile(fn, backend="coil"), make, backward=lambda o: o.sum().backward())  # autocast off: a miss
    assert len(traces) == 2


def test_every_part_of_the_key_that_aotautograd_reads_misses_when_it_changes() -> None:
    reg = plugins.registry()
    cfg = config.get()

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).tanh()

    a, b = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    gm, inputs = dynamo_graph(fn, a, b)
    assert aot_training.refusal(gm, inputs, cfg) is None
    base = aot_training.key(gm, inputs, cfg, reg)
    assert base == aot_training.key(gm, inputs, cfg, reg)
    keys = {
        "requires_grad": aot_training.key(gm, [a, b.detach()], cfg, reg),
        "leaf": aot_training.key(gm, [a * 1, b], cfg, reg),
        "parameter": aot_training.key(gm, [nn.Parameter(a.detach()), b], cfg, reg),
    }
    with torch._functorch.config.patch(activation_memory_budget=0.5):
        keys["functorch config"] = aot_training.key(gm, inputs, cfg, reg)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        keys["autocast"] = aot_training.key(gm, inputs, cfg, reg)
    with config.override(max_fusion_size=7):
        keys["config"] = aot_training.key(gm, inputs, config.get(), reg)
    digests = {name: k.digest for name, k in keys.items()}
    assert base.digest not in digests.values(), digests
    assert len(set(digests.values())) == len(digests), digests
    inference = aot_cache.key(gm, inputs, cfg, reg)
    assert inference is not None and inference.digest != base.digest


def test_refusals() -> None:
    cfg = config.get()
    a = torch.randn(4, 4, requires_grad=True)
    gm, inputs = dynamo_graph(lambda x: x.sin() * 2, a)
    assert aot_training.refusal(gm, inputs, cfg) is None
    with torch.no_grad():
        assert "not a training graph" in aot_training.refusal(gm, inputs, cfg)
    assert "not a training graph" in aot_training.refusal(gm, [a.detach()], cfg)
    with config.override(graph_capture="on"):
        assert "graph capture" in aot_training.refusal(gm, inputs, config.get())
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert "saved-tensor hooks" in aot_training.refusal(gm, inputs, cfg)
    with config.override(graph_cache=False):
        assert "graph cache is off" in aot_training.refusal(gm, inputs, config.get())
    gm, inputs = dynamo_graph(lambda x, y: x + y, a, a[1])
    assert "share storage" in aot_training.refusal(gm, inputs, cfg)


def test_an_entry_whose_backward_is_gone_is_traced_again(traces: list[int]) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * x

    x = torch.randn(6, requires_grad=True)
    torch.compile(fn, backend="coil")(x).sum().backward()
    for path in DiskCache.in_namespace("graphs", fanout=True).folder.rglob("*.graph"):
        path.unlink()
    torch._dynamo.reset()
    y = x.detach().clone().requires_grad_()
    torch.compile(fn, backend="coil")(y).sum().backward()
    assert len(traces) == 2
    torch.testing.assert_close(y.grad, x.grad)


SECOND_PROCESS = textwrap.dedent("""
    import json
    import torch, torch.nn as nn, torch.nn.functional as F
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    step = torch.compile(lambda: F.mse_loss(mlp(x), y), backend="coil")
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = step()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_losses = []
    for _ in range(3):
        ref_opt.zero_grad()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        ref_opt.step()
        ref_losses.append(loss.item())
    err = max(abs(a - b) for a, b in zip(losses, ref_losses))
    print(json.dumps({"traces": len(calls), "err": err}))
""")


def test_a_second_process_skips_aotautograd_for_a_training_step(tmp_path: Path) -> None:
    runs = processes_in_turn(SECOND_PROCESS, tmp_path)
    assert [r["traces"] for r in runs] == [1, 0]
    assert all(r["err"] < 1e-5 for r in runs), runs
