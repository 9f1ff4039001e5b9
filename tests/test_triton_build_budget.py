"""The Triton plugin's build budget (``coil_cuda_triton.build_budget``): a graph's first call
tunes its largest kernels within a few rounds of the builders; the others build and launch
their first candidate alone. Launchers here are real but never launch (no GPU needed)."""
from __future__ import annotations

import sympy

import coil
from coil.sdk import cachestats
from coil_cuda_triton import build_budget, configs
from coil_cuda_triton.configs import Config
from coil_cuda_triton.launch import Launcher
from coil_cuda_triton.source import KernelSource


def _launcher(name: str, xnumel: int, rnumel: int = 1, shape: str = "pointwise") -> Launcher:
    cands = configs.candidates(shape, xnumel, rnumel if shape != "pointwise" else None, False)
    src = KernelSource(name=name, source="", params=["p0", "p1"], types=["*fp32", "*fp32"], shape=shape,
                       xnumel=sympy.Integer(xnumel), rnumel=sympy.Integer(rnumel), configs=cands,
                       buffers=["p0", "p1"])
    digest = f"{abs(hash(name)):032x}"[:32]
    return Launcher(src, None, interpret=False, tune_key=lambda bucket: digest)


def test_a_small_graph_tunes_every_kernel(tmp_path):
    with coil.config.override(cache_dir=str(tmp_path)):
        las = [_launcher(f"k{i}", 2**22 + i) for i in range(3)]  # two candidates each
        assert all(len(la.to_build()) == 2 for la in las)
        assert {id(la) for la in build_budget.tuned(las, builders=9)} == {id(la) for la in las}


def test_a_large_graph_tunes_its_largest_kernels_within_the_budget(tmp_path):
    with coil.config.override(cache_dir=str(tmp_path)):
        las = [_launcher(f"k{i}", 2**21 * (i + 1)) for i in range(40)]
        tuned = build_budget.tuned(las, builders=3)
        extra = sum(len(la.to_build()) - 1 for la in tuned)
        assert extra <= build_budget.EXTRA_ROUNDS * 3 and len(tuned) == extra
        assert tuned == sorted(las, key=build_budget.work, reverse=True)[:len(tuned)]
        assert build_budget.tuned(las, builders=3, mode="all") == las


def test_kernels_without_a_choice_are_not_counted(tmp_path):
    with coil.config.override(cache_dir=str(tmp_path)):
        one = _launcher("small", 512)  # one candidate: nothing to tune
        before = cachestats.snapshot()
        assert len(one.to_build()) == 1
        assert build_budget.tuned([one], builders=1) == []
        # nor looked up: a warm process's explain showed such kernels as autotune misses
        assert (cachestats.snapshot() - before).get("autotune", "miss") == 0


def test_an_untuned_launcher_builds_and_launches_its_first_candidate(tmp_path):
    with coil.config.override(cache_dir=str(tmp_path)):
        la = _launcher("rows", 4096, 2048, shape="persistent")
        first = la.src.configs[0]
        assert len(la.to_build()) > 1 and first == Config(1, 2048, num_warps=4)
        la.skip_tuning()
        assert la.to_build() == [first] and la.candidates(()) == [first]
        la.pin(first)
        assert "not tuned" in la.describe() and str(first) in la.describe()


def test_a_cached_winner_is_built_alone_and_never_pruned(tmp_path):
    with coil.config.override(cache_dir=str(tmp_path)):
        la = _launcher("cached", 2**23)
        winner = la.src.configs[-1]
        la.cache.put(la._tune_key(None), winner, {}, "cached")
        assert la.to_build() == [winner]
        assert build_budget.tuned([la], builders=1) == []
