"""A model compiled with a ``torch.compile`` backend against the same model in eager.

:func:`check_inference` compares the outputs in ``eval()`` mode under ``torch.no_grad()``.
:func:`check_training` runs ``steps`` optimizer steps (SGD, lr 1e-3, momentum 0.9) on two
deep copies of the model, one compiled, and compares the loss and every parameter's gradient
at every step, the parameters after the last step and the floating-point buffers (BatchNorm
running statistics).

A tensor matches eager (:class:`Tolerance`) when

* shape and dtype are eager's and non-finite values sit where eager's do;
* ``max|actual - expected| <= atol + rtol * max|expected|`` — relative to the tensor's scale,
  not element-wise: a gradient summed in another order differs by a few ulps of its largest
  element, which element-wise ``rtol`` would fail on elements near zero;
* and the cosine similarity is at least ``min_cosine`` wherever ``max|expected| > atol`` (a
  tensor of rounding noise, e.g. the gradient of a bias that a norm cancels, has no direction).

For the gradients of one step, ``atol`` is raised to ``noise`` times the largest gradient
element of the whole model in that step: a mathematically zero gradient is rounding noise of
the size of the terms that cancelled, and those are the size of the other gradients (measured
in the zoo: 1e-11 to 2e-7 of the largest gradient).

float32: ``rtol=1e-3, atol=1e-6, noise=1e-6, min_cosine=0.999``; under bfloat16 autocast:
``rtol=5e-2, atol=1e-2, noise=1e-3, min_cosine=0.99``; a float64 model (``FP64``):
``rtol=1e-7, atol=1e-12, noise=1e-9, min_cosine=0.999999``.

A tensor outside these bounds is then judged by the same call in float64 (eager): it passes
when it is as close to float64 as eager's float32 tensor is (:func:`against_float32`), and its
line says so. Eager is not the truth: on an AVX2 host, oneDNN's float32 convolution gradients of
ResNet-18 are 3e-2 (relative) away from float64's, where a compiled model that computes them
otherwise is 1e-5 away, and fails the bounds against eager.

Training at batch 2 is chaotic: BatchNorm over a handful of values amplifies rounding
differences from step to step by themselves. At lr 1e-2, ResNet-18's float32 eager loss is 24%
away from float64's by the third step, and ShuffleNetV2's and EfficientNet-B0's compiled
losses drift 1e-2 from eager's with every gradient of the first step right; at lr 1e-3
ShuffleNetV2 stays within 1e-6 (EfficientNet-B0 at 2x3x64x64 drifts even at 1e-4, in eager
alone). Hence lr 1e-3. :func:`float64_drift` measures eager's own drift: look at it before
blaming the compiler for a mismatch that appears only after the first step.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """See the module docstring for how the three bounds combine."""

    rtol: float
    atol: float
    min_cosine: float
    noise: float = 0.0  # gradients: atol >= noise * (largest gradient element of the step)


FP32 = Tolerance(rtol=1e-3, atol=1e-6, min_cosine=0.999, noise=1e-6)
BF16_AUTOCAST = Tolerance(rtol=5e-2, atol=1e-2, min_cosine=0.99, noise=1e-3)
#: A float64 model against eager's float64 run: rounding amplified 1e5-fold by an
#: ill-conditioned training step (batch norm over a handful of values) is still 1e-11, far
#: inside; a compiler's wrong index or op is far outside.
FP64 = Tolerance(rtol=1e-7, atol=1e-12, min_cosine=0.999999, noise=1e-9)


@dataclasses.dataclass(frozen=True)
class TensorDiff:
    """One compared tensor: ``name`` says which (``output.logits``, ``grad.fc.weight``...)."""

    name: str
    ok: bool
    max_abs_diff: float
    max_abs_expected: float
    cosine: float  # nan where undefined (a zero tensor, or a shape mismatch)
    problem: str = ""  # why it failed, when the numbers do not say it
    #: Outside the bounds against eager, judged by float64: :func:`against_float32`'s verdict
    #: with both relative errors, e.g. ``"as accurate (1.2e-05, eager's 3.2e-02)"``.
    by_float64: str = ""

    def describe(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem}"
        text = (f"{self.name}: cosine {self.cosine:.4f}, max abs diff {self.max_abs_diff:.2e} "
                f"(eager max abs {self.max_abs_expected:.2e})")
        return text + (f"; against float64: {self.by_float64}" if self.by_float64 else "")


@dataclasses.dataclass
class CheckResult:
    """Every tensor compared for one model, backend and mode; ``error`` if the compiled run raised."""

    kind: Literal["inference", "training"]
    backend: str
    diffs: list[TensorDiff] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(d.ok for d in self.diffs)

    @property
    def failures(self) -> list[TensorDiff]:
        return [d for d in self.diffs if not d.ok]

    def min_cosine(self, prefix: str = "") -> float:
        """Smallest defined cosine among the tensors whose name starts with ``prefix``."""
        values = [d.cosine for d in self.diffs if d.name.startswith(prefix) and not math.isnan(d.cosine)]
        return min(values, default=math.nan)

    def message(self, limit: int = 25) -> str:
        """A readable verdict naming the wrong tensors (the first ``limit`` in model order)."""
        if self.error is not None:
            return f"{self.kind} with backend {self.backend!r} raised: {self.error}"
        if self.ok:
            judged = sum(bool(d.by_float64) for d in self.diffs)
            return (f"{self.kind} with backend {self.backend!r}: all {len(self.diffs)} tensors match eager"
                    + (f" ({judged} of them judged by float64: as close as eager's or closer)" if judged else ""))
        bad = self.failures
        groups: dict[str, tuple[int, int]] = {}
        for d in self.diffs:
            group = d.name.split(".", 1)[0]
            wrong, total = groups.get(group, (0, 0))
            groups[group] = (wrong + (not d.ok), total + 1)
        counts = ", ".join(f"{w} of {t} {g}" for g, (w, t) in groups.items() if w)
        lines = [f"{self.kind} with backend {self.backend!r} differs from eager: {counts} wrong"]
        lines += ["  " + d.describe() for d in bad[:limit]]
        if len(bad) > limit:
            lines.append(f"  ... and {len(bad) - limit} more")
        return "\n".join(lines)


def compare(name: str, actual: Any, expected: Any, tol: Tolerance = FP32) -> TensorDiff:
    """Compare one tensor with eager's (see the module docstring)."""
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return TensorDiff(name, False, math.nan, math.nan, math.nan,
                          f"got {type(actual).__name__}, eager gave {type(expected).__name__}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return TensorDiff(name, False, math.nan, math.nan, math.nan,
                          f"got {_spec(actual)}, eager gave {_spec(expected)}")
    a, e = actual.detach().double(), expected.detach().to(actual.device).double()
    if e.numel() == 0:
        return TensorDiff(name, True, 0.0, 0.0, math.nan)
    finite = torch.isfinite(e)
    same_nonfinite = torch.equal(a[~finite].nan_to_num(), e[~finite].nan_to_num())
    if not torch.equal(finite, torch.isfinite(a)) or not same_nonfinite:
        return TensorDiff(name, False, math.nan, math.nan, math.nan, "non-finite values differ from eager's")
    a, e = a[finite], e[finite]
    max_diff = (a - e).abs().max().item() if e.numel() else 0.0
    max_ref = e.abs().max().item() if e.numel() else 0.0
    norms = a.norm().item() * e.norm().item()
    cosine = (a.flatten() @ e.flatten()).item() / norms if norms > 0 else math.nan
    ok = max_diff <= tol.atol + tol.rtol * max_ref
    if max_ref > tol.atol:
        ok = ok and not math.isnan(cosine) and cosine >= tol.min_cosine
    return TensorDiff(name, ok, max_diff, max_ref, cosine)


