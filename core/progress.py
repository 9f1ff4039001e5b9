"""The progress line of long compiles: while a graph compiles for more than a few seconds, one
self-overwriting line on stderr says which graph, which stage, how many kernels are built
(when the device backend reports it through :mod:`coil.sdk.progress`) and the seconds so far::

    coil: compiling graph2 (forward): codegen+compile 37/120 kernels, 5.1 s

The line is cleared when the compile ends, however it ends. The ``progress`` knob decides
whether it is shown: ``auto`` only when stderr is a terminal (never into a log file or a CI
capture), ``on`` always, ``off`` never. A drawing thread waits :data:`DELAY_S` before the
first draw, so a compile that ends sooner prints nothing; its only cost is starting and
stopping that waiting thread, and nothing at all when the line is not shown.

This writes to stderr directly rather than through ``logging``: it is terminal output for
the person waiting (like a CLI's), redrawn in place, and a log record per redraw would be
noise."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Iterator, TextIO

from .config import ProgressMode
from .sdk.progress import listening

#: Seconds a compile runs before its line appears.
DELAY_S = 3.0
#: Seconds between redraws.
REFRESH_S = 0.25


class QuietLine:
    """What a compile tells its progress line when none is shown: nothing is recorded."""

    def stage(self, name: str, graph: str | None = None) -> None:
        """The compile entered stage ``name`` (and, once named, is graph ``graph``)."""

    def kernels_built(self, done: int, total: int) -> None:
        """``done`` of ``total`` kernels are built (the backend's report)."""


class ProgressLine(QuietLine):
    """The line of one graph compile. The compiling thread (and a backend's build threads)
    update the fields; a daemon thread draws them every :data:`REFRESH_S` after the delay.
    :meth:`stop` ends the thread and clears what it drew."""

    def __init__(self, kind: str, stream: TextIO, delay: float, refresh: float) -> None:
        self.kind = kind
        self.graph = ""
        self.current = "lower"
        self.built: tuple[int, int] | None = None
        self._stream = stream
        self._delay = delay
        self._refresh = refresh
        self._start = time.monotonic()
        self._done = threading.Event()
        self._drawn = 0  # characters of the line now on screen
        self._thread = threading.Thread(target=self._run, name="coil-progress", daemon=True)

    def stage(self, name: str, graph: str | None = None) -> None:
        self.current, self.built = name, None
        if graph:
            self.graph = graph

    def kernels_built(self, done: int, total: int) -> None:
        self.built = (done, total)

    def text(self) -> str:
        """The line as it reads now."""
        article = "an" if self.kind[:1] in ("a", "e", "i", "o", "u") else "a"
        who = f"{self.graph} ({self.kind})" if self.graph else f"{article} {self.kind} graph"
        built = self.built
        count = f" {built[0]}/{built[1]} kernels" if built is not None else ""
        return f"coil: compiling {who}: {self.current}{count}, {time.monotonic() - self._start:.1f} s"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the drawing thread and clear the line (when one was drawn)."""
        self._done.set()
        self._thread.join()
        if self._drawn:
            self._write("\r" + " " * self._drawn + "\r")

    def _run(self) -> None:
        if self._done.wait(self._delay):
            return
        while True:
            text = self.text()[: _columns(self._stream) - 1]  # a wrapped line cannot be redrawn
            if not self._write("\r" + text.ljust(self._drawn)):
                return
            self._drawn = max(self._drawn, len(text))
            if self._done.wait(self._refresh):
                return

    def _write(self, text: str) -> bool:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (AttributeError, OSError, ValueError):  # stderr closed or gone: never fail a compile
            return False
        return True


def _columns(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # not a terminal (a test's stream, a pipe)
        return 200
    return columns if columns > 0 else 200  # a pseudo-terminal opened with no size says 0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def wanted(mode: ProgressMode, stream: TextIO) -> bool:
    """Whether the ``progress`` knob's ``mode`` shows a line on ``stream``."""
    return mode == "on" or (mode == "auto" and _is_terminal(stream))


@contextlib.contextmanager
def shown(kind: str, mode: ProgressMode, stream: TextIO | None = None) -> Iterator[QuietLine]:
    """The progress line of one ``kind`` graph compile under ``mode`` (the ``progress`` knob),
    on ``stream`` (default: ``sys.stderr`` now). Backends' :mod:`coil.sdk.progress` reports
    reach it for the duration; it is cleared on the way out, on an error too."""
    stream = sys.stderr if stream is None else stream
    if stream is None or not wanted(mode, stream):  # sys.stderr is None under pythonw
        yield QuietLine()
        return
    line = ProgressLine(kind, stream, DELAY_S, REFRESH_S)
    line.start()
    try:
        with listening(line.kernels_built):
            yield line
    finally:
        line.stop()
