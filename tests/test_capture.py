"""Graph capture's decisions (coil.capture), on the CPU: which graphs a backend is asked to
record, with which static inputs and in which mode. The recording itself needs CUDA
(tests/test_triton_gpu.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import coil
from coil import capture


@dataclass
class _Caps:
    graph_capture: bool = True


@dataclass
class _Backend:
    name: str = "fake"
    capabilities: _Caps = field(default_factory=_Caps)
    calls: list = field(default_factory=list)

    def capture(self, fn, example_inputs, **kwargs):
        self.calls.append(kwargs)
        return lambda args: fn(args)


def _decide(mode, kind="inference", mutates=False, api="0.13.0", inputs=None, backend=None):
    backend = backend or _Backend()
    inputs = inputs if inputs is not None else [torch.zeros(2, device="cpu")]
    fn, note = capture.captured(lambda args: args, mode, kind, mutates, {"cpu": (backend, None)},
                                inputs, frozenset({0}), lambda b: api)
    return backend, note


def test_auto_asks_for_a_measured_recording_of_inference_graphs_with_static_inputs():
    backend, note = _decide("auto")
    assert backend.calls == [{"static_inputs": frozenset({0}), "measure": True}]
    assert note.replay is not None


@pytest.mark.parametrize("mode,kind,mutates,why", [
    ("off", "inference", False, "knob is off"),
    ("auto", "forward", False, "inference graphs only"),
    ("auto", "backward", False, "inference graphs only"),
    ("auto", "inference", True, "mutates an input"),
    ("on", "inference", True, "mutates an input"),
])
def test_graphs_not_recorded_say_why(mode, kind, mutates, why):
    backend, note = _decide(mode, kind, mutates)
    assert backend.calls == [] and note.replay is None and why in str(note)


def test_on_records_training_graphs_too_without_measuring():
    backend, note = _decide("on", kind="forward")
    assert backend.calls == [{"static_inputs": frozenset({0}), "measure": False}]


def test_plugins_declaring_an_older_sdk_keep_the_old_call_and_no_auto():
    backend, note = _decide("auto", api="0.12.0")
    assert backend.calls == [] and "older than 0.13.0" in str(note)
    backend, note = _decide("on", api="0.12.0")
    assert backend.calls == [{}]  # the two-argument call


def test_inputs_elsewhere_symbolic_sizes_and_incapable_backends_are_not_recorded():
    _, note = _decide("on", inputs=[torch.zeros(2, device="meta")])
    assert "inputs on ['meta']" in str(note)
    shape_env = torch.fx.experimental.symbolic_shapes.ShapeEnv()
    sym = shape_env.create_unbacked_symint()
    _, note = _decide("on", inputs=[torch.zeros(2, device="cpu"), sym])
    assert "symbolic sizes" in str(note)
    _, note = _decide("on", backend=_Backend(capabilities=_Caps(False)))
    assert "cannot record" in str(note)


def test_mutating_graphs_are_detected():
    traced = torch.fx.experimental.proxy_tensor.make_fx(lambda x: x.add_(1))(torch.zeros(2))
    assert capture.mutates_inputs(traced)
    assert not capture.mutates_inputs(torch.fx.experimental.proxy_tensor.make_fx(lambda x: x + 1)(torch.zeros(2)))


def test_parameters_reach_the_capture_decision_as_static_inputs(monkeypatch):
    seen = []
    real = capture.captured

    def spy(fn, mode, kind, mutates, modules, example_inputs, static, api_of):
        seen.append((kind, static, len(example_inputs)))
        return real(fn, mode, kind, mutates, modules, example_inputs, static, api_of)

    monkeypatch.setattr(capture, "captured", spy)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with torch.no_grad():
        got = torch.compile(model, backend="coil")(x)
        torch.testing.assert_close(got, model(x))
    (kind, static, n), = seen
    assert kind == "inference" and len(static) == 4 and n == 5  # 2 weights, 2 biases; x is not static
    assert coil.config.get().graph_capture == "auto"


_BASE = torch.arange(64 * 72, dtype=torch.float32).reshape(64, 72)


@pytest.mark.parametrize("view,same_strides", [
    (_BASE, True), (_BASE[:, :70], True), (_BASE[1:, 1:71], True), (_BASE.t(), True),
    (torch.randn(2, 8, 3, 4).permute(0, 2, 1, 3)[..., :3], True),
    (_BASE[::3], False), (_BASE[:, 2:5], False),  # mostly gaps: compacted
    (torch.arange(24.0).reshape(3, 1, 8).expand(3, 5, 8), False), (_BASE[:0], False),
], ids=["contiguous", "padded-columns", "offset", "transposed", "permuted-slice", "strided-rows",
        "narrow", "expanded", "empty"])
def test_outputs_copied_out_of_a_recording_are_equal_new_memory_with_the_same_strides_where_cheap(
        view, same_strides):
    from coil_cuda_triton.graphs import copy_out
    got = copy_out(view)
    assert torch.equal(got, view)
    if view.numel():
        assert got.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    if same_strides:  # a view with small gaps (a padded product's columns): one contiguous copy
        assert got.stride() == view.stride()
        assert got.untyped_storage().nbytes() <= 2 * view.numel() * view.element_size()
    else:
        assert got.is_contiguous()


def test_outputs_over_one_storage_are_copied_out_together_and_stay_views():
    from coil_cuda_triton.graphs import copy_outputs, shared_regions
    base = torch.arange(20.0).reshape(4, 5)
    row = torch.arange(5.0).reshape(1, 5)
    outs = (base, base[1:], base.t(), base[2], row.expand(3, 5), 7, torch.arange(3.0))
    got = copy_outputs(outs, shared_regions(outs))
    assert got[5] == 7
    for g, o in zip(got, outs):
        if isinstance(o, torch.Tensor):
            assert torch.equal(g, o) and g.stride() == o.stride()
            assert g.untyped_storage().data_ptr() != o.untyped_storage().data_ptr()
    assert {g.untyped_storage().data_ptr() for g in got[:4]} == {got[0].untyped_storage().data_ptr()}
    assert got[4].stride() == (0, 1)  # still expanded
    got[0].add_(100)  # shows through the other views, as in the recording
    assert torch.equal(got[1], base[1:] + 100) and torch.equal(got[3], base[2] + 100)


@pytest.mark.parametrize("measure, records_on", [(True, 2), (False, 1)])
def test_the_triton_replay_records_on_the_second_call_when_it_measures(monkeypatch, measure, records_on):
    """With ``measure`` (``graph_capture=auto``) the first call runs the graph as compiled and
    returns; the second records (and measures). Under ``on`` the first call records. The
    recording itself needs CUDA: a stand-in counts when it would start."""
    from coil_cuda_triton.graphs import GraphReplay
    ran: list[int] = []
    replay = GraphReplay(lambda args: ran.append(len(args)) or args[0] + 1, measure=measure)
    started: list[int] = []
    # the call number that starts a recording: the calls that ran before it, plus one
    monkeypatch.setattr(GraphReplay, "_record", lambda self, args: started.append(len(ran) + 1) or self.fn(args))
    results = [replay([torch.ones(2)]) for _ in range(3)]
    assert started and started[0] == records_on, started
    assert "second call" in replay.describe() if measure else "first call" in replay.describe()
    assert all(torch.equal(r, torch.full((2,), 2.0)) for r in results) and len(ran) == 3