#: :func:`against_float32`: a compiled tensor may be this many times as far from the float32
#: run as eager's (PyTorch's own benchmark harness judges reduced precision against a
#: higher-precision run the same way, with factors of 2-3) ...
ACCURACY_FACTOR = 2.0
#: ... or this far (relative), whatever eager's error.
ACCURACY_FLOOR = 1e-3
#: Where eager's own relative error against float32 is above this, the tensor is rounding
#: noise in reduced precision (a batch of 2 through batch norm, a gradient that cancels) and
#: says nothing about the compiler.
NOISE_LIMIT = 0.25


def relative_error(actual: torch.Tensor, truth: torch.Tensor) -> float:
    """``|actual - truth| / |truth|`` in the L2 norm, over the elements finite in both; inf
    where the shapes differ, 0 for an empty or zero ``truth`` that ``actual`` equals."""
    if actual.shape != truth.shape:
        return math.inf
    a, t = actual.detach().double(), truth.detach().to(actual.device).double()
    finite = torch.isfinite(a) & torch.isfinite(t)
    diff, norm = (a[finite] - t[finite]).norm().item(), t[finite].norm().item()
    if norm == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / norm


def against_float32(actual: torch.Tensor, eager: torch.Tensor, truth: torch.Tensor
                    ) -> Literal["as accurate", "worse", "noise"]:
    """A reduced-precision compiled tensor outside the tolerance against eager's, judged by
    ``truth`` (the same computation in float32): ``"as accurate"`` when its relative error
    is at most :data:`ACCURACY_FACTOR` times eager's (or :data:`ACCURACY_FLOOR`), ``"worse"``
    when not, ``"noise"`` when eager's own error is above :data:`NOISE_LIMIT` (a tensor
    within :data:`ACCURACY_FLOOR` of ``truth`` is as accurate whatever eager's). Under bf16
    autocast two runs of one step can each be a fair rounding of the float32 step and differ
    from each other by more than the tolerance (batch norm's statistics over bf16 convolution
    outputs)."""
    if actual.shape != eager.shape or actual.dtype != eager.dtype:
        return "worse"
    theirs, mine = relative_error(eager, truth), relative_error(actual, truth)
    if mine <= ACCURACY_FLOOR or (theirs <= NOISE_LIMIT and mine <= ACCURACY_FACTOR * theirs):
        return "as accurate"
    return "noise" if theirs > NOISE_LIMIT else "worse"


