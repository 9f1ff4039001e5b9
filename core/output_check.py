"""The first call of a compiled Dynamo graph checks its outputs against what Dynamo traced.

AOTAutograd's runtime wrappers put the graph's outputs back in order around the mutated
inputs they return alongside. Where that bookkeeping is wrong (PyTorch 2.11-2.13: a module
that updates spectral_norm's buffers and calls ``nn.Embedding(max_norm=...)`` under grad;
``tests/repros_open``), a buffer comes back in an output's place, silently, with every
AOTAutograd backend. Coil's kernels are not involved, and nothing after the call could tell.

:func:`checked` wraps the callable a backend returns to Dynamo: its first call compares every
output with the graph's output node (Dynamo's example values): tensor or not, dtype, device
type, rank, and each size that was traced static. A difference raises
:class:`coil.errors.OutputMismatchError`, and so does every later call: the graph cannot be
trusted, and a re-run to recover the outputs would repeat its side effects. Later calls cost
one flag test."""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch
import torch.fx

from .errors import OutputMismatchError

#: One traced output: None for a non-tensor, else (dtype, device type, sizes with None where
#: the size is symbolic).
Spec = tuple[torch.dtype, str, tuple[int | None, ...]] | None


def traced_outputs(gm: torch.fx.GraphModule) -> list[Spec] | None:
    """The graph's outputs as Dynamo traced them, or None where the graph does not say (no
    example values, or an output structure other than one flat tuple or list)."""
    node = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if node is None or not isinstance(node.args[0], (tuple, list)):
        return None
    specs: list[Spec] = []
    for arg in node.args[0]:
        if isinstance(arg, torch.fx.Node) and "example_value" not in arg.meta:
            return None
        value = arg.meta["example_value"] if isinstance(arg, torch.fx.Node) else arg
        if isinstance(value, torch.Tensor):
            sizes = tuple(s if isinstance(s, int) else None for s in value.shape)
            specs.append((value.dtype, value.device.type, sizes))
        else:
            specs.append(None)
    return specs


def _describe(spec: Spec) -> str:
    if spec is None:
        return "not a tensor"
    dtype, device, sizes = spec
    return f"{device} {str(dtype).removeprefix('torch.')}[{', '.join('s' if s is None else str(s) for s in sizes)}]"


def mismatch(outputs: Any, specs: Sequence[Spec]) -> tuple[int, str, str] | None:
    """The first output that is not what was traced: (position, got, traced); None if all are."""
    if not isinstance(outputs, (tuple, list)) or len(outputs) != len(specs):
        return None  # another calling convention: nothing to compare position by position
    for i, (out, spec) in enumerate(zip(outputs, specs)):
        if spec is None:
            if isinstance(out, torch.Tensor):
                return i, _describe((out.dtype, out.device.type, tuple(out.shape))), "not a tensor"
            continue
        if not isinstance(out, torch.Tensor):
            return i, f"{type(out).__name__}", _describe(spec)
        dtype, device, sizes = spec
        got = (out.dtype, out.device.type, tuple(out.shape))
        if (out.dtype != dtype or out.device.type != device or out.dim() != len(sizes)
                or any(s is not None and s != o for s, o in zip(sizes, out.shape))):
            return i, _describe(got), _describe(spec)
    return None


def checked(fn: Callable[..., Any], gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """``fn`` (what the backend returns to Dynamo for ``gm``), its first call's outputs
    checked; ``fn`` itself where ``gm`` does not say what it returns."""
    specs = traced_outputs(gm)
    if specs is None:
        return fn
    verdict: bool | OutputMismatchError | None = None  # None until the first call returns

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal verdict
        if verdict is True:
            return fn(*args, **kwargs)
        if verdict is not None:
            raise verdict
        outputs = fn(*args, **kwargs)
        found = mismatch(outputs, specs)
        verdict = True if found is None else OutputMismatchError(*found)
        if found is not None:
            raise verdict
        return outputs

    return call
