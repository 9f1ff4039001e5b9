"""Launching a compiled Triton kernel through the CUDA driver with ctypes.

Triton's own launcher is a C extension it builds with the host compiler for each new kernel
signature, the first time one runs: about half a second each on a cold cache, which would
dominate a cold compile. The driver call it makes is ``cuLaunchKernel`` with one pointer per
parameter, which ctypes can make directly: the binary is loaded with Triton's already-built
driver utilities, and each launch only refreshes the parameter values in place."""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

_driver: Any = None


def _cuda() -> Any:
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuLaunchKernel.restype = ctypes.c_int
        _driver = lib
    return _driver


def usable(binary: Any) -> bool:
    """Whether a binary needs nothing but its parameters (no scratch memory, no clusters)."""
    md = binary.metadata
    return (getattr(md, "global_scratch_size", 0) == 0 and getattr(md, "profile_scratch_size", 0) == 0
            and getattr(md, "num_ctas", 1) == 1 and not getattr(md, "launch_cooperative_grid", False)
            and not getattr(md, "launch_pdl", False))


class RawLauncher:
    """``launcher(grid, stream, ptrs, sizes)`` for one binary; ``types`` are the signature
    types of the non-constexpr parameters (``*fp32``, ``i64``...), pointers first."""

    def __init__(self, binary: Any, types: Sequence[str]) -> None:
        from triton.runtime.driver import driver
        device = driver.active.get_current_device()
        md = binary.metadata
        _, self.function, _, _, _ = driver.active.utils.load_binary(binary.name, binary.kernel, md.shared, device)
        self.threads = 32 * md.num_warps
        self.shared = md.shared
        self.is_ptr = [t.startswith("*") for t in types]
        self.values: list[Any] = [ctypes.c_uint64() if p or t == "i64" else ctypes.c_int32()
                                  for p, t in zip(self.is_ptr, types)]
        if any(t not in ("i64", "i32") and not p for p, t in zip(self.is_ptr, types)):
            raise TypeError(f"unsupported parameter types {types}")
        self.values += [ctypes.c_uint64(0), ctypes.c_uint64(0)]  # global and profile scratch
        self.params = (ctypes.c_void_p * len(self.values))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in self.values])
        self.launch = _cuda().cuLaunchKernel

    def __call__(self, grid: int, stream: int, ptrs: Sequence[int], sizes: Sequence[int]) -> None:
        """Launch with the pointer values (already read) and the size arguments."""
        values = self.values
        for i, v in enumerate((*ptrs, *sizes)):
            values[i].value = v
        err = self.launch(self.function, grid, 1, 1, self.threads, 1, 1, self.shared, stream, self.params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {err}")
