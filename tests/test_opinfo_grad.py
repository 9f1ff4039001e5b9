"""OpInfo gradients: for each op, a compiled function returning the op's outputs and the
gradients of a random projection of them (``sum(out * w)``, ``w`` fixed and passed in) with
respect to every differentiable input must match eager doing the same
(``coil.sdk.testing.opinfo_grad``). The backward graph is compiled as in training: Dynamo
breaks at ``torch.autograd.grad`` and AOTAutograd hands Coil the backward graph.

CI runs :data:`GRAD_CI_OPS` (the ops of ``CI_OPS`` with a float32 CPU backward), one sample
each; ``COIL_OPINFO_FULL=1`` runs every eligible op and ``COIL_OPINFO_SAMPLES`` sets the
samples (the nightly figure: ``python tests/opinfo_harness.py --mode grad --all``)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from opinfo_fixtures import _quiet_torch_trace_log, counting_backend  # noqa: F401 (fixtures)
from opinfo_harness import (
    FULL,
    TIMEOUT_S,
    env_samples,
    CI_OPS,
    CountingBackend,
    Mode,
    Status,
    assert_op_matches_eager,
    find_ops,
    mode_ops,
    run_op,
)

from coil.sdk.testing.opinfo_grad import grad_case

#: One sample per op in CI: each costs a forward and a backward compile.
NUM_SAMPLES: int = env_samples(1)

#: ``CI_OPS`` less the ops without a backward (comparisons, argmax, any/all, factories).
GRAD_CI_OPS: tuple[str, ...] = tuple(
    name for name in CI_OPS
    if name not in ("eq", "lt", "argmax", "any", "all", "full", "arange", "zeros_like"))


def _op_names() -> list[str]:
    return [op.full_name for op in mode_ops(Mode.GRAD)] if FULL else list(GRAD_CI_OPS)


@pytest.mark.parametrize("op_name", _op_names())
def test_gradients_match_eager(op_name: str, counting_backend: CountingBackend) -> None:
    """Outputs and projected gradients of the compiled function match eager."""
    assert_op_matches_eager(op_name, counting_backend, mode=Mode.GRAD, num_samples=NUM_SAMPLES,
                            timeout_s=TIMEOUT_S, require_reached=not FULL)


# --------------------------------------------------------------------------- #
# Self-tests: the gradient comparison must not be vacuous.
# --------------------------------------------------------------------------- #


def _aot_backend(corrupt_backward: bool) -> Callable[..., Any]:
    """AOTAutograd with eager forward and backward graphs; the backward adds 1 to every
    floating-point gradient when ``corrupt_backward``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def forward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        return make_boxed_func(gm.forward)

    def backward(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            outs = gm(*args)
            if not corrupt_backward:
                return outs
            return [o + 1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs]

        return make_boxed_func(run)

    return aot_autograd(fw_compiler=forward, bw_compiler=backward)


@pytest.mark.parametrize(("corrupt", "expected"), [(False, Status.PASS), (True, Status.MISMATCH)],
                         ids=["correct", "wrong-backward"])
def test_grad_mode_checks_the_backward_graph(corrupt: bool, expected: Status) -> None:
    """A backend whose forward is right and whose backward graph is wrong passes the forward
    mode and fails the grad mode."""
    (op,) = find_ops(["mul"])
    backend = CountingBackend(_aot_backend(corrupt))
    assert [r.status for r in run_op(op, backend, num_samples=1, mode=Mode.FORWARD)] == [Status.PASS]
    records = run_op(op, backend, num_samples=1, mode=Mode.GRAD)
    assert [r.status for r in records] == [expected], records
    assert all(r.reached_backend and r.graph_breaks == 0 for r in records), records


def test_projection_is_fixed_and_passed_in() -> None:
    """The projection tensors are the same every time a case is built, random (not ones),
    and part of the compiled function's inputs."""
    (op,) = find_ops(["nn.functional.linear"])
    sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=True)))
    first, second = grad_case(op, sample), grad_case(op, sample)
    weights = first.sample.args[1]
    assert [w is None for w in weights] == [False]
    torch.testing.assert_close(weights, second.sample.args[1], atol=0, rtol=0)
    assert not torch.equal(weights[0], torch.ones_like(weights[0]))


def test_grad_ops_exclude_ops_without_backward() -> None:
    """The grad mode runs only ops with a float32 backward on the CPU."""
    names = {op.full_name for op in mode_ops(Mode.GRAD)}
    assert "mul" in names and "argmax" not in names
    assert set(GRAD_CI_OPS) <= names
