"""``python -m coil_cuda_triton.aot``: the kernels a handful of representative functions
generate under Triton's interpreter (in this process, into a fresh cache directory) all
compile for Hopper in a process without the interpreter; a kernel Triton rejects fails the
command with its name and Triton's error."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

import coil  # noqa: E402
from coil import plugins  # noqa: E402
from coil_cuda_triton import mathlib  # noqa: E402
from coil_cuda_triton.backend import TritonBackend  # noqa: E402

from helpers import check  # noqa: E402

SUMMARY = re.compile(r"(\d+) module\(s\), (\d+) distinct kernel\(s\) \((\d+) duplicate\(s\) skipped\), "
                     r"(\d+) configuration\(s\) compiled .*; (\d+) failure\(s\)")


def _representative_kernels() -> list:
    """Run the functions through interpreted Triton backends; every KernelSource generated."""
    generated = []
    g = torch.Generator().manual_seed(0)
    row, long = torch.randn(8, 100, generator=g), torch.randn(4, 10000, generator=g)
    cases = [
        (lambda x: torch.sin(x) * 2 + 1, (torch.randn(4096, generator=g),)),  # no mask
        (lambda x, y: torch.relu(x) - y, (torch.randn(1000, generator=g), torch.randn(1000, generator=g))),
        (lambda x: torch.softmax(x, -1), (row,)),  # persistent
        (lambda x, w, b: F.layer_norm(x, (10000,), w, b), (long, long[0], long[1])),  # looped welford
        (lambda x: (x.argmax(-1), x.argmin(-1)), (long,)),  # looped argmax/argmin
        (lambda x: x.sum(0), (torch.randn(20000, 8, generator=g),)),  # column reduction
        (lambda x: x.to(torch.bfloat16).sum(-1), (row,)),
        (lambda x: x.half().amax(-1), (row,)),
        (lambda x: x.cumsum(-1), (torch.randn(4, 300, generator=g),)),
        (lambda x, i, v: x.index_add(0, i, v), (torch.randn(10, 3), torch.tensor([0, 2, 2]), torch.randn(3, 3))),
        (lambda x, i, v: x.scatter_reduce(0, i, v, "amax"), (torch.randn(10), torch.tensor([0, 2, 2]), torch.randn(3))),
        # shifts by a constant count past the width, and by counts read from memory (signed, unsigned)
        (lambda a, b, c: (a >> 64, a << 8, a >> (b % 70), c << 9, c >> (c % 12), b >> 65),
         (torch.tensor([5, -5, 100], dtype=torch.int8), torch.tensor([3, 64, 70]), torch.tensor([1, 9, 200], dtype=torch.uint8))),
        # integer powers, divisions by -1, casts to uint8 and a one-row scan
        (lambda a, b, f: (a ** b, a // b, a % b, torch.fmod(a, b), (f * 1).to(torch.uint8), f.cumsum(0), a + -1),
         (torch.tensor([3, -7, 2], dtype=torch.int32), torch.tensor([3, -1, 5], dtype=torch.int32), torch.tensor([-1.0, 2.5]))),
    ]
    for fn, args in cases:
        generated += _run(TritonBackend(interpret=True), fn, args)
    generated += _run(TritonBackend(interpret=True, bounds_check=True),  # device_assert: a debug build
                      lambda w, i: F.embedding(i, w) * 2, (torch.randn(10, 4), torch.tensor([1, 9])))
    # symbolic sizes: loops over runtime sizes, size parameters in the signature
    backend = _route(TritonBackend(interpret=True))
    fn = lambda x: torch.softmax(x, -1) + x.cumsum(-1)  # noqa: E731
    compiled = torch.compile(fn, backend="coil", dynamic=True)
    for shape in [(3, 7), (2, 1500)]:
        x = torch.randn(shape, generator=g)
        torch.testing.assert_close(compiled(x), fn(x), atol=1e-4, rtol=1e-4)
    generated += [src for src, _ in backend.generated]
    return generated


def _route(backend: TritonBackend) -> TritonBackend:
    backend.device_type = "cpu"
    coil.register_backend_for_device("cpu", backend, name="triton-interpreter-aot")
    return backend


def _run(backend: TritonBackend, fn, args) -> list:
    _route(backend)
    check(fn, *args, atol=2e-2, rtol=2e-2)
    return [src for src, _ in backend.generated]


def _aot(cache_dir: str, tmp_path, *extra: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compile for real, not from a cache
    return subprocess.run([sys.executable, "-m", "coil_cuda_triton.aot", cache_dir, *extra],
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def fresh_registry():
    plugins.reset()
    yield
    plugins.reset()


@pytest.mark.skipif(not triton.knobs.runtime.interpret,
                    reason="Triton's interpreter is off (TRITON_INTERPRET must be set before triton is imported)")
def test_generated_kernels_compile_for_hopper(tmp_path, fresh_registry):
    cache = str(tmp_path / "coil-cache")
    # mathlib.interpreting: undo the interpreter's leftover patches of triton.language, which
    # would break triton.compile later in this process
    with coil.config.override(cache_dir=cache), mathlib.interpreting():
        sources = _representative_kernels()
    distinct = {(s.source, tuple(s.types)): s for s in sources}
    configs = sum(len(set(s.configs)) for s in distinct.values())
    shapes = {s.shape for s in distinct.values()}
    assert {"pointwise", "persistent", "looped", "scan", "serial"} <= shapes
    assert any(s.params[len(s.buffers):] for s in distinct.values()), "no kernel with symbolic sizes"

    done = _aot(cache, tmp_path, "--jobs", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = SUMMARY.search(done.stdout)
    assert summary, done.stdout
    _, kernels, _, compiled, failures = map(int, summary.groups())
    assert (kernels, compiled, failures) == (len(distinct), configs, 0), done.stdout


def test_a_kernel_triton_rejects_fails_the_command(tmp_path):
    folder = tmp_path / "cache" / "triton-source"
    folder.mkdir(parents=True)
    (folder / "coil_bad.py").write_text(
        "@jit\ndef k0_bad(p_in, p_out, XBLOCK: tl.constexpr):\n"
        "    x = tl.arange(0, XBLOCK) + tl.arange(0, 2 * XBLOCK)\n"  # shapes that do not broadcast
        "    tl.store(p_out + x, tl.load(p_in + x))\n")
    kernel = {"name": "k0_bad", "params": ["p_in", "p_out"], "types": ["*fp32", "*fp32"],
              "shape": "pointwise", "buffers": ["in", "out"],
              "configs": [{"xblock": 128, "rblock": 1, "num_warps": 4, "num_stages": 1}]}
    (folder / "coil_bad.json").write_text(json.dumps({"source_path": str(folder / "coil_bad.py"),
                                                      "kernels": [kernel]}))
    done = _aot(str(tmp_path / "cache"), tmp_path, "--jobs", "1")
    assert done.returncode == 1
    assert "FAILED k0_bad [XBLOCK=128" in done.stdout, done.stdout


def test_refuses_to_run_under_the_interpreter(tmp_path):
    done = _aot(str(tmp_path), tmp_path, interpret=True)
    assert done.returncode == 2
    assert "TRITON_INTERPRET" in done.stderr
