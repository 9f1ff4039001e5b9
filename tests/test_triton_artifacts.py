"""Compiled Triton binaries in the Triton plugin's exported modules (graph-cache entries and
artifact bundles), on a machine with no GPU: a kernel built for Hopper
(``GPUTarget("cuda", 90, 32)``) travels as bytes, is installed into an empty Triton cache on
a "machine" whose GPU is Hopper, and the next build of that kernel is a cache hit with the
same cubin; a binary for another GPU or Triton version is refused with the reason and
nothing is installed. Nothing is launched."""
from __future__ import annotations

import logging
import pickle
from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.cache import get_cache_manager  # noqa: E402

import coil  # noqa: E402
from coil.sdk import cachestats  # noqa: E402
from coil_cuda_triton import artifacts, mathlib  # noqa: E402
from coil_cuda_triton.configs import Config  # noqa: E402
from coil_cuda_triton.launch import HOPPER, Launcher, compile_for  # noqa: E402

SOURCE = """
@triton.jit
def coil_twice(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out_ptr0 + x, tl.load(in_ptr0 + x, mask=x < xnumel) * 2.0, mask=x < xnumel)
"""
SRC = SimpleNamespace(name="coil_twice", params=("in_ptr0", "out_ptr0", "xnumel"), types=("*fp32", "*fp32", "i32"),
                      shape="pointwise", buffers=("in_ptr0", "out_ptr0"))
CFG = Config(128, num_warps=4)


def _build(on_cache=None):
    fn = mathlib.load_source(SOURCE, interpret=False)["coil_twice"]
    return compile_for(fn, SRC, CFG, target=GPUTarget(*HOPPER), on_cache=on_cache)


@pytest.fixture
def hopper_binary(tmp_path, monkeypatch):
    """A Hopper build made in one Triton cache, as bytes; afterwards Triton's cache is an
    empty folder (the other machine's)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "machine1"))
    built = _build()
    binary = pickle.loads(pickle.dumps(artifacts.Binary.of(built)))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "machine2"))
    return built, binary


def _in_cache(binary: artifacts.Binary) -> bool:
    return get_cache_manager(binary.hash).get_group(binary.metadata_file) is not None


def test_a_binary_travels_and_the_next_build_is_a_cache_hit(hopper_binary):
    built, binary = hopper_binary
    assert binary.target == HOPPER and binary.triton_version == triton.__version__
    assert set(binary.files) == {"coil_twice.json", "coil_twice.cubin"}  # no IR, no PTX
    assert binary.files["coil_twice.cubin"] == built.asm["cubin"]
    assert not _in_cache(binary)
    installed, refused = artifacts.install_all([binary], "graph0", HOPPER, triton.__version__)
    assert (installed, refused) == (1, []) and _in_cache(binary)
    hits = []
    again = _build(on_cache=hits.append)
    assert hits == [True]  # Triton found it: nothing was rebuilt from source
    assert again.asm["cubin"] == built.asm["cubin"] and again.hash == binary.hash
    assert artifacts.install_all([binary], "graph0", HOPPER, triton.__version__) == (0, [])  # already there


@pytest.mark.parametrize("here, version, reason", [
    (("cuda", 80, 32), None, "built for cuda arch 90 (warp size 32), this GPU is cuda arch 80"),
    (None, None, "this machine has no GPU"),
    (HOPPER, "0.0.1", "this is Triton 0.0.1"),
])
def test_a_binary_for_another_target_is_refused_with_the_reason(hopper_binary, here, version, reason, caplog):
    _, binary = hopper_binary
    with caplog.at_level(logging.WARNING, logger="coil_cuda_triton.artifacts"):
        installed, refused = artifacts.install_all([binary], "graph7", here, version or triton.__version__)
    assert installed == 0 and len(refused) == 1 and reason in refused[0]
    assert not _in_cache(binary)
    assert "graph7" in caplog.text and reason in caplog.text and "from source" in caplog.text
    hits = []
    _build(on_cache=hits.append)
    assert hits == [False]  # built from source, as on a miss


def test_a_build_is_counted_in_the_kernel_layer(hopper_binary):
    _, binary = hopper_binary
    from coil_cuda_triton.launch import count_build
    before = cachestats.snapshot()
    _build(on_cache=count_build)  # machine2's cache is empty: a miss
    _build(on_cache=count_build)  # a hit
    got = cachestats.snapshot() - before
    assert (got.get("kernel", "miss", "triton"), got.get("kernel", "hit", "triton")) == (1, 1)


@pytest.fixture
def fresh_registry():
    from coil import plugins
    plugins.reset()
    yield
    plugins.reset()


def test_exported_modules_carry_their_launchers_binaries(hopper_binary, fresh_registry, monkeypatch, caplog):
    """``export_module`` puts each build its launchers hold into the module's bytes, and
    ``import_module`` installs those that fit this machine (the interpreted backend stands in
    for the GPU one; the launchers' builds are the Hopper one)."""
    built, binary = hopper_binary
    from coil_cuda_triton.testing import interpreted_backend
    backend = interpreted_backend()
    modules = []
    original = backend.compile
    monkeypatch.setattr(backend, "compile", lambda ks, name: modules.append(original(ks, name)) or modules[-1])
    coil.register_backend_for_device("cpu", backend, name="artifacts-triton")
    x = torch.randn(64)
    with coil.config.override(graph_cache=False):
        torch.compile(lambda a: (a * 2).sin() + 1, backend="coil")(x)
    [module] = modules
    assert pickle.loads(backend.export_module(module))["binaries"] == []  # interpreted: no builds

    monkeypatch.setattr(Launcher, "built", lambda self: [built])
    data = backend.export_module(module)
    [carried] = pickle.loads(data)["binaries"]
    assert carried.files == binary.files and carried.hash == binary.hash

    monkeypatch.setattr(artifacts, "current_target", lambda: ("cuda", 80, 32))
    with caplog.at_level(logging.WARNING, logger="coil_cuda_triton.artifacts"):
        assert backend.import_module(data, "graph1") is not None  # still usable: builds from source
    assert not _in_cache(binary) and "this GPU is cuda arch 80" in caplog.text

    monkeypatch.setattr(artifacts, "current_target", lambda: HOPPER)
    assert backend.import_module(data, "graph2") is not None
    assert _in_cache(binary)
