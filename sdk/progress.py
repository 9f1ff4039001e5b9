"""Telling the user how far a graph's kernel build has come.

A compile that runs past a few seconds shows a progress line on stderr (the ``progress``
knob): the graph, its stage, the seconds so far and, during ``DeviceBackend.compile``, how
many of the graph's kernels are built, when the backend says so. A backend says so by calling
the function :func:`build_progress` returns, as kernels finish::

    from coil.sdk.progress import build_progress

    report = build_progress()
    for i, launcher in enumerate(launchers):
        launcher.build()
        report(i + 1, len(launchers))

Reporting is optional: a backend that reports nothing (one that builds a single translation
unit, say) gets a line with the stage and the seconds. Outside a compile, or when no line is
shown, the function does nothing, so calling it costs next to nothing."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator

#: ``report(done, total)``: ``done`` of ``total`` kernels of the graph being compiled are built.
Report = Callable[[int, int], None]


def _ignore(done: int, total: int) -> None:
    pass


_listener: contextvars.ContextVar[Report | None] = contextvars.ContextVar("coil_build_progress",
                                                                          default=None)


def build_progress() -> Report:
    """The ``report(done, total)`` function of the compile in progress. Call this in
    ``DeviceBackend.compile``'s own thread (the listener belongs to that thread's compile); the
    function it returns may then be called from any thread, a build pool's callbacks included.
    Counts are the backend's to choose (kernels, or functions where kernels share one); a
    later report replaces the earlier one."""
    listener = _listener.get()
    return _ignore if listener is None else listener


@contextlib.contextmanager
def listening(report: Report) -> Iterator[None]:
    """Send :func:`build_progress` reports made in this context to ``report`` (Coil's core
    does this around each graph compile that shows a progress line)."""
    token = _listener.set(report)
    try:
        yield
    finally:
        _listener.reset(token)


__all__ = ["Report", "build_progress", "listening"]
