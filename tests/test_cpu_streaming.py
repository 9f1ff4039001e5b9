"""The C++ plugin's streaming stores (plugins/cpu_cpp/streaming.py) against eager: with the
last-level cache taken as 4 KiB, small kernels stream their outputs, so every loop shape
that streams (a flat loop shared by threads, rows, a reduction's last pass) runs here at
sizes that are and are not whole lines, on outputs that are and are not line-aligned, in
the dtypes a line holds, with one and two threads, built for the machine and for AVX2; and the loops that must not stream (a
softmax's last pass reading its stash, a short row) do not."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import coil  # noqa: F401  (registers the backend)
from coil_cpu_cpp import streaming

import isa
from conftest import TEST_BACKEND
from helpers import check

pytestmark = pytest.mark.skipif(TEST_BACKEND != "cpu_cpp", reason="C++ plugin codegen")


LLC_BYTES = streaming.llc_bytes  # the real one, before the fixture below replaces it


@pytest.fixture(autouse=True)
def _small_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "llc_bytes", lambda: 4096)


def _streams(report: coil.explain) -> list[str]:
    return [k.source for k in report.kernels if "coil::stream_line" in k.source]


@pytest.fixture(params=list(isa.FLAGS))
def built_for(request: pytest.FixtureRequest):
    with isa.built_for(request.param):
        yield request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32])
def test_a_flat_pointwise_loop_streams(threads: int, dtype: torch.dtype, built_for: str) -> None:
    x = (torch.randn(40000) * 10).to(dtype)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    r = check(lambda x: x * 3 + 1, x, atol=tol, rtol=tol)
    assert len(_streams(r)) == 1
    assert "coil::stream_fence" in _streams(r)[0]


def test_rows_stream_and_a_misaligned_output_falls_back_to_plain_stores(threads: int, built_for: str) -> None:
    x, b = torch.randn(96, 512), torch.randn(512)
    r = check(lambda x, b: F.gelu(x + b) * x, x, b)
    assert len(_streams(r)) == 1
    out = torch.empty(96 * 512 + 3)[3:].view(96, 512)  # 12 bytes past a line: no line aligned

    def into(x: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.copy_(F.gelu(x + b) * x)
        return out

    got = torch.compile(into, backend="coil")(x, b, out)
    torch.testing.assert_close(got, F.gelu(x + b) * x)
    torch.testing.assert_close(out, F.gelu(x + b) * x)


@pytest.mark.parametrize("fn", [
    lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
    lambda x, w: F.layer_norm(x, (x.shape[-1],), w, w * 0.5),
], ids=["rmsnorm", "layernorm"])
def test_a_reductions_last_pass_streams(threads: int, fn) -> None:
    x, w = torch.randn(64, 1024), torch.randn(1024)
    r = check(fn, x, w, atol=1e-4, rtol=1e-4)
    assert len(_streams(r)) == 1
    view = torch.randn(64, 1040)[:, 16:]  # rows 64 bytes past the previous row's end
    check(fn, view, w, atol=1e-4, rtol=1e-4)


def test_rows_that_are_not_whole_lines_or_too_short_do_not_stream() -> None:
    x = torch.randn(300, 1000)  # 4000 bytes: not a whole number of lines
    assert not _streams(check(lambda x: x.sin() * 2, x[:, :999].contiguous()))
    y = torch.randn(2000, 64)  # 256-byte rows: shorter than a fence is worth
    assert not _streams(check(lambda x, b: x * b, y, torch.randn(64)))


def test_softmax_keeps_its_exponentials_in_the_output_and_does_not_stream() -> None:
    x = torch.randn(64, 1024)
    r = check(lambda x: torch.softmax(x, -1), x)
    assert not _streams(r)


def test_in_place_updates_stream_over_their_input(threads: int) -> None:
    x = torch.randn(50000)

    def fn(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2).add_(1)
        return x

    got = torch.compile(fn, backend="coil")(x.clone())
    torch.testing.assert_close(got, x * 2 + 1)


def test_the_option_turns_streaming_off() -> None:
    x = torch.randn(40000)
    with coil.config.override(**{"cpu_cpp.streaming": False}):
        assert not _streams(check(lambda x: x * 3 + 1, x))


def test_the_cache_counted_is_at_most_a_share_per_cpu(tmp_path, monkeypatch):
    """A VM of two CPUs reporting its host's 480 MiB of L3 counts 32 MiB (16 MiB per CPU
    sharing it), so big kernels stream there as on a machine of that size; a cache at most
    that per CPU counts whole."""
    assert streaming._cpu_count("0-1") == 2 and streaming._cpu_count("0-3,8,10-11") == 7
    assert streaming._cpu_count("") == 1
    root = tmp_path / "cache"
    for name, level, size, shared in (("index0", 1, "48K", "0"), ("index3", 3, "491520K", "0-1")):
        (root / name).mkdir(parents=True)
        (root / name / "level").write_text(f"{level}\n")
        (root / name / "size").write_text(f"{size}\n")
        (root / name / "shared_cpu_list").write_text(f"{shared}\n")
    real = streaming.Path
    monkeypatch.setattr(streaming, "Path", lambda p: root if "cpu0/cache" in str(p) else real(p))
    read = getattr(LLC_BYTES, "__wrapped__", LLC_BYTES)  # past the process-wide memo
    assert read() == 32 << 20
    (root / "index3" / "size").write_text("16384K\n")
    assert read() == 16 << 20
