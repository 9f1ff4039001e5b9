"""Launch configurations the autotuner chooses from: block sizes, warps and pipeline stages
per kernel shape, and the size bucket a symbolic launch falls in.

The candidates are few on purpose: every candidate is one more compilation on a cold
cache. They are the shapes that win on Hopper for memory-bound kernels (wide blocks with
enough warps to keep 128-bit loads in flight), sized down for small problems. Each list
starts with the candidate that, made every kernel's choice, came closest to the winners
on the H200's model suite (tuning results of GPT-2, Llama, ConvNeXt-atto and EfficientNet-B0;
docs/benchmarks.md): a kernel that the graph's build budget leaves untuned
(:mod:`.build_budget`) builds and launches that one alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an import cycle: source.py imports this module for Config
    from .source import KernelShape


@dataclass(frozen=True)
class Config:
    xblock: int
    rblock: int = 1
    num_warps: int = 4
    num_stages: int = 1
    #: Template kernels: the inner dim's block and the tile-group height (0: not a template).
    kblock: int = 0
    group_m: int = 0

    def constexprs(self, reduction: bool) -> dict[str, int]:
        if self.kblock:
            return {"XBLOCK": self.xblock, "RBLOCK": self.rblock, "KBLOCK": self.kblock,
                    "GROUP_M": self.group_m}
        return {"XBLOCK": self.xblock, "RBLOCK": self.rblock} if reduction else {"XBLOCK": self.xblock}

    def __str__(self) -> str:
        if self.xblock == 0:
            return "library"
        k = f" KBLOCK={self.kblock} GROUP_M={self.group_m}" if self.kblock else ""
        return f"XBLOCK={self.xblock} RBLOCK={self.rblock}{k} warps={self.num_warps} stages={self.num_stages}"


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _warps(elements: int, per_thread: int = 8, most: int = 16) -> int:
    """Warps so each thread holds about ``per_thread`` elements of a block."""
    w = max(1, elements // (32 * per_thread))
    return min(most, pow2_at_least(w))


def candidates(shape: KernelShape, xnumel: int | None, rnumel: int | None, x_contiguous: bool) -> list[Config]:
    """Configurations to try for a kernel (``None``: a symbolic size)."""
    if shape == "pointwise":
        return _pointwise(xnumel)
    if shape == "persistent":
        assert rnumel is not None
        return _persistent(xnumel, rnumel)
    return _looped(xnumel, rnumel, x_contiguous)


def _pointwise(n: int | None) -> list[Config]:
    if n is not None and n <= 1024:
        block = max(16, pow2_at_least(n))
        return [Config(block, num_warps=_warps(block, per_thread=4, most=4))]
    if n is not None and n < 2**20:  # too few blocks to fill the GPU with wide ones
        return [Config(1024, num_warps=4)]
    return [Config(1024, num_warps=4), Config(2048, num_warps=8)]


def _persistent(xnumel: int | None, rnumel: int) -> list[Config]:
    r = pow2_at_least(rnumel)
    if r >= 2048:
        # long rows: one row per program with fewer or more warps, or a few rows per program
        # (more loads in flight per thread, which short dtypes need to reach full bandwidth)
        out = [Config(1, r, num_warps=_warps(r) // 2 or 1), Config(1, r, num_warps=_warps(r))]
        if r <= 4096 and (xnumel is None or xnumel >= 4):
            out.append(Config(4, r, num_warps=16))
        return list(dict.fromkeys(out))
    out: list[Config] = []
    for xb in (1, 2, 4, 8, 16, 32, 64):
        if xb * r > 8192:
            break
        if xnumel is not None and xb > pow2_at_least(xnumel):
            break
        out.append(Config(xb, r, num_warps=_warps(xb * r)))
    # the widest few (short rows need several per program to fill the warps), the second
    # widest first: it was never far from the winner on the model suite
    widest = list(dict.fromkeys(out))[-3:]
    return widest[-2:-1] + widest[-1:] + widest[:-2]


#: Programs below which a looped reduction leaves much of an H200 (132 SMs) idle.
FEW_PROGRAMS = 264


def _looped(xnumel: int | None, rnumel: int | None, x_contiguous: bool) -> list[Config]:
    if x_contiguous:
        out = [Config(32, 32, num_warps=4), Config(64, 16, num_warps=4)]
        if xnumel is not None and rnumel is not None and -(-xnumel // 32) < FEW_PROGRAMS and rnumel >= 1024:
            # few kept points (a channels-last pooling: N*C of them) over long columns: narrower
            # tiles give more programs to fill the GPU (the narrowest won every time)
            out = [Config(8, 128, num_warps=4), Config(16, 64, num_warps=4)] + out
        return out
    if rnumel is not None and rnumel < 1024:
        r = pow2_at_least(rnumel)
        return [Config(1, r, num_warps=_warps(r))]
    return [Config(1, 2048, num_warps=8), Config(1, 4096, num_warps=16), Config(1, 8192, num_warps=16)]


#: Tiles of transposing pointwise kernels (rows x columns).
TILE2D = (Config(32, 32, num_warps=4), Config(64, 64, num_warps=8))


def bucket(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The size bucket of a symbolic launch: each size rounded up to a power of two."""
    return tuple(pow2_at_least(max(1, s)) for s in sizes)
