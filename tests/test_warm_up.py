"""``DeviceBackend.warm_up``: called once per process and device when the first graph arrives
(before AOTAutograd), never failing a compile."""
from __future__ import annotations

import torch

import coil
from coil import backend as coil_backend
from coil import plugins
from coil_cpu_cpp.backend import CppBackend


class CountingBackend(CppBackend):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.warmed, self.fail = 0, fail

    def warm_up(self) -> None:
        self.warmed += 1
        if self.fail:
            raise RuntimeError("no toolchain yet")


def _route(backend, monkeypatch):
    monkeypatch.setattr(coil_backend, "_warmed", set())
    plugins.reset()
    coil.register_backend_for_device("cpu", backend, name="warm-up-test")


def test_warm_up_runs_once_per_device(monkeypatch):
    backend = CountingBackend()
    _route(backend, monkeypatch)
    try:
        x = torch.randn(8)
        for fn in (lambda x: x.sin() + 1, lambda x: x.cos() * 2):
            torch.testing.assert_close(torch.compile(fn, backend="coil")(x), fn(x))
    finally:
        plugins.reset()
    assert backend.warmed == 1


def test_a_failing_warm_up_never_fails_the_compile(monkeypatch):
    backend = CountingBackend(fail=True)
    _route(backend, monkeypatch)
    try:
        x = torch.randn(8)
        torch.testing.assert_close(torch.compile(lambda x: x.exp(), backend="coil")(x), x.exp())
    finally:
        plugins.reset()
    assert backend.warmed == 1

