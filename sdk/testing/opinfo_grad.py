"""The OpInfo runner's gradient program: for one sample (generated with ``requires_grad=True``,
so OpInfo marks the differentiable inputs), a function that runs the op, projects every
differentiable floating-point output onto a fixed random tensor (``sum(out * w)``, summed
over outputs) and returns the outputs with ``torch.autograd.grad`` of that projection with
respect to every input that requires grad.

The projection tensors are drawn once, from a seeded generator, before either run, and passed
to the function as inputs: eager and compiled runs see the same ones. Plain ``out.sum()``
would feed the backward a tensor of ones, under which a transposed or permuted gradient, or
one summed over the wrong dim, can still come out right.

By default Dynamo graph-breaks at ``autograd.grad`` (``trace_autograd_ops`` off): the forward
and projection compile to one graph, AOTAutograd gives Coil its backward graph, and eager
autograd calls it — how training runs. ``joint=True`` traces ``autograd.grad`` into the graph
instead, so forward and backward ops are lowered together."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .compare import clone_call_args
from .opinfo_db import SEED
from .opinfo_case import Case, SkipSample

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput

#: The graph break the split program makes on purpose (Dynamo's message names the call).
AUTOGRAD_GRAD_BREAK = "torch.autograd.grad"
#: Eager's complaint when an in-place op writes a leaf that requires grad; such ops are then
#: run on clones of their differentiable inputs (still differentiated w.r.t. the originals).
_LEAF_INPLACE = "a leaf Variable that requires grad"


def _leaves(value: Any) -> list[Any]:
    """Leaves of a nest of lists/tuples (namedtuples and ``return_types`` included), in order."""
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


def _clone_grad_leaves(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone() if value.requires_grad else value
    if isinstance(value, list):
        return [_clone_grad_leaves(v) for v in value]
    if type(value) is tuple:
        return tuple(_clone_grad_leaves(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone_grad_leaves(v) for k, v in value.items()}
    return value


def grad_program(op: OpInfo, *, clone_inputs: bool) -> Callable[..., Any]:
    """``program(args, kwargs, weights) -> (outputs, grads)``: outputs are the op's leaves
    (tensors detached), grads one entry per input tensor that requires grad (None if unused).
    ``weights`` holds one tensor per output leaf to project, None for the others."""

    def program(args: list[Any], kwargs: dict[str, Any], weights: list[torch.Tensor | None]) -> Any:
        inputs = [t for t in _leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.requires_grad]
        if clone_inputs:
            args, kwargs = _clone_grad_leaves(args), _clone_grad_leaves(kwargs)
        outputs = _leaves(op(*args, **kwargs))
        total = None
        for out, weight in zip(outputs, weights):
            if weight is not None:
                term = (out * weight).sum()
                total = term if total is None else total + term
        grads = torch.autograd.grad(total, inputs, allow_unused=True)
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs], list(grads)

    program.__name__ = "opinfo_grad_" + op.full_name.replace(".", "_")
    return program


def _projections(outputs: list[Any], seed: int) -> list[torch.Tensor | None]:
    """A standard-normal tensor for every differentiable floating-point output, else None."""
    generator = torch.Generator().manual_seed(seed)
    weights: list[torch.Tensor | None] = []
    for out in outputs:
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.requires_grad:
            weights.append(torch.randn(out.shape, generator=generator, dtype=out.dtype))
        else:
            weights.append(None)
    return weights


def grad_case(op: OpInfo, sample: SampleInput, *, joint: bool = False) -> Case:
    """The gradient :class:`Case` for ``sample``. Runs the op eagerly once to find which
    outputs are differentiable and their shapes; raises :class:`SkipSample` when no input
    requires grad or no output is differentiable."""
    from torch.testing._internal.opinfo.core import SampleInput

    args, kwargs = clone_call_args(sample)
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in _leaves((args, kwargs))):
        raise SkipSample("no input requires grad")
    clone_inputs = False
    try:
        outputs = _leaves(op(*args, **kwargs))
    except RuntimeError as exc:
        if _LEAF_INPLACE not in str(exc):
            raise
        clone_inputs = True
        args, kwargs = clone_call_args(sample)
        outputs = _leaves(op(*_clone_grad_leaves(args), **_clone_grad_leaves(kwargs)))
    weights = _projections(outputs, SEED)
    if all(w is None for w in weights):
        raise SkipSample("no differentiable floating-point output")
    program_sample = SampleInput(list((sample.input, *sample.args)), args=(dict(sample.kwargs), weights))
    config = {"trace_autograd_ops": joint}
    return Case(grad_program(op, clone_inputs=clone_inputs), program_sample, dynamo_config=config,
                expected_breaks=() if joint else (AUTOGRAD_GRAD_BREAK,))