def flatten_output(output: Any, prefix: str = "output") -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor in a model's output (tensors, tuples, lists, dicts,
    transformers' ``ModelOutput``)."""
    if isinstance(output, torch.Tensor):
        yield prefix, output
    elif isinstance(output, dict):  # ModelOutput is an OrderedDict of its non-None fields
        for key, value in output.items():
            yield from flatten_output(value, f"{prefix}.{key}")
    elif isinstance(output, (tuple, list)):
        for i, value in enumerate(output):
            yield from flatten_output(value, f"{prefix}[{i}]")


def _compare_named(result: CheckResult, actual: dict[str, Any], expected: dict[str, Any],
                   tol: Callable[[str], Tolerance]) -> None:
    """Every tensor of ``expected`` (by name) against ``actual``'s; ``tol(name)`` bounds it."""
    for name, ref in expected.items():
        if name not in actual:
            result.diffs.append(TensorDiff(name, False, math.nan, math.nan, math.nan, "the compiled run has none"))
        else:
            result.diffs.append(_compare_grad(name, actual[name], ref, tol(name)))
    for name in actual.keys() - expected.keys():
        result.diffs.append(TensorDiff(name, False, math.nan, math.nan, math.nan, "eager has no such output"))


def judge_by_truth(result: CheckResult, actual: dict[str, Any], expected: dict[str, Any],
                   truth: dict[str, Any]) -> None:
    """Each tensor of ``result`` outside the bounds against eager's (numbers, no other
    problem) passes when :func:`against_float32` finds it as accurate as eager's against
    ``truth`` (the same call in float64); its :attr:`TensorDiff.by_float64` says what was
    found either way. "noise" (eager itself far from float64) does not pass."""
    for i, d in enumerate(result.diffs):
        got, ref, true = actual.get(d.name), expected.get(d.name), truth.get(d.name)
        if (d.ok or d.problem or not all(isinstance(t, torch.Tensor) for t in (got, ref, true))
                or not ref.is_floating_point()):
            continue
        verdict = against_float32(got, ref, true)
        errors = f"{relative_error(got, true):.1e}, eager's {relative_error(ref, true):.1e}"
        result.diffs[i] = dataclasses.replace(d, ok=verdict == "as accurate", by_float64=f"{verdict} ({errors})")


