"""A small code writer for plugins: ``line()``, an ``indent()`` block context, and text."""
from __future__ import annotations

import contextlib
from typing import Iterator


class CodeWriter:
    """Accumulates lines of source with indentation.

    >>> w = CodeWriter()
    >>> with w.block("for (int i = 0; i < n; i++) {", "}"):
    ...     w.line("x[i] = 0;")
    """

    def __init__(self, indent: str = "    ") -> None:
        self._lines: list[str] = []
        self._depth = 0
        self._unit = indent

    def line(self, text: str = "") -> None:
        self._lines.append(f"{self._unit * self._depth}{text}" if text else "")

    def lines(self, texts: list[str]) -> None:
        for t in texts:
            self.line(t)

    @contextlib.contextmanager
    def indent(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @contextlib.contextmanager
    def block(self, opener: str, closer: str = "") -> Iterator[None]:
        self.line(opener)
        with self.indent():
            yield
        if closer:
            self.line(closer)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
