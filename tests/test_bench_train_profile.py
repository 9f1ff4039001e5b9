"""``bench/train_profile.py`` without a GPU: its ``kernels`` mode on the CPU names rows after
Coil's kernels (``kN_<ops>``, their ATen ops, their graphs) and writes them as JSON with the
kernels' sources; the GPU's digest -> kernel map, made with the Triton plugin interpreted,
survives a graph cache that would hit; ``memory`` on the CPU replays the profiler's memory
events (checked against a step whose peak is known); and the
GPU-only steps (rows from the profiler's CUDA events, the replay of the allocator's trace) on
made-up events and a made-up trace."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import helpers
from coil import config
from models import imports

@pytest.fixture(scope="module")
def script() -> ModuleType:
    return helpers.load_bench("train_profile")


def test_kernels_on_cpu_named_after_coil_kernels(script, capsys, tmp_path):
    imports.import_optional("torchvision")
    pytest.importorskip("torchvision")
    script.main(["kernels", "tv_resnet18", "--device", "cpu", "--size", "small", "--precision", "fp32",
                 "--steps", "1", "--top", "60", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "tv_resnet18_coil_kernels.json").read_text())
    assert result["time"] == "self CPU" and result["graphs"], result
    named = [row for row in result["kernels"] if row["coil_kernels"]]
    assert named, f"no row names a Coil kernel: {result['kernels']}"
    for row in named:
        assert row["name"] == "coil:" + row["coil_kernels"][0], row
        assert re.fullmatch(r"k\d+(_\w+)?", row["coil_kernels"][0]), row
        assert row["ops"] and all(op.startswith(("aten.", "coil.")) for op in row["ops"]), row
        assert row["graphs"], row
    written = [Path(row["source_file"]) for row in named if row["source_file"]]
    assert written and all(p.is_file() and p.parent == tmp_path for p in written), named
    assert result["copies"] and all(row["op"].startswith("aten::") for row in result["copies"])
    text = capsys.readouterr().out
    assert "== tv_resnet18 coil on cpu (fp32, small): self CPU time" in text
    assert "coil:k" in text and "copy-like ATen ops" in text


def _softmax(x):
    return torch.softmax(x * 2, -1) + 1


@pytest.mark.graph_cache  # kept on: a hit is what the tool's settings must prevent
def test_digests_named_even_where_the_graph_cache_would_hit(script, tmp_path):
    """What the GPU run relies on, with the Triton plugin interpreted on the CPU: each
    ``coil_<digest>`` maps to the kernel it was made from; a graph-cache hit would leave the
    map empty, so the tool's settings turn the cache off."""
    pytest.importorskip("triton")
    from coil_cuda_triton import dedup
    original = dedup.canonical
    x = torch.randn(4, 8)

    def compile_under(settings):
        torch._dynamo.reset()
        with settings as digests:
            torch.testing.assert_close(torch.compile(_softmax, backend="coil")(x), _softmax(x))
        return dict(digests)

    with helpers.cpu_routed_to("triton", "train-profile-triton"), \
            config.override(cache_dir=str(tmp_path), graph_cache=True):
        first = compile_under(script.digest_names())  # compiles, and stores the graph
        assert first and all(re.fullmatch(r"coil_\w+", name) for name in first), first
        assert all(re.fullmatch(r"k\d+_\w+", src) for d in first.values() for src in d.sources), first
        assert all(f"def {name}(" in d.text for name, d in first.items())
        assert compile_under(script.digest_names()) == {}  # loaded from the graph cache
        assert compile_under(script.compile_settings(triton_names=True)).keys() == first.keys()
    assert dedup.canonical is original


def test_memory_on_cpu_finds_a_known_peak():
    """The CPU replay on a step whose peak is known: two 4 MiB blocks alive at once, then one
    freed and a 1 MiB one allocated."""
    cpu_memory = helpers.load_bench("cpu_memory")

    def step() -> None:
        a = torch.empty(2**20)  # 4 MiB of float32
        b = torch.empty(2**20)
        del a
        c = torch.empty(2**18)
        del b, c

    result = cpu_memory.profile_memory_cpu(step, "m", "eager", "small", "fp32", top=5)
    assert abs(result["peak_mib"] - 8.0) < 0.01, result
    assert result["live_blocks"] == 2 and result["live_sizes"] == [2**22, 2**22], result
    assert all(g["where"].startswith("aten::") for g in result["groups"]), result["groups"]


