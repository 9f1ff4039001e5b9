"""The graph cache's layer in front of AOTAutograd (``coil.aot_cache``): an inference graph
compiled once is loaded by a later compile without AOTAutograd's trace, gives eager's
results, and every graph the layer cannot call as AOTAutograd would (input mutations,
outputs aliasing inputs, training, shared storage, user functions) is left to AOTAutograd;
each part of the key misses when it changes."""
from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

from coil import aot_cache, config, plugins
from coil.sdk.diskcache import DiskCache
from helpers import dynamo_graph, processes_in_turn

pytestmark = pytest.mark.graph_cache


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path) -> Any:
    with config.override(cache_dir=str(tmp_path)):
        yield


def _entries() -> int:
    return len(list(DiskCache.in_namespace(aot_cache.NAMESPACE, fanout=True).folder.rglob(f"*{aot_cache.SUFFIX}")))


def _twice(fn: Callable[..., Any], *args: Any, ctx: Callable[[], Any] = torch.no_grad) -> tuple[Any, Any, Any]:
    """``fn(*args)`` compiled by Coil, then again after Dynamo forgets it, and in eager."""
    with ctx():
        first = torch.compile(fn, backend="coil")(*args)
        torch._dynamo.reset()
        second = torch.compile(fn, backend="coil")(*args)
        return first, second, fn(*args)


def test_an_inference_graph_is_loaded_without_aotautograd(traces: list[int]) -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8), nn.Softmax(-1)).eval()
    first, second, ref = _twice(mlp, torch.randn(4, 16))
    assert len(traces) == 1 and _entries() == 1
    torch.testing.assert_close(first, ref)
    torch.testing.assert_close(second, ref)


def test_autocast_graph_runs_with_autocast_off_as_aotautograd_runs_it(traces: list[int]) -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)

    def ctx() -> Any:
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
        return stack

    first, second, ref = _twice(mlp, x, ctx=ctx)
    assert len(traces) == 1
    assert second.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(second, ref, rtol=2e-2, atol=2e-2)
    with torch.no_grad():  # autocast off: another key, traced again
        torch.compile(mlp, backend="coil")(x)
    assert len(traces) == 2


def _made_inside() -> torch.Tensor:
    a = torch.ones(8, 8) * 1.001
    return a @ a


@pytest.mark.parametrize("first_under_autocast", [False, True])
def test_autocast_is_in_the_key_of_a_graph_without_tensor_inputs(first_under_autocast: bool) -> None:
    """The key read autocast for the device types of the graph's values, taken from ATen
    metadata that Dynamo's graphs do not carry: a graph making its own tensors hit the other
    autocast state's entry (float32 8.016 under bf16 autocast; a hunt, session 37)."""
    states = [True, False] if first_under_autocast else [False, True]
    for on in states:
        torch._dynamo.reset()
        with torch.no_grad(), (torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()):
            got, want = torch.compile(_made_inside, backend="coil")(), _made_inside()
        assert got.dtype == want.dtype == (torch.bfloat16 if on else torch.float32)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _mutates(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * 2


def _aliases(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.view(-1), x + 1


@pytest.mark.parametrize("fn", [_mutates, _aliases], ids=lambda f: f.__name__)
def test_a_wrapper_that_is_more_than_a_call_is_left_to_aotautograd(fn: Callable[..., Any], traces: list[int]) -> None:
    x = torch.randn(4, 4)
    with torch.no_grad():
        got = torch.compile(fn, backend="coil")(x.clone())
        torch._dynamo.reset()
        again = torch.compile(fn, backend="coil")(x.clone())
        ref = fn(x.clone())
    assert _entries() == 0 and len(traces) == 2
    for a, b, r in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, again, ref))):
        torch.testing.assert_close(a, r)
        torch.testing.assert_close(b, r)


