"""Reference cycles left by a first training step are collected once its backward has
compiled (coil.collect): Dynamo keeps traced frames in cycles, whose locals (gradients,
outputs) otherwise stay allocated until Python's next full collection."""
import gc
import weakref

import pytest
import torch

import coil
from coil import collect


@pytest.fixture
def no_automatic_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def test_first_steps_cycles_are_freed_in_the_next_step(no_automatic_gc):
    model = _model()
    fn = torch.compile(model, backend="coil")
    x = torch.randn(8, 16)
    held = []

    def step() -> None:
        model.zero_grad(set_to_none=True)
        fn(x).square().mean().backward()
        # what a frame kept by a compile's reference cycle holds: this step's gradients
        grads = [p.grad for p in model.parameters()]
        cycle: list = [grads]
        cycle.append(cycle)
        held.append(weakref.ref(grads[0]))

    before = collect.collections
    with coil.config.override(graph_cache=False):
        step()
        assert held[0]() is not None  # nothing has collected it yet
        step()
        step()
    assert held[0]() is None, "the first step's gradients outlived it"
    assert held[1]() is not None  # later steps compile nothing, so they are left to Python
    assert collect.collections == before + 1


def test_inference_compiles_do_not_collect(no_automatic_gc):
    model = _model().eval()
    fn = torch.compile(model, backend="coil")
    before = collect.collections
    with torch.no_grad(), coil.config.override(graph_cache=False):
        for _ in range(3):
            expected = model(torch.ones(2, 16))
            torch.testing.assert_close(fn(torch.ones(2, 16)), expected)
    assert collect.collections == before


def test_the_wrapper_keeps_the_compiled_functions_attributes():
    def compiled(args):
        return args

    compiled._boxed_call = True
    wrapped = collect.collecting(compiled)
    assert wrapped._boxed_call is True
    assert wrapped([1, 2]) == [1, 2]
