"""Launching a compiled Triton kernel through the CUDA driver.

Triton's own launcher is a C extension it builds with the host compiler for each new kernel
signature, the first time one runs: about half a second each on a cold cache, which would
dominate a cold compile. The driver call it makes is ``cuLaunchKernel`` with one pointer per
parameter. Coil makes that call through one C extension for every signature
(:mod:`.c_launch`, built once per machine), or, where that cannot be built or
``COIL_TRITON_LAUNCHER=ctypes`` asks, through ctypes: the binary is loaded with Triton's
already-built driver utilities, and each launch only refreshes the parameter values in
place."""
from __future__ import annotations

import ctypes
import functools
import operator
import os
from typing import Any, Sequence

import coil.sdk as sdk

from . import c_launch

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


def _driver_address() -> int:
    return c_launch.address_of(_cuda().cuLaunchKernel)


def use_c() -> bool:
    """Whether launches go through the C launcher (:mod:`.c_launch`): yes, unless
    ``COIL_TRITON_LAUNCHER=ctypes`` asks for the ctypes path (for comparison)."""
    return os.environ.get("COIL_TRITON_LAUNCHER", "c") != "ctypes"


def warm_up() -> None:
    """Start building the C launcher in the background."""
    if use_c():
        c_launch.start()


def check() -> sdk.Check:
    """``coil doctor``'s line on the launcher in use."""
    if not use_c():
        return sdk.Check("launcher", True, "ctypes (COIL_TRITON_LAUNCHER=ctypes)")
    built = c_launch.built() is not None
    return sdk.Check("launcher", built, "C extension" if built else
                     f"ctypes: the C launcher could not be built ({c_launch.failure()})")


def usable(binary: Any) -> bool:
    """Whether a binary needs nothing but its parameters (no scratch memory, no clusters)."""
    md = binary.metadata
    return (getattr(md, "global_scratch_size", 0) == 0 and getattr(md, "profile_scratch_size", 0) == 0
            and getattr(md, "num_ctas", 1) == 1 and not getattr(md, "launch_cooperative_grid", False)
            and not getattr(md, "launch_pdl", False))


class Params:
    """The parameter block of one launch, filled in place: ``params`` (a ``void**``) points at
    one slot per parameter, pointers and 64-bit sizes in one ``uint64`` array (filled by a
    single slice assignment, in C), 32-bit sizes in an ``int32`` array, then Triton's two
    scratch pointers (always null here)."""

    def __init__(self, types: Sequence[str]) -> None:
        if any(not t.startswith("*") and t not in ("i64", "i32") for t in types):
            raise TypeError(f"unsupported parameter types {types}")
        self.n_ptrs = sum(t.startswith("*") for t in types)
        sizes = list(types[self.n_ptrs:])
        if any(t.startswith("*") for t in sizes):
            raise TypeError(f"pointers must come first: {types}")
        self.wide = (ctypes.c_uint64 * (self.n_ptrs + 2 + sum(t == "i64" for t in sizes)))()
        self.narrow = (ctypes.c_int32 * max(1, sum(t == "i32" for t in sizes)))()
        slots: list[int] = [ctypes.addressof(self.wide) + 8 * i for i in range(self.n_ptrs)]
        #: per size argument: (array, index)
        self.size_slots: list[tuple[Any, int]] = []
        wide_next, narrow_next = self.n_ptrs + 2, 0
        for t in sizes:
            if t == "i64":
                self.size_slots.append((self.wide, wide_next))
                slots.append(ctypes.addressof(self.wide) + 8 * wide_next)
                wide_next += 1
            else:
                self.size_slots.append((self.narrow, narrow_next))
                slots.append(ctypes.addressof(self.narrow) + 4 * narrow_next)
                narrow_next += 1
        slots += [ctypes.addressof(self.wide) + 8 * self.n_ptrs, ctypes.addressof(self.wide) + 8 * (self.n_ptrs + 1)]
        self.params = (ctypes.c_void_p * len(slots))(*slots)

    def fill(self, ptrs: Sequence[int], sizes: Sequence[int]) -> None:
        self.wide[:self.n_ptrs] = ptrs
        for (array, i), v in zip(self.size_slots, sizes):
            array[i] = v


class RawLauncher:
    """Launches one binary; ``types`` are the signature types of the non-constexpr parameters
    (``*fp32``, ``i64``...), pointers first, and ``aligned`` whether the binary was built for
    16-byte aligned pointers.

    ``run(grid, stream, args)`` launches with the launch's own tensors and sizes and returns
    False, launching nothing, when a pointer the binary assumes aligned is not. It is the C
    launcher's ``launch`` bound to this binary's plan where that extension is built, else the
    ctypes path below (:meth:`run_ctypes`)."""

    def __init__(self, binary: Any, types: Sequence[str], aligned: bool = True) -> None:
        from triton.runtime.driver import driver  # optional: only with a GPU build to launch
        device = driver.active.get_current_device()
        md = binary.metadata
        _, self.function, _, _, _ = driver.active.utils.load_binary(binary.name, binary.kernel, md.shared, device)
        self.threads = 32 * md.num_warps
        self.shared = md.shared
        self.aligned = aligned
        self.choose_path(types)

    def choose_path(self, types: Sequence[str]) -> None:
        """Bind ``run`` to the C launcher, or to the ctypes path (its parameter block and the
        driver function) where it is not built."""
        compiled = c_launch.module(_driver_address) if use_c() else None
        if compiled is not None:
            self.run = functools.partial(compiled.launch,
                                         c_launch.plan(self.function, self.threads, self.shared, self.aligned, types))
        else:
            self.block = Params(types)
            self.launch = _cuda().cuLaunchKernel
            self.run = self.run_ctypes

    def run_ctypes(self, grid: int, stream: int, args: Sequence[Any]) -> bool:
        n = self.block.n_ptrs
        ptrs = [a.data_ptr() for a in args[:n]]
        if self.aligned and functools.reduce(operator.or_, ptrs, 0) & 15:
            return False
        if grid:
            self(grid, stream, ptrs, args[n:])
        return True

    def __call__(self, grid: int, stream: int, ptrs: Sequence[int], sizes: Sequence[int]) -> None:
        """Launch with the pointer values (already read) and the size arguments."""
        block = self.block
        block.fill(ptrs, sizes)
        err = self.launch(self.function, grid, 1, 1, self.threads, 1, 1, self.shared, stream, block.params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {err}")
