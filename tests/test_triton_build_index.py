"""The Triton plugin's build index (``coil_cuda_triton.build_index``): a second build of the
same kernel is read from Triton's cache without ``triton.compile`` (whose cache key walks
the kernel's dependencies, 11 ms a kernel); anything in the key that changes builds again,
and an index entry whose Triton files are gone builds again. Runs in a subprocess without
Triton's interpreter, building for Hopper (no GPU needed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import json, shutil, sys, types
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from coil_cuda_triton import launch
    from coil_cuda_triton.configs import Config

    @triton.jit
    def k_scale(p_x, p_y, n, XBLOCK: tl.constexpr):
        i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        tl.store(p_y + i, tl.load(p_x + i, mask=i < n) * 2, mask=i < n)

    src = types.SimpleNamespace(params=["p_x", "p_y", "n"], types=["*fp32", "*fp32", "i64"],
                                shape="pointwise", buffers=["x", "y"])
    compiles, hits = [], []
    real = triton.compile
    def counting(*args, **kwargs):
        compiles.append(1)
        return real(*args, **kwargs)
    triton.compile = counting
    hopper = GPUTarget("cuda", 90, 32)

    def build(cfg):
        before = len(compiles)
        k = launch.compile_for(k_scale, src, cfg, target=hopper, on_cache=hits.append)
        return len(compiles) > before, k

    out = {}
    out["first"], k1 = build(Config(1024, num_warps=4))
    out["again"], k2 = build(Config(1024, num_warps=4))
    out["same_binary"] = k1.asm["cubin"] == k2.asm["cubin"] and k1.hash == k2.hash
    out["other_warps"], _ = build(Config(1024, num_warps=8))
    out["other_block"], _ = build(Config(512, num_warps=4))
    shutil.rmtree(sys.argv[1])  # Triton's cache cleared behind the index
    out["after_clear"], k3 = build(Config(1024, num_warps=4))
    out["hits"] = hits
    print(json.dumps(out))
''')


def test_a_second_build_is_read_without_triton_compile_and_key_changes_build_again(tmp_path):
    script = tmp_path / "builds.py"
    script.write_text(SCRIPT)
    triton_cache = tmp_path / "triton"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(COIL_CACHE_DIR=str(tmp_path / "coil"), TRITON_CACHE_DIR=str(triton_cache))
    done = subprocess.run([sys.executable, str(script), str(triton_cache)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"] is True
    assert out["again"] is False and out["same_binary"]  # from the index, the same build
    assert out["other_warps"] is True and out["other_block"] is True
    assert out["after_clear"] is True  # the index pointed at files that are gone: built again
    # every build reports to the kernel layer's counts: a miss, then the index's hit, then misses
    assert out["hits"] == [False, True, False, False, False]