def test_memory_on_cpu_runs_a_zoo_model(script, capsys):
    imports.import_optional("torchvision")
    pytest.importorskip("torchvision")
    script.main(["memory", "tv_resnet18", "--device", "cpu", "--size", "small", "--precision", "fp32",
                 "--batch", "1", "--top", "5"])
    text = capsys.readouterr().out
    assert "== tv_resnet18 coil on cpu (fp32, small)" in text and "blocks live at the peak" in text, text


def _alloc(addr: int, size: int, *frames: tuple[str, int]) -> dict:
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [{"filename": f, "line": n, "name": "call"} for f, n in frames]}


def _free(addr: int, size: int) -> dict:
    return {"action": "free_completed", "addr": addr, "size": size}


def test_replay_finds_the_peak_and_groups_live_blocks_by_frame(script):
    lib = "/site-packages/torch/"
    trace = [
        _free(99, 50),  # a block from before the trace: its free lowers the step's count
        _alloc(1, 100, (lib + "functional.py", 7), ("<coil-wrapper>", 3)),
        _alloc(2, 200, ("<coil-wrapper>", 3)),
        _alloc(3, 400, ("<coil-wrapper>", 5)),  # peak here: 100 + 200 + 400 - 50
        _free(2, 200),
        _alloc(4, 150, ("/tmp/torchinductor_x/ab/cabc.py", 9)),  # 600: below the peak
        _alloc(5, 8),  # 608: after the peak, not live at it
    ]
    peak, live = script.replay_peak(trace)
    assert peak == 650 and sorted(b["addr"] for b in live) == [1, 2, 3]
    wrappers = {"graph0": ["def call(args):", "    x = 1", "    buf0 = new(...)", "", "    buf1 = f()"],
                "graph1": ["def call(args):"]}
    groups = script.group_blocks(live, (lib,), wrappers)
    assert [(g.where, g.blocks, g.mib * 2**20) for g in groups] == [
        ("<coil-wrapper>:5 call", 1, 400), ("<coil-wrapper>:3 call", 2, 300)]
    assert groups[1].lines == {"graph0": "buf0 = new(...)"}  # graph1's wrapper has no line 3
    assert script.where([], (lib,)).startswith("(no Python frame")
    assert script.where([{"filename": lib + "optim/sgd.py", "line": 1, "name": "step"}], (lib,)) \
        == lib + "optim/sgd.py:1 step"


def test_gpu_rows_name_each_digest_after_its_kernels(script):
    """The GPU's rows on made-up profiler events: one canonical function serving kernels of
    two graphs (``k3_add_relu``'s second function among them) gets both kernels' ops."""
    from types import SimpleNamespace as NS
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [NS(device_type=cuda, name="coil_ab12", device_time_total=30.0)] * 4 + [
        NS(device_type=cuda, name="sm90_xmma_gemm", device_time_total=100.0),
        NS(device_type=cpu, name="aten::mm", device_time_total=100.0)]
    report = NS(graphs=[
        NS(name="graph0", kernels=[NS(name="k3_add_relu", ops=("aten.add.Tensor",), source="")]),
        NS(name="graph1", kernels=[NS(name="k3_mul", ops=("aten.mul.Tensor",), source="")])])
    digests = {"coil_ab12": script.Digest({"k3_add_relu_base", "k3_mul"}, "def coil_ab12(): pass")}
    rows = script.device_rows(NS(events=lambda: events), 2, digests)
    index = script.KernelIndex(report)
    for row in rows:
        index.describe(row)
    assert [(r.name, r.us_per_step, r.calls_per_step) for r in rows] == [
        ("coil_ab12", 60.0, 2.0), ("sm90_xmma_gemm", 50.0, 0.5)]
    assert rows[0].coil_kernels == ["k3_add_relu_base", "k3_mul"]
    assert rows[0].ops == ["aten.add.Tensor", "aten.mul.Tensor"] and rows[0].graphs == ["graph0", "graph1"]
    assert rows[1].coil_kernels == rows[1].ops == []