@torch._dynamo.allow_in_graph
def _user_function(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@torch.library.custom_op("coil_test::twice", mutates_args=())
def _twice_op(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_refusals() -> None:
    cfg = config.get()
    x = torch.randn(4, 4)
    with torch.no_grad():
        gm, inputs = dynamo_graph(lambda a: torch.relu(a) * 2, x)
        assert aot_cache.refusal(gm, inputs, cfg) is None
        gm, inputs = dynamo_graph(lambda a, b: a + b, x, x[1])
        assert "share storage" in aot_cache.refusal(gm, inputs, cfg)
        gm, inputs = dynamo_graph(lambda a: _user_function(a) * 2, x)
        assert "not a torch function" in aot_cache.refusal(gm, inputs, cfg)
        gm, inputs = dynamo_graph(lambda a: torch.ops.coil_test.twice(a) + 1, x)
        assert "not a torch function" in aot_cache.refusal(gm, inputs, cfg)  # a custom op's code is not keyed
        image = torch.randn(1, 2, 4, 4)  # F.max_pool2d is made by a factory: keyed by its public name
        gm, inputs = dynamo_graph(lambda a: torch.nn.functional.max_pool2d(a, 2), image)
        assert aot_cache.refusal(gm, inputs, cfg) is None
        assert aot_cache.key(gm, inputs, cfg, plugins.registry()) is not None
        with config.override(graph_cache=False):
            assert "graph cache is off" in aot_cache.refusal(gm, inputs, config.get())
    w = torch.randn(4, 4, requires_grad=True)
    gm, inputs = dynamo_graph(lambda a: a * 2, w)
    assert "training graph" in aot_cache.refusal(gm, inputs, cfg)
    with torch.no_grad():
        assert aot_cache.refusal(gm, inputs, cfg) is None


def test_every_part_of_the_key_misses_when_it_changes() -> None:
    reg = plugins.registry()
    x = torch.randn(4, 8)
    with torch.no_grad():
        gm, inputs = dynamo_graph(lambda a: torch.softmax(a, -1) * 3, x)
        base = aot_cache.key(gm, inputs, config.get(), reg)
        assert base == aot_cache.key(gm, inputs, config.get(), reg)
        other_graph, _ = dynamo_graph(lambda a: torch.softmax(a, -1) * 4, x)
        keys = {
            "graph": aot_cache.key(other_graph, inputs, config.get(), reg),
            "dtype": aot_cache.key(gm, [x.double()], config.get(), reg),
            "size": aot_cache.key(gm, [torch.randn(4, 9)], config.get(), reg),
            "strides": aot_cache.key(gm, [torch.randn(8, 4).t()], config.get(), reg),
        }
        with config.override(max_fusion_size=7):
            keys["config"] = aot_cache.key(gm, inputs, config.get(), reg)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            keys["autocast"] = aot_cache.key(gm, inputs, config.get(), reg)
        with torch.autocast("cpu", dtype=torch.float16):
            keys["autocast dtype"] = aot_cache.key(gm, inputs, config.get(), reg)
        with _flash_sdp_off():
            keys["sdpa flags"] = aot_cache.key(gm, inputs, config.get(), reg)
        with _default_dtype(torch.float64):
            keys["default dtype"] = aot_cache.key(gm, inputs, config.get(), reg)
        with _deterministic():
            keys["deterministic"] = aot_cache.key(gm, inputs, config.get(), reg)
        with torch._functorch.config.patch(activation_memory_budget=0.5):
            keys["functorch config"] = aot_cache.key(gm, inputs, config.get(), reg)
    keys["grad mode"] = aot_cache.key(gm, inputs, config.get(), reg)
    digests = {name: k.digest for name, k in keys.items()}
    assert base.digest not in digests.values(), digests
    assert len(set(digests.values())) == len(digests), digests


@contextlib.contextmanager
def _setting(get: Callable[[], Any], set_: Callable[[Any], None], value: Any) -> Any:
    """A global torch setting at ``value`` for the block, restored after."""
    before = get()
    set_(value)
    try:
        yield
    finally:
        set_(before)


def _default_dtype(dtype: torch.dtype) -> Any:
    return _setting(torch.get_default_dtype, torch.set_default_dtype, dtype)


def _flash_sdp_off() -> Any:
    return _setting(torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.enable_flash_sdp, False)


def _deterministic() -> Any:
    return _setting(torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms, True)


def test_an_entry_whose_graph_is_gone_is_traced_again(traces: list[int]) -> None:
    x = torch.randn(4, 8)

    def fn(a: torch.Tensor) -> torch.Tensor:
        return torch.tanh(a) + 1

    with torch.no_grad():
        torch.compile(fn, backend="coil")(x)
        for path in DiskCache.in_namespace("graphs", fanout=True).folder.rglob("*.graph"):
            path.unlink()
        torch._dynamo.reset()
        got = torch.compile(fn, backend="coil")(x)
    assert len(traces) == 2
    torch.testing.assert_close(got, fn(x))


SECOND_PROCESS = textwrap.dedent("""
    import json
    import torch, torch.nn as nn
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        err = (torch.compile(mlp, backend="coil")(x) - mlp(x)).abs().max().item()
    print(json.dumps({"traces": len(calls), "err": err}))
""")


def test_a_second_process_skips_aotautograd(tmp_path: Path) -> None:
    runs = processes_in_turn(SECOND_PROCESS, tmp_path)
    assert [r["traces"] for r in runs] == [1, 0]
    assert all(r["err"] < 1e-5 for r in runs), runs


def test_the_call_runs_without_grad_and_restores_grad_mode_even_when_it_raises() -> None:
    seen: list[bool] = []

    def graph(args: list[Any]) -> Any:
        seen.append(torch.is_grad_enabled())
        if args[0] is None:
            raise RuntimeError("boom")
        return (args[0] * 2,)

    forward = aot_cache.call_like_aot(graph)
    with torch.enable_grad():
        out = forward(torch.ones(3, requires_grad=True))
        assert torch.is_grad_enabled() and not out[0].requires_grad
        with pytest.raises(RuntimeError, match="boom"):
            forward(None)
        assert torch.is_grad_enabled()
    with torch.no_grad():
        forward(torch.ones(3))
        assert not torch.is_grad_enabled()
    assert seen == [False, False, False]
