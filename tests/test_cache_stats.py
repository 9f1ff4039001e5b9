"""Hit and miss counts of the caches (:mod:`coil.sdk.cachestats`): what ``DiskCache`` counts
per layer and namespace, what ``coil.explain`` shows for one compile (graph, kernel and
autotune layers), and what ``coil cache stats`` shows for every process since the last
``coil cache clear``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import coil
from coil import cli, config, plugins
from coil.sdk import cachestats
from coil.sdk.diskcache import DiskCache

pytestmark = pytest.mark.graph_cache  # the graph cache stays on (tests/conftest.py)


def _counted(fn):
    before = cachestats.snapshot()
    fn()
    return cachestats.snapshot() - before


def test_lookups_and_writes_are_counted_per_layer_and_namespace(tmp_path):
    cache = DiskCache(tmp_path / "kernels-ns", layer="kernel")

    def work():
        assert cache.read("k1", ".bin") is None  # a miss
        cache.write("k1", ".bin", b"payload")
        assert cache.read("k1", ".bin") == b"payload"  # a hit
        assert cache.lookup("k1", ".bin") is not None  # another
        assert cache.read("k1", ".bin", count=False) == b"payload"  # not counted
        assert cache.lookup("k2", ".bin", count=False) is None

    got = _counted(work)
    assert got.table == {("kernel", "kernels-ns", "miss"): 1, ("kernel", "kernels-ns", "write"): 1,
                         ("kernel", "kernels-ns", "hit"): 2}
    other = _counted(lambda: DiskCache(tmp_path / "x").read("k", ".bin"))
    assert other.get("other", "miss", "x") == 1  # no layer given: "other"


def _sin(x):
    return torch.sin(x) * 2 + x.sum(-1, keepdim=True)


def test_explain_shows_the_graph_and_kernel_layers(tmp_path):
    x = torch.randn(4, 16)
    with config.override(cache_dir=str(tmp_path)):
        first = coil.explain(_sin, x)
        second = coil.explain(_sin, x)
    # the graph layer's two namespaces: the Dynamo graph's entry (coil.aot_cache), the ATen graph's
    for ns in ("aot", "graphs"):
        assert (first.cache.get("graph", "miss", ns), first.cache.get("graph", "write", ns)) == (1, 1), ns
        assert (second.cache.get("graph", "hit", ns), second.cache.get("graph", "miss", ns)) == (1, 0), ns
    assert first.cache.get("kernel", "miss") == 1
    assert str(first).splitlines()[-1] == "== caches: graph 0 hit(s), 2 miss(es); kernel 0 hit(s), 1 miss(es)"
    # a graph hit loads the library with the entry: the kernel cache is not asked
    assert (second.cache.get("kernel", "miss"), second.cache.get("kernel", "hit")) == (0, 0)
    assert str(second).endswith("== caches: graph 2 hit(s), 0 miss(es)")


@pytest.fixture
def tuning_triton():
    pytest.importorskip("triton")
    from triton import knobs
    if not knobs.runtime.interpret:
        pytest.skip("needs TRITON_INTERPRET=1 before triton is imported (tests/conftest.py sets it)")
    from coil_cuda_triton.testing import conformance_backend

    def fresh():  # a new process's backend: no launcher knows a winner yet
        coil.register_backend_for_device("cpu", conformance_backend(), name="cachestats-triton")
    plugins.reset()
    yield fresh
    plugins.reset()


def test_explain_shows_the_autotune_layer(tmp_path, tuning_triton):
    x = torch.randn(64, 300)
    fn = lambda a: torch.softmax(a, -1) * 2  # noqa: E731
    with config.override(cache_dir=str(tmp_path), graph_cache=False):
        tuning_triton()
        first = coil.explain(fn, x)
        tuning_triton()
        second = coil.explain(fn, x)
    tuned = first.cache.get("autotune", "miss")
    assert tuned >= 1 and first.cache.get("autotune", "hit") == 0
    assert first.cache.get("autotune", "write") == tuned
    assert second.cache.get("autotune", "hit") == tuned and second.cache.get("autotune", "miss") == 0
    assert "autotune" in str(second).splitlines()[-1]


COUNT = """
import sys
from coil.sdk.diskcache import DiskCache
cache = DiskCache.in_namespace("demo", layer="autotune")
cache.read("k", ".json")
cache.write("k", ".json", b"{}")
cache.read("k", ".json")
"""


def test_counts_of_every_process_reach_cache_stats_and_clear_resets_them(tmp_path, capsys):
    env = dict(os.environ, COIL_CACHE_DIR=str(tmp_path))
    for _ in range(2):  # each adds its counts to the file when it exits
        done = subprocess.run([sys.executable, "-c", COUNT], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    saved = cachestats.saved(tmp_path)
    # the second process found the first one's entry: its first read hit
    assert (saved.get("autotune", "miss", "demo"), saved.get("autotune", "hit", "demo")) == (1, 3)
    assert saved.get("autotune", "write", "demo") == 2
    with config.override(cache_dir=str(tmp_path)):
        assert cli.main(["cache", "stats"]) == 0
        out = capsys.readouterr().out
        [row] = [line.split() for line in out.splitlines() if line.startswith("autotune")]
        assert row[:6] == ["autotune", "demo", "3", "0", "1", "75%"]  # hits, remote hits, misses, rate
        assert cli.main(["cache", "clear"]) == 0
        assert not cachestats.saved(tmp_path)
        capsys.readouterr()
        assert cli.main(["cache", "stats"]) == 0
        assert "(nothing counted yet)" in capsys.readouterr().out
