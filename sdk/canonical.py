"""Canonical kernel sources: the same kernel generated under other names is the same text.

A model's repeated layers lower to kernels that differ only in the kernel's name and in the
names the core gave their buffers (``arg3``, ``buf12``, ``const0``) and indirect index
variables (``ind4``). A code writer that renames those in order of first appearance, and
names the function after a digest of the result, can build (and cache, and tune) each
distinct kernel once, however many times a graph or a process uses it."""
from __future__ import annotations

import hashlib
import re

#: The core's buffer and index-variable names, wherever they appear in an identifier
#: (``p_buf4``, ``buf5_mean``, ``arg0_addr``).
CORE_NAMES = re.compile(r"(?<![A-Za-z0-9])(?:arg|buf|const|ind)\d+(?![0-9])")

#: What the kernel's own name is replaced by while the digest is taken.
PLACEHOLDER = "KERNEL_NAME"


class Renamer:
    """Renames the core's names to ``q0, q1, ...`` in order of first appearance, consistently
    over every text passed to it (a kernel's source, then its parameter list)."""

    def __init__(self) -> None:
        self.mapping: dict[str, str] = {}

    def name(self, original: str) -> str:
        if original not in self.mapping:
            self.mapping[original] = f"q{len(self.mapping)}"
        return self.mapping[original]

    def text(self, text: str) -> str:
        return CORE_NAMES.sub(lambda m: self.name(m.group(0)), text)


def canonical_text(source: str, kernel_name: str, renamer: Renamer) -> str:
    """``source`` with ``kernel_name`` replaced by :data:`PLACEHOLDER` and the core's names
    renamed by ``renamer``."""
    return renamer.text(re.sub(rf"\b{re.escape(kernel_name)}\b", PLACEHOLDER, source))


def digest_name(prefix: str, *parts: str) -> str:
    """``prefix`` and 20 hex digits of the SHA-256 of ``parts``: a stable function name."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return prefix + h.hexdigest()[:20]
