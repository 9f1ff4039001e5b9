"""Golden files of the Triton generated for a few canonical graphs, as the GPU gets it
(libdevice math, native bf16 rounding), beside the C++ plugin's (tests/test_golden.py): an
unintended change to the Triton plugin's codegen shows up as a diff here. The graphs run under
Triton's interpreter; the GPU spelling of each kernel is what the backend records for the
ahead-of-time build. Regenerate with ``COIL_UPDATE_GOLDEN=1 pytest tests/test_golden_triton.py``
after checking that the new code is what you meant."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

import coil  # noqa: E402
from coil import plugins  # noqa: E402
from coil_cuda_triton import mathlib  # noqa: E402
from coil_cuda_triton.backend import TritonBackend  # noqa: E402
from helpers import matches_golden  # noqa: E402

GOLDEN = Path(__file__).with_name("golden") / "triton"

CASES = {
    "pointwise_chain": (lambda x: torch.sigmoid(x * 2 + 1) - x.abs(), lambda: (torch.randn(1024),)),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(64, 256),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (256,), w, b),
                   lambda: (torch.randn(64, 256), torch.randn(256), torch.randn(256))),
    "layer_norm_looped": (lambda x: F.layer_norm(x, (10000,)), lambda: (torch.randn(4, 10000),)),
    "sum_first_dim": (lambda x: x.sum(0), lambda: (torch.randn(64, 256),)),
    "column_mean_split": (lambda x: x.mean(0), lambda: (torch.randn(4096, 48),)),
    "channel_var_mean_split": (lambda x: torch.var_mean(x, (0, 2, 3), correction=0),
                               lambda: (torch.randn(6, 5, 61, 67),)),
    "transpose_add": (lambda x, y: x.t() + y, lambda: (torch.randn(96, 80), torch.randn(80, 96))),
    "bf16_gelu": (lambda x: F.gelu(x.to(torch.bfloat16) * 2, approximate="tanh"), lambda: (torch.randn(512),)),
}


@pytest.fixture(autouse=True)
def _interpreted():
    if not triton.knobs.runtime.interpret:
        pytest.skip("Triton's interpreter is off (tests/conftest.py sets TRITON_INTERPRET where there is no GPU)")
    with mathlib.interpreting():
        yield


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_triton_matches_golden(case, monkeypatch):
    recorded: list[str] = []
    gpu = TritonBackend(interpret=False)

    def twin(self, kernels, graph_name):  # the GPU spelling of each kernel, as AOT builds it
        recorded.extend(s.source.rstrip() for k in kernels for s in gpu.generate(k))

    monkeypatch.setattr(TritonBackend, "_record_gpu_twin", twin)
    plugins.reset()
    backend = TritonBackend(interpret=True)
    backend.device_type = "cpu"
    coil.register_backend_for_device("cpu", backend, name="triton-golden")
    try:
        fn, make = CASES[case]
        args = make()
        with coil.config.override(graph_cache=False):
            report = coil.explain(fn, *args)
        torch.testing.assert_close(report.result, fn(*args), atol=1e-4, rtol=1e-2)
    finally:
        plugins.reset()
    assert recorded, "no kernel reached the Triton backend"
    text = "\n\n".join(recorded) + "\n"
    path = GOLDEN / f"{case}.py"
    matches_golden(text, path, f"generated Triton for {case}")
