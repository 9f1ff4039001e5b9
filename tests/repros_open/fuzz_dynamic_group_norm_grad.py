"""Coil fuzzer repro (forward and backward, dynamic=True): mismatch in grad: grad 0: max abs diff inf (allowed 0) MISMATCH non-finite values differ

Found by tests/fuzz. `python this.py` runs the program eagerly and twice through
torch.compile(backend="coil") and compares outputs, inputs after the call and
gradients; `python this.py aot_eager` checks PyTorch's own compile stack instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def make_inputs():
    a0 = randn((3, 3, 6, 2), 3455, torch.float32).requires_grad_()
    return [a0]


def program(a0):
    v0 = a0.square()
    v1 = F.group_norm(v0, 1)
    return (v1,)


# -- the fuzzer's harness (tests/fuzz/harness.py) ----------------------------------------

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

#: (rtol, atol) per lowest floating dtype a program touches. atol is scaled by the largest
#: magnitude of the reference tensor (at least 1), so sums over many elements are not held
#: to an absolute bound that their own rounding would break.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (4e-2, 4e-2),
    torch.float16: (1e-2, 1e-2),
}


def randn(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A standard-normal tensor from its own seeded generator (inputs do not share a stream,
    so removing one input while minimising leaves the others' values unchanged)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


def jitter(value: Any, scope: dict[str, Any] | None, seed: int) -> Any:
    """``value`` times ``1 + 2 eps noise`` (``eps`` of its dtype): the rounding a compiler may
    legitimately differ by. A run with every value jittered that disagrees with the plain run
    marks a program as ill-conditioned (ties feeding sort or max-pool gradients, comparisons
    of equal values, normalising a constant row), whose compiled result can differ without a
    bug. With a ``scope`` (programs with in-place updates), an alias of another value in it (a
    view, a cast to its own dtype) is left alone, so that updates through it still reach the
    other."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    if scope is not None:
        ptr = value.untyped_storage().data_ptr()
        sharing = [v for v in scope.values() if isinstance(v, torch.Tensor)
                   and v.untyped_storage().data_ptr() == ptr]
        if len(sharing) > 1:
            return value
    noise = randn(tuple(value.shape), 9000 + seed)
    return value * (1 + 2 * torch.finfo(value.dtype).eps * noise).to(value.dtype)


class PhaseError(Exception):
    """A run raised; ``phase`` says where ("forward" or "backward")."""

    def __init__(self, phase: str, error: BaseException) -> None:
        super().__init__(f"{phase}: {type(error).__name__}: {error}")
        self.phase = phase
        self.error = error


