"""The C++ plugin built for AVX2 alone (``-mno-avx512f``, see ``tests/isa.py``): the library has
no 512-bit vector instruction, 256-bit ones do the work, and the kernels a model needs (the
row-wise norms and softmax, reductions both ways, bf16 and fp16 computed in float, integer and
boolean kernels, a convolution net's depthwise window, a training step's backward) match
eager. The machine's own build is checked the same way, with 512-bit vectors where the
machine has them."""
from __future__ import annotations

import copy
import subprocess

import pytest
import torch
import torch.nn.functional as F

import coil
import isa
from conftest import TEST_BACKEND
from helpers import check

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cpu_cpp", reason="C++ plugin builds")


@pytest.fixture(params=list(isa.FLAGS))
def built_for(request):
    with isa.built_for(request.param):
        yield request.param


def _libraries(monkeypatch) -> list:
    from coil_cpu_cpp import toolchain
    built = []
    original = toolchain.library_for

    def spy(source, extra_flags=(), key_extra=""):
        path = original(source, extra_flags, key_extra)
        built.append(path)
        return path
    monkeypatch.setattr(toolchain, "library_for", spy)
    return built


def test_vector_width_follows_the_instruction_set(built_for, monkeypatch):
    built = _libraries(monkeypatch)
    x = torch.randn(256, 1000)
    check(lambda x: torch.softmax(x, -1) * torch.erf(x), x)
    (path,) = built
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True,
                          text=True, check=True).stdout
    assert "%ymm" in text
    if built_for == "avx2":
        assert "%zmm" not in text
    elif "avx512f" in isa.cpu_flags():
        assert "%zmm" in text


def test_row_norms_and_softmax(built_for):
    torch.manual_seed(0)
    x = torch.randn(67, 389)
    w, b = torch.randn(389), torch.randn(389)
    check(lambda x: F.layer_norm(x, (389,), w, b), x, atol=1e-5, rtol=1e-5)
    check(lambda x: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w, x)
    check(lambda x: torch.log_softmax(x, -1), x)
    xb = x.to(torch.bfloat16)
    check(lambda x: torch.softmax(x, -1), xb, atol=1e-2, rtol=1e-2)


def test_reductions_both_ways(built_for):
    torch.manual_seed(0)
    x = torch.randn(131, 517)
    check(lambda x: (x.sum(-1), x.sum(0), x.amax(0), x.argmax(-1)), x, atol=1e-4, rtol=1e-5)
    check(lambda x: torch.var_mean(x, 0), x, atol=1e-5, rtol=1e-4)


def test_half_integer_and_boolean_kernels(built_for):
    torch.manual_seed(0)
    a, b = torch.randn(1003), torch.randn(1003)
    check(lambda a, b: F.gelu(a + b) * b, a.to(torch.bfloat16), b.to(torch.bfloat16), atol=1e-2, rtol=1e-2)
    check(lambda a, b: torch.sigmoid(a) * torch.exp(b), a.half(), b.half(), atol=1e-3, rtol=1e-3)
    i = torch.randint(-1000, 1000, (1003,), dtype=torch.int32)
    check(lambda i: (i * 3 - (i >> 2), torch.where(i > 0, i % 7, -i)), i)
    check(lambda a, b: ((a > b) & (b < 0.5)) | torch.isnan(a / b), a, b)


def test_depthwise_window_and_a_training_step(built_for):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.BatchNorm2d(8),
                              torch.nn.Hardswish(), torch.nn.Flatten(), torch.nn.Linear(8 * 9 * 9, 10))
    ref = copy.deepcopy(net)
    x, y = torch.randn(4, 8, 9, 9), torch.randint(0, 10, (4,))
    compiled = torch.compile(net, backend="coil")
    F.cross_entropy(compiled(x), y).backward()
    F.cross_entropy(ref(x), y).backward()
    for got, want in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-5, rtol=1e-4)



def test_bf16_round_trip_in_float_lanes(built_for):
    """``float -> bf16 -> float`` (eager's rounding between two bf16 ops) is one float-lane
    rounding in the kernel, bit-equal to eager's round trip: 2^22 random bit patterns, the
    halfway cases, the largest finite values, infinities and NaNs (NaN only as NaN: both
    make one canonical NaN, ATen's vector and scalar conversions not the same one)."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31, (1 << 22,), dtype=torch.int64, generator=g).to(torch.int32)
    special = torch.tensor([0x3f808000, 0x3f818000, 0x3f80_7fff, 0x7f7f_ffff, -0x0080_0001,
                            0x7f80_0000, -0x0080_0000, 0x7f80_0001, 0x7fc0_0000, 0x0000_8000,
                            0x0001_8000, 0x0000_0001], dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits, special]).view(torch.float32)
    fn = lambda x: x.to(torch.bfloat16).to(torch.float32) * 1.5  # noqa: E731
    report = coil.explain(fn, x)
    assert "coil::round_bf16" in report.kernels[0].source
    want = fn(x)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(report.result), nan)
    assert torch.equal(report.result[~nan].view(torch.int32), want[~nan].view(torch.int32))
