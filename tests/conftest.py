"""Shared fixtures: a per-session Coil cache directory and fresh Dynamo state per test."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Without a GPU, Triton kernels run under Triton's interpreter, which must be chosen before
# triton is first imported (importing torch's Dynamo imports it).
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# A fresh cache per test process unless the caller names one (the interpreted pass does, to
# build its kernels ahead of time afterwards). pytest-xdist's workers (CI runs two) inherit
# the controller's environment: each makes its own, so a test that counts compiles never
# sees its neighbour's entries.
# The folder goes when the process ends (a named one stays: the caller reads it afterwards).
if "COIL_CACHE_DIR" not in os.environ or os.environ.get("COIL_TEST_OWN_CACHE"):
    os.environ["COIL_TEST_OWN_CACHE"] = "1"
    os.environ["COIL_CACHE_DIR"] = tempfile.mkdtemp(prefix="coil-test-cache-")
    atexit.register(shutil.rmtree, os.environ["COIL_CACHE_DIR"], ignore_errors=True)

#: ``COIL_TEST_DEVICE=cuda`` makes new tensors CUDA tensors by default, so the differential
#: tests (``tests/test_compile.py``, ``tests/test_training.py``) run on the GPU, through the
#: Triton plugin, against eager on the GPU. Other files build their own inputs: run them
#: without it (``tests/test_triton_mathlib.py`` makes CPU generators, which it rejects).
if os.environ.get("COIL_TEST_DEVICE"):
    torch.set_default_device(os.environ["COIL_TEST_DEVICE"])

#: ``COIL_TEST_BACKEND=triton`` routes the ``cpu`` device to the Triton plugin under
#: Triton's interpreter, so the differential tests check the Triton kernels too.
TEST_BACKEND = os.environ.get("COIL_TEST_BACKEND", "cpu_cpp")


@pytest.fixture(autouse=True)
def _route_backend():
    if TEST_BACKEND != "triton":
        yield
        return
    import coil
    from coil_cuda_triton.testing import interpreted_backend
    coil.register_backend_for_device("cpu", interpreted_backend(), name="triton-interpreter")
    yield


@pytest.fixture(autouse=True)
def _no_graph_cache(request):
    """Tests compile afresh: a graph-cache hit would skip the code a test patches or observes
    (a recorded ``library_for``, a progress line). The graph cache's own tests (marker
    ``graph_cache``) keep it on; subprocesses read the environment and keep it on too."""
    if request.node.get_closest_marker("graph_cache"):
        yield
        return
    from coil import config
    with config.override(graph_cache=False):
        yield


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def traces(monkeypatch):
    """Counts AOTAutograd traces of Coil's backend (the layers before AOTAutograd skip them)."""
    import coil.backend as coil_backend
    calls: list[int] = []
    real = coil_backend.aot_module_simplified

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(coil_backend, "aot_module_simplified", counted)
    return calls


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request: pytest.FixtureRequest):
    """Run the test with one and with two threads (``torch.set_num_threads``), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
