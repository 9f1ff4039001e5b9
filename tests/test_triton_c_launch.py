"""The Triton plugin's C launcher (``coil_cuda_triton.c_launch``), checked against a fake
``cuLaunchKernel`` that records what it is given: the parameter block must be the one the
ctypes launcher builds (pointers and 64-bit sizes in 8 bytes, 32-bit sizes in 4, Triton's two
null scratch pointers), misaligned pointers must not launch an aligned build, and errors must
surface. The extension is built with the host C compiler, as on the GPU machine."""
from __future__ import annotations

import ctypes

import pytest
import torch

pytest.importorskip("triton")
from coil_cuda_triton import c_launch, raw_launch  # noqa: E402

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
WIDTHS = {"p": ctypes.c_uint64, "l": ctypes.c_int64, "i": ctypes.c_int32}


class FakeDriver:
    """Records each launch: (function, grid, threads, shared, stream, parameter values)."""

    def __init__(self, codes: str, error: int = 0) -> None:
        self.codes = codes + "pp"  # Triton's scratch pointers
        self.error = error
        self.calls: list[tuple] = []
        self.fn = LAUNCH(self._launch)

    def _launch(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = [WIDTHS[c].from_address(params[i]).value for i, c in enumerate(self.codes)]
        self.calls.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, values, extra))
        return self.error

    def address(self) -> int:
        return ctypes.cast(self.fn, ctypes.c_void_p).value


@pytest.fixture
def extension():
    module = c_launch.built()
    if module is None:
        pytest.skip(f"the C launcher cannot be built here: {c_launch.failure()}")
    try:
        yield module
    finally:
        c_launch._driver_set = False  # a real launch later in this process sets the real driver


def _aligned(n: int) -> torch.Tensor:
    t = torch.empty(n + 8, dtype=torch.float32)
    offset = (-t.data_ptr() % 16) // 4
    return t[offset:offset + n]


def test_the_parameter_block_matches_the_signature(extension):
    driver = FakeDriver("ppili")
    extension.set_driver(driver.address())
    a, b = _aligned(8), _aligned(8)
    plan = c_launch.plan(0xABC0, 128, 4096, True, ["*fp32", "*bf16", "i32", "i64", "i32"])
    assert extension.launch(plan, 7, 0x51, (a, b, -3, 1 << 40, 2**31 - 1)) is True
    (f, grid, block, shared, stream, values, extra), = driver.calls
    assert (f, grid, block, shared, stream, extra) == (0xABC0, (7, 1, 1), (128, 1, 1), 4096, 0x51, None)
    assert values == [a.data_ptr(), b.data_ptr(), -3, 1 << 40, 2**31 - 1, 0, 0]


def test_misaligned_pointers_do_not_launch_an_aligned_build(extension):
    driver = FakeDriver("pp")
    extension.set_driver(driver.address())
    a = _aligned(8)
    odd = a[1:]  # 4 bytes past a 16-byte boundary
    aligned = c_launch.plan(1, 32, 0, True, ["*fp32", "*fp32"])
    for off in (1, 2, 3):  # 4, 8 and 12 bytes past
        assert extension.launch(aligned, 1, 0, (a, a[off:])) is False and driver.calls == []
    unaligned = c_launch.plan(1, 32, 0, False, ["*fp32", "*fp32"])
    assert extension.launch(unaligned, 1, 0, (a, odd)) is True
    assert driver.calls[0][5][:2] == [a.data_ptr(), odd.data_ptr()]


def test_an_empty_grid_launches_nothing(extension):
    driver = FakeDriver("p")
    extension.set_driver(driver.address())
    assert extension.launch(c_launch.plan(1, 32, 0, True, ["*fp32"]), 0, 0, (_aligned(4),)) is True
    assert driver.calls == []


def test_errors_surface(extension):
    driver = FakeDriver("p", error=700)
    extension.set_driver(driver.address())
    plan = c_launch.plan(1, 32, 0, True, ["*fp32"])
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        extension.launch(plan, 1, 0, (_aligned(4),))
    with pytest.raises(ValueError, match="1 parameters, launched with 2"):
        extension.launch(plan, 1, 0, (_aligned(4), 3))
    with pytest.raises(AttributeError):  # not a tensor where a pointer goes
        extension.launch(plan, 1, 0, (3,))
    with pytest.raises(TypeError):
        c_launch.plan(1, 32, 0, True, ["*fp32", "fp32"])


def test_the_ctypes_and_c_paths_launch_the_same_block(extension, monkeypatch):
    """A ``RawLauncher`` built either way hands the driver the same call."""
    types = ["*fp32", "*fp32", "i64", "i32"]
    args = (_aligned(8), _aligned(8), 5, 6)
    seen = []
    for path in ("c", "ctypes"):
        driver = FakeDriver("ppli")
        lib = type("Lib", (), {"cuLaunchKernel": driver.fn})()
        monkeypatch.setattr(raw_launch, "_driver", lib)
        monkeypatch.setenv("COIL_TRITON_LAUNCHER", path)
        c_launch._driver_set = False
        launcher = _launcher(types)
        assert launcher.run(9, 0x77, args) is True
        assert launcher.run(9, 0x77, (args[0][1:],) + args[1:]) is False  # misaligned: no launch
        seen.append(driver.calls)
    assert seen[0] == seen[1] and len(seen[0]) == 1


def _launcher(types: list[str]) -> raw_launch.RawLauncher:
    """A ``RawLauncher`` for a made-up binary (its constructor loads a real one on a GPU)."""
    launcher = raw_launch.RawLauncher.__new__(raw_launch.RawLauncher)
    launcher.function, launcher.threads, launcher.shared, launcher.aligned = 0x1230, 64, 0, True
    launcher.choose_path(types)
    return launcher
