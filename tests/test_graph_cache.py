"""The graph cache (``coil.graph_cache``): a second process loads compiled graphs without
lowering or codegen, every part of the key misses when it changes, damaged entries are
rebuilt, and the Triton plugin's modules survive the round trip (templates included)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import coil
from coil import compile as coil_compile
from coil import config, graph_cache, graph_key, plugins
from coil.sdk.diskcache import DiskCache

pytestmark = pytest.mark.graph_cache

SECOND_PROCESS = textwrap.dedent("""
    import json, sys, time
    import torch, torch.nn as nn
    from coil import compile as cc
    from coil.demo import Block
    reports = []
    cc.add_observer(reports.append)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        got = torch.compile(mlp, backend="coil")(x)
        err = (got - mlp(x)).abs().max().item()
    block = Block(dim=32, heads=2)
    ref = Block(dim=32, heads=2)
    ref.load_state_dict(block.state_dict())
    y = torch.randn(2, 8, 32)
    def step(m, y):
        loss = m(y).pow(2).mean()
        loss.backward()
        return loss
    loss = torch.compile(step, backend="coil")(block, y)
    ref_loss = step(ref, y)
    err = max(err, (loss - ref_loss).abs().item(),
              *[(p.grad - q.grad).abs().max().item() for p, q in zip(block.parameters(), ref.parameters())])
    print(json.dumps({"err": err, "graphs": [
        {"kind": r.kind, "cached": r.cached, "stages": r.stage_seconds} for r in reports]}))