def widen(value: Any) -> Any:
    """A floating tensor in float64; anything else as it is."""
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _autocast(device_type: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _device_type(model: nn.Module) -> str:
    tensor = next(model.parameters(), None)
    return tensor.device.type if tensor is not None else "cpu"


def _describe_error(exc: BaseException) -> str:
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = next((ln for ln in str(root).splitlines() if ln.strip()), "")
    return f"{type(root).__name__}: {text}"[:500]


def _needs_truth(result: CheckResult) -> bool:
    return any(not d.ok and not d.problem for d in result.diffs)


def check_inference(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, *,
                    backend: str = "coil", autocast: torch.dtype | None = None,
                    tol: Tolerance | None = None, compile_options: dict[str, Any] | None = None
                    ) -> CheckResult:
    """Outputs of ``torch.compile(model, backend=backend)`` against eager, in eval mode under
    no_grad (and ``torch.autocast(autocast)`` when given), tensors outside the bounds judged by
    float64 (float32 under autocast); ``model`` itself is not touched."""
    kwargs = kwargs or {}
    tol = tol or (FP32 if autocast is None else BF16_AUTOCAST)
    result = CheckResult("inference", backend)
    compiled = torch.compile(copy.deepcopy(model).eval(), backend=backend, **(compile_options or {}))
    device_type = _device_type(model)

    def run(module: Callable[..., Any], a: tuple[Any, ...], kw: dict[str, Any],
            dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
        with torch.no_grad(), _autocast(device_type, dtype):
            return dict(flatten_output(module(*a, **kw)))

    expected = run(copy.deepcopy(model).eval(), args, kwargs, autocast)
    try:
        actual = run(compiled, args, kwargs, autocast)
    except Exception as exc:  # noqa: BLE001 - any compile or run failure is the verdict
        result.error = _describe_error(exc)
        return result
    _compare_named(result, actual, expected, lambda name: tol)
    if _needs_truth(result):
        cast = widen if autocast is None else (lambda v: v)
        truth = run(copy.deepcopy(model).eval().to(torch.float64 if autocast is None else torch.float32),
                    tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}, None)
        judge_by_truth(result, actual, expected, truth)
    return result


def _train(module: nn.Module, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           loss_fn: Callable[[Any], torch.Tensor], steps: int,
           make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
           seen: list[dict[str, torch.Tensor | None]] | None = None) -> list[dict[str, torch.Tensor | None]]:
    """``steps`` optimizer steps of ``call`` (which updates ``module``): per step, appended to
    ``seen`` and returned, the loss and every parameter's gradient (None where it has none)."""
    opt = make_optimizer(list(module.parameters()))
    seen = [] if seen is None else seen
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(call(*args, **kwargs))
        loss.backward()
        seen.append({"loss": loss.detach().clone(),
                     **{n: None if p.grad is None else p.grad.detach().clone()
                        for n, p in module.named_parameters()}})
        opt.step()
    return seen


def _named_state(seen: list[dict[str, torch.Tensor | None]], module: nn.Module) -> dict[str, Any]:
    """A training run's tensors by the names :func:`check_training` compares them under."""
    named: dict[str, Any] = {}
    for step, tensors in enumerate(seen):
        for name, t in tensors.items():
            named[f"loss[{step}]" if name == "loss" else f"grad[{step}].{name}"] = t
    named.update({f"param.{n}": p.detach() for n, p in module.named_parameters()})
    named.update({f"buffer.{n}": b for n, b in module.named_buffers() if b.is_floating_point()})
    return named


def check_training(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                   loss_fn: Callable[[Any], torch.Tensor], *, backend: str = "coil", steps: int = 3,
                   tol: Tolerance = FP32, compile_options: dict[str, Any] | None = None,
                   make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
                   ) -> CheckResult:
    """``steps`` training steps of ``torch.compile(model, backend=backend)`` against eager,
    tensors outside the bounds judged by the same steps in float64.

    ``kwargs`` should include the training-only inputs (labels); ``loss_fn(output)`` is the
    scalar loss. Compared, in this order: ``loss[i]`` and ``grad[i].<param>`` for each step
    ``i``, ``param.<name>`` after the last step, ``buffer.<name>``."""
    kwargs = kwargs or {}
    make_optimizer = make_optimizer or (lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9))
    result = CheckResult("training", backend)
    eager_model = copy.deepcopy(model).train()
    eager = _named_state(_train(eager_model, eager_model, args, kwargs, loss_fn, steps, make_optimizer),
                         eager_model)
    compiled_model = copy.deepcopy(model).train()
    compiled = torch.compile(compiled_model, backend=backend, **(compile_options or {}))
    seen: list[dict[str, torch.Tensor | None]] = []
    try:
        _train(compiled_model, compiled, args, kwargs, loss_fn, steps, make_optimizer, seen)
    except Exception as exc:  # noqa: BLE001 - any compile or run failure is the verdict
        result.error = f"step {len(seen)}: {_describe_error(exc)}"
        return result
    actual = _named_state(seen, compiled_model)
    # a step's gradients: atol is at least `noise` times the step's largest gradient element
    largest = [max((g.abs().max().item() for n, g in eager.items()
                    if n.startswith(f"grad[{step}].") and g is not None and g.numel()), default=0.0)
               for step in range(steps)]

    def bound(name: str) -> Tolerance:
        if not name.startswith("grad["):
            return tol
        step = int(name[5:name.index("]")])
        return dataclasses.replace(tol, atol=max(tol.atol, tol.noise * largest[step]))
    _compare_named(result, actual, eager, bound)
    if _needs_truth(result):
        model64 = copy.deepcopy(model).double().train()
        truth = _named_state(_train(model64, model64, tuple(widen(a) for a in args),
                                    {k: widen(v) for k, v in kwargs.items()}, loss_fn, steps, make_optimizer),
                             model64)
        judge_by_truth(result, actual, eager, truth)
    return result


