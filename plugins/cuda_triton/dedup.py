"""One Triton function per distinct kernel: the twelve layers of a transformer generate the same
kernels twelve times, differing only in the kernel's name and the names of the buffers they
touch. Each generated function is renamed into a canonical form (buffers and index variables
numbered in order of first appearance, the function named by the digest of the result), so
identical kernels share one function, one launcher, one build and one tuning, in a graph and
across the graphs of a process; the digest names it in Triton's and the tuner's disk caches."""
from __future__ import annotations

import dataclasses
import hashlib
import re

from .codegen import KernelSource

#: Names the core gives buffers (``arg3``, ``buf12``, ``const0``) and indirect index
#: variables (``ind4``), wherever they appear in an identifier (``p_buf4``, ``buf5_mean``).
_NAMES = re.compile(r"(?<![A-Za-z0-9])(?:arg|buf|const|ind)\d+(?![0-9])")


def canonical(src: KernelSource) -> KernelSource:
    """``src`` with its buffers renamed ``q0, q1, ...`` and its function named ``coil_<digest>``
    (the digest of every field of the renamed source)."""
    mapping: dict[str, str] = {}

    def rename(name: str) -> str:
        if name not in mapping:
            mapping[name] = f"q{len(mapping)}"
        return mapping[name]

    body = re.sub(rf"\b{re.escape(src.name)}\b", "KERNEL_NAME", src.source)
    body = _NAMES.sub(lambda m: rename(m.group(0)), body)
    renamed = dataclasses.replace(
        src, name="KERNEL_NAME", source=body,
        params=[_NAMES.sub(lambda m: rename(m.group(0)), p) for p in src.params],
        buffers=[rename(b) for b in src.buffers])
    # Everything the launcher reads enters the name, not the source only: two kernels of one
    # text may differ in argument types or in sizes the text leaves out (an unmasked
    # pointwise kernel's length sets only its grid).
    name = "coil_" + hashlib.sha256(repr(renamed).encode()).hexdigest()[:20]
    return dataclasses.replace(renamed, name=name, source=body.replace("KERNEL_NAME", name))
