"""One Triton function per distinct kernel: the twelve layers of a transformer generate the same
kernels twelve times, differing only in the kernel's name and the names of the buffers they
touch. Each generated function is renamed into a canonical form (:mod:`coil.sdk.canonical`:
buffers and index variables numbered in order of first appearance, the function named by the
digest of the result and of every launch field), so identical kernels share one function,
one launcher, one build and one tuning, in a graph and across the graphs of a process; the
digest names it in Triton's and the tuner's disk caches."""
from __future__ import annotations

import dataclasses

from coil.sdk.canonical import PLACEHOLDER, Renamer, canonical_text, digest_name

from .codegen import KernelSource


def canonical(src: KernelSource) -> KernelSource:
    """``src`` with its buffers renamed ``q0, q1, ...`` and its function named ``coil_<digest>``
    (the digest of every field of the renamed source)."""
    renamer = Renamer()
    body = canonical_text(src.source, src.name, renamer)
    renamed = dataclasses.replace(
        src, name=PLACEHOLDER, source=body, params=[renamer.text(p) for p in src.params],
        buffers=[renamer.name(b) for b in src.buffers])
    # Everything the launcher reads enters the name, not the source only: two kernels of one
    # text may differ in argument types or in sizes the text leaves out (an unmasked
    # pointwise kernel's length sets only its grid).
    name = digest_name("coil_", repr(renamed))
    return dataclasses.replace(renamed, name=name, source=body.replace(PLACEHOLDER, name))