def _compare_grad(name: str, actual: Any, expected: Any, tol: Tolerance) -> TensorDiff:
    """:func:`compare`, where either may be a gradient that is None."""
    if expected is not None and actual is not None:
        return compare(name, actual, expected, tol)
    if expected is None and actual is None:
        return TensorDiff(name, True, 0.0, 0.0, math.nan)
    state = {True: "None", False: "set"}
    return TensorDiff(name, False, math.nan, math.nan, math.nan,
                      f"gradient is {state[actual is None]}, eager's is {state[expected is None]}")


def _spec(t: torch.Tensor) -> str:
    return f"{t.dtype}{list(t.shape)}"


def float64_drift(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
                  loss_fn: Callable[[Any], torch.Tensor], *, backend: str | None = None,
                  steps: int = 3, lr: float = 1e-3) -> list[float]:
    """Relative error, per step, of the float32 training loss (eager, or compiled with
    ``backend``) against eager in float64, both from ``model``'s weights with SGD (``lr``,
    momentum 0.9).

    A float32 eager drift as large as the compiled one's means the model's training is
    ill-conditioned at this size, not that the compiler is wrong."""
    kwargs = kwargs or {}

    def run(module: nn.Module, call: Callable[..., Any], cast: Callable[[Any], Any]) -> list[float]:
        opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
        a, kw = tuple(cast(v) for v in args), {k: cast(v) for k, v in kwargs.items()}
        losses = []
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(call(*a, **kw))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def to_double(v: Any) -> Any:
        return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    reference = copy.deepcopy(model).double().train()
    expected = run(reference, reference, to_double)
    model32 = copy.deepcopy(model).train()
    call = model32 if backend is None else torch.compile(model32, backend=backend)
    actual = run(model32, call, lambda v: v)
    return [abs(a - e) / max(abs(e), 1e-30) for a, e in zip(actual, expected)]