@dataclass
class RunResult:
    outputs: list[Any]
    inputs: list[torch.Tensor]
    grads: list[torch.Tensor | None] = field(default_factory=list)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _snapshot(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def collect(fn: Callable[..., Any], make_inputs: Callable[[], list[torch.Tensor]],
            backward: bool, weight_seed: int = 1234) -> RunResult:
    """Run ``fn`` on fresh inputs; with ``backward``, also the gradients of
    ``sum_k (out_k * w_k).sum()`` (``w_k`` fixed random) for every input that requires grad."""
    inputs = make_inputs()
    # Leaves are chosen before the call: an in-place write of grad-requiring data into an
    # input makes it require grad afterwards, as a non-leaf eager and AOTAutograd treat apart.
    leaves = [i for i in inputs if i.requires_grad]
    try:
        outs = _as_list(fn(*inputs))
    except Exception as exc:  # noqa: BLE001 - the caller classifies it
        raise PhaseError("forward", exc) from exc
    result = RunResult([_snapshot(o) for o in outs], [i.detach().clone() for i in inputs])
    if not backward:
        return result
    terms = [(o.float() * randn(tuple(o.shape), weight_seed + k)).sum()
             for k, o in enumerate(outs)
             if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]
    if not leaves or not terms:
        return result
    try:
        grads = torch.autograd.grad(sum(terms), leaves, allow_unused=True)
    except Exception as exc:  # noqa: BLE001
        raise PhaseError("backward", exc) from exc
    result.grads = [None if g is None else g.detach().clone() for g in grads]
    return result


@dataclass
class Diff:
    """One compared tensor: ``kind`` is "output", "input" (its value after the call, which
    shows input mutations) or "grad"; ``ok`` false is a mismatch."""

    kind: str
    index: int
    ok: bool
    max_abs: float
    allowed: float
    detail: str = ""

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        return (f"{self.kind} {self.index}: max abs diff {self.max_abs:.3g} "
                f"(allowed {self.allowed:.3g}) {verdict} {self.detail}").rstrip()


def compare_tensor(kind: str, index: int, ref: Any, got: Any, precision: torch.dtype) -> Diff:
    """Compare one value of the eager run (``ref``) with the compiled run's (``got``)."""
    if kind == "grad" and (ref is None) != (got is None):
        given = got if ref is None else ref
        if isinstance(given, torch.Tensor) and not bool(given.ne(0).any()):
            return Diff(kind, index, True, 0.0, 0.0, "(no gradient on one side, zeros on the other)")
    if not isinstance(ref, torch.Tensor) or not isinstance(got, torch.Tensor):
        same = (ref is None and got is None) or (not isinstance(ref, torch.Tensor) and ref == got)
        return Diff(kind, index, same, 0.0 if same else math.inf, 0.0,
                    "" if same else f"eager {type(ref).__name__}, compiled {type(got).__name__}")
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return Diff(kind, index, False, math.inf, 0.0,
                    f"eager {tuple(ref.shape)} {ref.dtype}, compiled {tuple(got.shape)} {got.dtype}")
    if not ref.is_floating_point():
        bad = int((ref != got).sum())
        return Diff(kind, index, bad == 0, float(bad), 0.0, f"{bad} elements differ" if bad else "")
    coarsest = max(precision, ref.dtype, key=lambda d: torch.finfo(d).eps)
    rtol, atol = TOLERANCE.get(coarsest, TOLERANCE[torch.float32])
    r, g = ref.double(), got.double()
    finite = torch.isfinite(r)
    if not torch.equal(finite, torch.isfinite(g)) or not torch.equal(r[~finite].nan_to_num(),
                                                                       g[~finite].nan_to_num()):
        return Diff(kind, index, False, math.inf, 0.0, "non-finite values differ")
    if not finite.any():
        return Diff(kind, index, True, 0.0, 0.0)
    r, g = r[finite], g[finite]
    scale = max(1.0, float(r.abs().max()))
    err = (r - g).abs()
    bound = atol * scale + rtol * r.abs()
    worst = int((err - bound).argmax())
    ok = bool((err <= bound).all())
    detail = "" if ok else f"at flat {worst}: eager {float(r[worst]):.6g}, compiled {float(g[worst]):.6g}"
    return Diff(kind, index, ok, float(err.max()), atol * scale, detail)


def compare(ref: RunResult, got: RunResult, precision: torch.dtype) -> list[Diff]:
    """Every output, every input's value after the call, and every gradient."""
    diffs = [compare_tensor("output", i, r, g, precision)
             for i, (r, g) in enumerate(zip(ref.outputs, got.outputs))]
    if len(ref.outputs) != len(got.outputs):
        diffs.append(Diff("output", len(ref.outputs), False, math.inf, 0.0,
                          f"{len(ref.outputs)} outputs in eager, {len(got.outputs)} compiled"))
    diffs += [compare_tensor("input", i, r, g, precision)
              for i, (r, g) in enumerate(zip(ref.inputs, got.inputs))]
    diffs += [compare_tensor("grad", i, r, g, precision)
              for i, (r, g) in enumerate(zip(ref.grads, got.grads))]
    if len(ref.grads) != len(got.grads):
        diffs.append(Diff("grad", len(ref.grads), False, math.inf, 0.0,
                          f"{len(ref.grads)} gradients in eager, {len(got.grads)} compiled"))
    return diffs


def compare_calls(ref: RunResult, calls: list[RunResult], precision: torch.dtype) -> list[Diff]:
    """`compare` for each of several compiled calls (the first compiles, later ones reuse)."""
    diffs = []
    for n, got in enumerate(calls):
        for d in compare(ref, got, precision):
            d.detail = (d.detail + f" (call {n + 1})").strip() if n else d.detail
            diffs.append(d)
    return diffs


def main(program: Callable[..., Any], make_inputs: Callable[[], list[torch.Tensor]],
         backward: bool, precision: torch.dtype, backend: str = "coil", dynamic: bool = False) -> int:
    """A repro script's entry point: eager against two calls of
    ``torch.compile(backend=backend)`` (``python repro.py aot_eager`` checks whether
    PyTorch's own stack shows the failure); prints every compared tensor's largest difference
    and returns 1 on a mismatch."""
    ref = collect(program, make_inputs, backward)
    torch._dynamo.reset()
    compiled = torch.compile(program, backend=backend, dynamic=dynamic)
    calls = [collect(compiled, make_inputs, backward) for _ in range(2)]
    diffs = compare_calls(ref, calls, precision)
    for d in diffs:
        print(d)
    bad = [d for d in diffs if not d.ok]
    print(f"{len(bad)} mismatch(es); max abs diff {max((d.max_abs for d in diffs), default=0.0):.3g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(program, make_inputs, backward=True, precision=torch.float32,
                  backend=(sys.argv[1:] or ['coil'])[0], dynamic=True))

# fuzz-program: {"inputs":[{"name":"a0","shape":[3,3,6,2],"dtype":"float32","seed":3455,"layout":"contiguous","perm":[],"dim":0,"step":2,"start":0,"pad":[],"offset":0,"requires_grad":true}],"steps":[{"out":"v0","code":"a0.square()","family":"pointwise"},{"out":"v1","code":"F.group_norm(v0, 1)","family":"normalize"}],"outputs":["v1"],"backward":true,"precision":"float32","dynamic":true}