""")


def _run(cache: Path) -> dict:
    env = dict(os.environ, COIL_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_graph_without_compiling(tmp_path):
    first, second = _run(tmp_path), _run(tmp_path)
    kinds = [g["kind"] for g in first["graphs"]]
    assert kinds == ["inference", "forward", "backward"]
    assert [g["kind"] for g in second["graphs"]] == kinds
    assert not any(g["cached"] for g in first["graphs"])
    assert all(g["cached"] for g in second["graphs"]), second
    for g in second["graphs"]:
        assert g["stages"]["lower"] == g["stages"]["schedule"] == g["stages"]["codegen+compile"] == 0.0
    assert first["err"] < 1e-4 and second["err"] < 1e-4


# ----------------------------------------------------------------------------- in-process helpers


@pytest.fixture
def cache(tmp_path):
    with config.override(cache_dir=str(tmp_path)):
        yield tmp_path


def _compile(fn, *args, **options):
    """``fn(*args)`` through Coil (Dynamo's state reset first): (result, reports)."""
    torch._dynamo.reset()
    reports = []
    coil_compile.add_observer(reports.append)
    try:
        with config.override(**options):
            result = torch.compile(fn, backend="coil")(*args)
    finally:
        coil_compile.remove_observer(reports.append)
    return result, reports


def _cached(fn, *args, **options) -> bool:
    result, reports = _compile(fn, *args, **options)
    expected = fn(*args)
    torch.testing.assert_close(result, expected)
    assert reports
    return all(r.cached for r in reports)


def _f(x):
    return torch.softmax(x * 2, -1) + 1


def test_the_same_graph_hits_and_reports_what_it_compiled(cache):
    x = torch.randn(4, 8)
    _, first = _compile(_f, x)
    _, second = _compile(_f, x)
    assert not first[0].cached and second[0].cached
    a, b = first[0], second[0]
    assert [k.name for k in a.kernels] == [k.name for k in b.kernels]
    assert [k.source for k in a.kernels] == [k.source for k in b.kernels]
    assert (a.peak_bytes, a.wrapper_source, a.num_inputs) == (b.peak_bytes, b.wrapper_source, b.num_inputs)
    assert "graph cache" in b.stage_seconds


# ----------------------------------------------------------------------------- each part of the key


def test_the_graph_is_in_the_key(cache):
    x = torch.randn(4, 8)
    assert not _cached(lambda x: x.sin() + 1, x)
    assert not _cached(lambda x: x.cos() + 1, x)  # another op
    assert not _cached(lambda x: x.cos() + 2, x)  # another constant argument
    assert _cached(lambda x: x.cos() + 2, x)


def test_the_op_a_node_was_decomposed_from_is_in_the_key(cache):
    """A layer norm decomposes into the ATen graph of a hand-written var_mean, whose variance
    the lowering keeps in float64 where a norm's stays float32 (``original_aten``): the second
    hit the first's entry, 6.5e-3 off eager on ill-conditioned rows (a hunt, session 37)."""
    def hand(x):
        var, mean = torch.var_mean(x, [1], correction=0, keepdim=True)
        r = torch.rsqrt(var + 1e-05)  # in the decomposition's order
        return (x - mean) * r

    torch.manual_seed(0)
    x = 10 + torch.randn(4, 4096)
    assert not _cached(lambda x: torch.nn.functional.layer_norm(x, (4096,)), x)
    assert not _cached(hand, x)
    assert _cached(hand, x)


def test_constant_tensors_are_in_the_key_by_content(cache):
    x = torch.randn(3)
    assert not _cached(lambda x: x * torch.tensor([1.0, 2.0, 3.0]), x)
    assert not _cached(lambda x: x * torch.tensor([1.0, 2.0, 4.0]), x)
    assert _cached(lambda x: x * torch.tensor([1.0, 2.0, 4.0]), x)


def test_input_metadata_is_in_the_key(cache):
    base = torch.randn(6, 8)
    assert not _cached(_f, base)
    assert not _cached(_f, base.double())  # dtype
    assert not _cached(_f, torch.randn(6, 4))  # sizes
    assert not _cached(_f, torch.randn(8, 6).t())  # strides
    assert not _cached(_f, torch.randn(49)[1:].view(6, 8))  # storage offset
    assert _cached(_f, torch.randn(6, 8))


def test_requires_grad_and_the_graph_kind_are_in_the_key(cache):
    x = torch.randn(4, 8)
    assert not _cached(_f, x)
    xg = x.clone().requires_grad_()
    result, reports = _compile(_f, xg)
    assert {r.kind for r in reports} == {"forward"} and not reports[0].cached
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    keys = {kind: graph_key.graph_key(gm, [x], config.get(), kind, plugins.registry()) for kind in
            ("forward", "backward", "inference")}
    assert len({k.digest for k in keys.values()}) == 3


def test_the_donated_inputs_are_in_the_key():
    # a backward compiled to write over its saved tensors must not serve a call that keeps them
    x = torch.randn(4, 8)
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    keys = {donated: graph_key.graph_key(gm, [x], config.get(), "backward", plugins.registry(), donated)
            for donated in ((), (0,))}
    assert keys[()].digest != keys[(0,)].digest


def test_knobs_are_in_the_key_and_paths_are_not(cache, tmp_path_factory):
    x = torch.randn(4, 8)
    assert not _cached(_f, x)
    assert not _cached(_f, x, max_fusion_size=1)
    assert not _cached(_f, x, inplace_buffers=False)
    assert _cached(_f, x, debug_dir=str(tmp_path_factory.mktemp("debug")), progress="off")


def test_backend_options_capabilities_and_target_are_in_the_key(cache, monkeypatch):
    x = torch.randn(4, 8)
    assert not _cached(_f, x)
    assert not _cached(_f, x, **{"cpu_cpp.extra_cflags": "-DCOIL_GRAPH_CACHE_TEST=1"})
    backend = plugins.registry().backends["cpu"]
    monkeypatch.setattr(backend, "capabilities", dataclasses.replace(backend.capabilities, vector_width=7))
    assert not _cached(_f, x)
    assert _cached(_f, x)
    monkeypatch.setattr(backend, "target_key", lambda: "another CPU")
    assert not _cached(_f, x)


def test_plugins_templates_versions_and_source_are_in_the_key(cache, monkeypatch):
    x = torch.randn(4, 8)
    assert not _cached(_f, x)
    reg = plugins.registry()
    info = next(p for p in reg.plugins if p.name == "cpu_cpp")
    monkeypatch.setattr(info, "version", "99.0")
    assert not _cached(_f, x)
    monkeypatch.setattr(info, "api_version", "0.1.0")
    assert not _cached(_f, x)

    class OtherTemplate:
        name, dialect = "other-gemm", "no-such-dialect"

    monkeypatch.setattr(reg, "templates", [*reg.templates, OtherTemplate()])
    assert not _cached(_f, x)
    real = graph_key.versions()
    monkeypatch.setattr(graph_key, "versions", lambda: {**real, "torch": "9.9"})
    assert not _cached(_f, x)
    assert _cached(_f, x)
    monkeypatch.setattr(graph_key, "source_digest", lambda reg: "edited")
    assert not _cached(_f, x)


def test_the_source_digest_covers_coil_and_plugin_files():
    reg = plugins.registry()
    names = graph_key._modules_of(reg)
    assert {"coil", "coil.sdk", "coil_cpu_cpp"} <= names
    assert "torch" not in names
    paths = [p for n in names for p in graph_key._paths(n)]
    assert any(p.endswith("cpu_cpp") for p in paths)


# ----------------------------------------------------------------------------- what is not cached, damage


def test_self_check_and_the_knob_off_store_nothing(cache):
    x = torch.randn(4, 8)
    assert not _cached(_f, x, check=True)
    assert not _cached(_f, x, graph_cache=False)
    assert not list(cache.glob("graphs/*/*.graph"))
    assert not _cached(_f, x)
    assert not _cached(_f, x, check=True)  # an entry exists, but self-check compiles


def test_graphs_with_the_cores_own_library_calls_hit(cache):
    """1x1 convolutions as products (coil.conv_matmul) are library calls of the core's own,
    kept in the wrapper's namespace: inference, training forward and backward graphs holding
    them are stored and hit, and the hits compute eager's values and gradients."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Conv2d(8, 16, 1),
                              torch.nn.ReLU())
    x = torch.randn(2, 8, 6, 6)

    def step(m, x):
        loss = m(x).square().sum()
        loss.backward()
        return loss

    with torch.no_grad():
        assert not _cached(net, x)
        assert _cached(net, x)
    for expect_hit in (False, True):
        net.zero_grad()
        _, reports = _compile(step, net, x)
        grads = [p.grad.clone() for p in net.parameters()]
        net.zero_grad()
        step(net, x)
        for got, want in zip(grads, (p.grad for p in net.parameters())):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert {r.kind for r in reports} == {"forward", "backward"}
        assert all(r.cached == expect_hit for r in reports), [(r.kind, r.cached) for r in reports]
        ops = [op for r in reports for op in r.library_ops]
        assert "coil.pointwise_convolution" in ops and "coil.pointwise_convolution_backward" in ops, ops


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"{graph_cache.NAMESPACE}/*/*{graph_cache.SUFFIX}"))


def test_a_damaged_entry_is_quarantined_and_compiled_again(cache, caplog):
    x = torch.randn(4, 8)
    assert not _cached(_f, x)
    [entry] = _entries(cache)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert not _cached(_f, x)
    assert list(cache.glob(f"{graph_cache.NAMESPACE}/quarantine/*"))
    assert "damaged" in caplog.text
    assert _cached(_f, x)


def test_an_unusable_entry_is_compiled_again(cache, caplog):
    x = torch.randn(4, 8)
    assert not _cached(_f, x)
    [entry] = _entries(cache)
    key = entry.name.removesuffix(graph_cache.SUFFIX)
    DiskCache(cache / graph_cache.NAMESPACE, fanout=True).write(key, graph_cache.SUFFIX, b"not a pickle")
    assert not _cached(_f, x)
    assert "could not be used" in caplog.text
    assert _cached(_f, x)


def test_symbolic_sizes_hit_and_serve_other_sizes(cache):
    def f(x):
        return torch.softmax(x, -1) * x.shape[0]

    torch._dynamo.reset()
    for fresh in (True, False):
        torch._dynamo.reset()
        reports = []
        coil_compile.add_observer(reports.append)
        try:
            compiled = torch.compile(f, backend="coil", dynamic=True)
            for n in (5, 7, 9):
                x = torch.randn(n, 6)
                torch.testing.assert_close(compiled(x), f(x))
        finally:
            coil_compile.remove_observer(reports.append)
        assert reports and all(r.symbolic for r in reports)
        assert all(r.cached != fresh for r in reports)


# ----------------------------------------------------------------------------- the Triton plugin


def _triton_interpreted():
    pytest.importorskip("triton")
    from triton import knobs
    if not knobs.runtime.interpret:
        pytest.skip("needs TRITON_INTERPRET=1 before triton is imported (tests/conftest.py sets it)")
    from coil_cuda_triton.testing import interpreted_backend
    return interpreted_backend


def _fresh_triton(interpreted_backend):
    """A new backend instance (no functions or launchers loaded) serving the cpu device."""
    plugins.reset()
    coil.register_backend_for_device("cpu", interpreted_backend(), name="graph-cache-triton")


def test_triton_modules_survive_the_round_trip(cache):
    interpreted_backend = _triton_interpreted()
    try:
        x = torch.randn(8, 16)
        for fresh in (True, False):
            _fresh_triton(interpreted_backend)  # the second round has nothing loaded: import
            assert _cached(lambda x: (torch.softmax(x, -1) + x.sum(0), x.cumsum(1)), x) != fresh
    finally:
        plugins.reset()


def test_triton_template_kernels_survive_the_round_trip(cache):
    interpreted_backend = _triton_interpreted()

    def f(a, b):
        return torch.relu(a @ b) * 2

    a, b = torch.randn(32, 16, dtype=torch.float16), torch.randn(16, 32, dtype=torch.float16)
    try:
        for fresh in (True, False):
            _fresh_triton(interpreted_backend)
            result, reports = _compile(f, a, b, templates="force")
            torch.testing.assert_close(result, f(a, b), atol=1e-2, rtol=1e-2)
            assert [r.cached for r in reports] == [not fresh]
            assert any(k.template for k in reports[0].kernels), [k.name for k in reports[0].kernels]
    finally:
        plugins.reset()


# ----------------------------------------------------------------------------- portable artifacts


def _mlp_and_training():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)

    def step(m, x):
        loss = m(x).pow(2).sum()
        loss.backward()
        return loss

    return lambda: _compile(step, mlp, x)


def test_artifacts_make_a_fresh_cache_hit(tmp_path, monkeypatch):
    from coil import cache as coil_cache
    from coil.sdk import diskcache
    monkeypatch.setattr(diskcache, "used", {})
    run = _mlp_and_training()
    with config.override(cache_dir=str(tmp_path / "a")):
        _, reports = run()
        assert [r.cached for r in reports] == [False, False]
        data = coil_cache.save_artifacts()
    with config.override(cache_dir=str(tmp_path / "b")):
        summary = coil_cache.load_artifacts(data)
        assert summary.graphs == 2 and not summary.refused, summary
        _, reports = run()
        assert [r.kind for r in reports] == ["forward", "backward"]
        assert all(r.cached for r in reports)
        assert coil_cache.load_artifacts(data).present >= 2  # loading twice writes nothing


def test_artifacts_of_other_versions_or_hardware_are_refused_with_the_reason(tmp_path, monkeypatch):
    from coil import cache as coil_cache
    from coil.sdk import diskcache
    monkeypatch.setattr(diskcache, "used", {})
    run = _mlp_and_training()
    with config.override(cache_dir=str(tmp_path / "a")):
        run()
        data = coil_cache.save_artifacts()
    backend = plugins.registry().backends["cpu"]
    with config.override(cache_dir=str(tmp_path / "b")):
        monkeypatch.setattr(backend, "target_key", lambda: "a CPU from elsewhere")
        summary = coil_cache.load_artifacts(data)
        assert summary.graphs == 0 and len(summary.refused) == 2
        assert all("cpu target" in why and "a CPU from elsewhere" in why for _, why in summary.refused)
        monkeypatch.undo()
        real = graph_key.versions()
        monkeypatch.setattr(graph_key, "versions", lambda: {**real, "torch": "0.0"})
        summary = coil_cache.load_artifacts(data)
        assert summary.graphs == summary.files == 0 and summary.refused
        assert all("torch: " in why and "'0.0' here" in why for _, why in summary.refused)


def test_cache_export_and_import_commands(tmp_path):
    with config.override(cache_dir=str(tmp_path / "a")):
        _compile(_f, torch.randn(4, 8))
    bundle = tmp_path / "bundle.coil"
    env = dict(os.environ, COIL_CACHE_DIR=str(tmp_path / "a"))
    done = subprocess.run([sys.executable, "-m", "coil.cli", "cache", "export", str(bundle)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    env["COIL_CACHE_DIR"] = str(tmp_path / "b")
    done = subprocess.run([sys.executable, "-m", "coil.cli", "cache", "import", str(bundle)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "1 graph(s)" in done.stdout and "0 refused" in done.stdout, done.stdout
    with config.override(cache_dir=str(tmp_path / "b")):
        assert _cached(_f, torch.randn(4, 8))
