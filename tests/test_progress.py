"""The progress line of long compiles (``core/progress.py``, ``coil.sdk.progress``): forced on
with a zero delay, the line appears on the stream, shows the graph, the stage and the kernel
count a backend reports, and is cleared at the end, after an error too; in ``auto`` mode
nothing reaches a stream that is not a terminal; a compile shorter than the delay prints
nothing. The Triton plugin's count is checked here; its pool in
``tests/test_triton_compile_pool.py``."""
from __future__ import annotations

import io
import threading
import time

import pytest
import torch

import coil
from coil import config, plugins, progress
from coil.sdk.progress import build_progress, listening


class Stream(io.StringIO):
    """A stderr stand-in that records what was written; ``tty`` decides ``isatty()``."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def screen(text: str) -> str:
    """What a terminal shows on its last line after ``text``: ``\\r`` goes back to column 0
    and later characters overwrite earlier ones."""
    line: list[str] = []
    column = 0
    for ch in text:
        if ch == "\r":
            column = 0
        elif ch == "\n":
            line, column = [], 0
        else:
            line[column:column + 1] = [ch]
            column += 1
    return "".join(line)


def wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def fast(monkeypatch):
    """Draw at once and redraw often."""
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "REFRESH_S", 0.01)


def _progress_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "coil-progress"]


# ----------------------------------------------------------------------------- the line itself


def test_the_line_shows_stage_and_count_and_is_cleared(fast):
    stream = Stream(tty=False)
    with progress.shown("forward", "on", stream) as line:
        line.stage("codegen+compile", graph="graph7")
        build_progress()(3, 10)
        assert wait_for(lambda: "3/10 kernels" in stream.getvalue()), stream.getvalue()
        shown = screen(stream.getvalue())
        assert shown.startswith("coil: compiling graph7 (forward): codegen+compile 3/10 kernels, "), shown
        assert shown.rstrip().endswith(" s")
    assert "\n" not in stream.getvalue()
    assert screen(stream.getvalue()).strip() == "", repr(stream.getvalue())
    assert not _progress_threads()
    build_progress()(5, 10)  # the listener is gone with the line
    assert line.built == (3, 10)


def test_the_line_is_cleared_and_stopped_on_an_error(fast):
    stream = Stream(tty=True)
    with pytest.raises(RuntimeError, match="codegen failed"):
        with progress.shown("backward", "auto", stream):
            assert wait_for(lambda: "a backward graph: lower" in stream.getvalue())
            raise RuntimeError("codegen failed")
    assert screen(stream.getvalue()).strip() == ""
    assert not _progress_threads()


def test_a_short_compile_prints_nothing():
    """The default delay: a compile that ends sooner never draws (the thread just ends)."""
    stream = Stream(tty=True)
    with progress.shown("forward", "on", stream) as line:
        line.stage("schedule")
    assert stream.getvalue() == "" and not _progress_threads()


@pytest.mark.parametrize("mode,tty,shown", [
    ("auto", False, False), ("auto", True, True), ("on", False, True), ("off", True, False),
])
def test_the_knob_decides(fast, mode, tty, shown):
    stream = Stream(tty=tty)
    with progress.shown("forward", mode, stream) as line:
        if shown:
            assert wait_for(lambda: "coil: compiling" in stream.getvalue())
        else:
            time.sleep(0.05)
            assert type(line) is progress.QuietLine and not _progress_threads()
    assert bool(stream.getvalue()) == shown


def test_a_closed_stream_does_not_fail_the_compile(fast):
    stream = Stream(tty=True)
    stream.close()
    with progress.shown("forward", "on", stream):
        time.sleep(0.05)
    assert not _progress_threads()


def test_build_progress_outside_a_compile_does_nothing():
    build_progress()(1, 2)  # no listener: ignored
    seen = []
    with listening(lambda done, total: seen.append((done, total))):
        report = build_progress()
    report(1, 2)  # bound when it was fetched: still reaches the listener
    assert seen == [(1, 2)]


# ----------------------------------------------------------------------------- through a compile


def _slow_backend():
    """The C++ backend, reporting two kernels built a moment apart before it compiles."""
    from coil_cpu_cpp.backend import CppBackend

    class Slow(CppBackend):
        def compile(self, kernels, graph_name):
            report = build_progress()
            report(1, 2)
            time.sleep(0.3)
            report(2, 2)
            time.sleep(0.1)
            return super().compile(kernels, graph_name)

    return Slow()


@pytest.fixture
def slow_cpu():
    plugins.reset()
    coil.register_backend_for_device("cpu", _slow_backend(), name="slow-cpu")
    yield
    plugins.reset()


def fn(x):
    return torch.softmax(x * 2, -1)


def test_a_compile_shows_its_graph_stage_and_backend_count(fast, slow_cpu, monkeypatch):
    stream = Stream(tty=False)
    monkeypatch.setattr("sys.stderr", stream)
    x = torch.randn(8, 33)
    with config.override(progress="on"):
        report = coil.explain(fn, x)
    torch.testing.assert_close(report.result, fn(x))
    name = report.graphs[0].name
    text = stream.getvalue()
    assert f"coil: compiling {name} (inference): codegen+compile 1/2 kernels" in text, text
    assert f"coil: compiling {name} (inference): codegen+compile 2/2 kernels" in text, text
    assert screen(text).strip() == "", repr(text)
    stages = report.graphs[0].stage_seconds
    # the first call's own stage (loading and tuning kernels) fills in once the graph has run
    assert set(stages) == {"lower", "schedule", "codegen+compile", "wrapper", "first run"}
    assert stages["first run"] > 0


def test_auto_prints_nothing_when_stderr_is_not_a_terminal(fast, slow_cpu, monkeypatch):
    stream = Stream(tty=False)
    monkeypatch.setattr("sys.stderr", stream)
    with config.override(progress="auto"):  # the default
        report = coil.explain(fn, torch.randn(8, 33))
    assert report.graphs and stream.getvalue() == ""


def test_the_knob_from_the_environment(monkeypatch):
    monkeypatch.setenv("COIL_PROGRESS", "Off")
    config.reload_from_env()
    try:
        assert config.get().progress == "off"
        monkeypatch.setenv("COIL_PROGRESS", "sometimes")
        config.reload_from_env()
        with pytest.raises(config.ConfigValueError, match="COIL_PROGRESS='sometimes'.*one of auto, on, off"):
            config.get()
    finally:
        monkeypatch.undo()
        config.reload_from_env()


# ----------------------------------------------------------------------------- the Triton plugin's count


def test_the_triton_count_takes_a_launcher_once_its_builds_end():
    from coil_cuda_triton.compile_pool import BuildCount
    seen: list[tuple[int, int]] = []
    a, b, c = object(), object(), object()
    with listening(lambda done, total: seen.append((done, total))):
        count = BuildCount(3)
    count.add_job(a)
    count.add_job(a)
    count.add_job(b)
    count.job_done(a)
    assert seen == []  # one of a's two configurations is still building
    count.job_done(b)
    count.job_done(a)
    count.built(a)  # the in-process build of a pooled launcher is not counted twice
    count.built(c)
    assert seen == [(1, 3), (2, 3), (3, 3)]
