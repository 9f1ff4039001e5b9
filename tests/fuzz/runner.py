"""Run fuzzer programs through Coil and eager, classify the result, and minimise failures.

`check(program)` runs a `Program` eagerly and twice through ``torch.compile(backend="coil")``
— the forward, then (for backward programs) the gradients of a fixed random projection of the
outputs — and compares outputs, inputs after the call (in-place updates) and gradients. A
program whose eager result moves when every value is jittered by a rounding error (ties
feeding sort or max-pool gradients, comparisons of equal values) is skipped as
ill-conditioned: a compiler may legitimately round differently there. An error is "coil"'s
when Coil's code raised it; `pytorch_fails_too` asks ``aot_eager`` whether PyTorch's own
stack fails the same way.
`minimize(program, outcome)` deletes outputs, steps and input features while the same kind of
failure remains, so a failure reads as a few lines of Python.

Long local runs (`tests/fuzz/campaign.py`)::

    python -m tests.fuzz.runner --examples 2000 --seed 7 --out /tmp/fuzz-repros

print counts as they go and save each failure, minimised, as a standalone repro script."""
from __future__ import annotations

import logging
import sys
import traceback
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Literal

import torch

from . import harness
from .programs import InputSpec, Program, load, measured_precision

log = logging.getLogger(__name__)

Status = Literal["pass", "skip", "mismatch", "error"]


@dataclass
class Outcome:
    """``phase``: for a mismatch, the first tensor kind that differs ("output", "input",
    "grad"); for an error or skip, the run that raised ("forward", "backward").
    ``origin`` (errors): "coil" when the innermost raising frame is Coil's code."""

    status: Status
    phase: str = ""
    detail: str = ""
    origin: str = ""
    graphs: list = field(default_factory=list, repr=False)

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "error")

    @property
    def signature(self) -> tuple[str, ...]:
        """What a minimised program must still show to count as the same failure."""
        if self.status == "error":
            return (self.status, self.phase, self.detail.split(":", 1)[0])
        return (self.status, self.phase)

    def __str__(self) -> str:
        where = f" ({self.origin})" if self.origin else ""
        return f"{self.status} in {self.phase or '-'}{where}: {self.detail}".rstrip(": ")


def _coil_roots() -> tuple[str, ...]:
    import coil
    import coil.sdk
    roots = [Path(coil.__file__).parent, Path(coil.sdk.__file__).parent]
    for name in ("coil_cpu_cpp", "coil_cuda_triton"):
        module = sys.modules.get(name)
        if module is not None and module.__file__:
            roots.append(Path(module.__file__).parent)
    return tuple(str(r) for r in roots)


def _innermost(error: BaseException) -> BaseException:
    seen = {id(error)}
    while True:
        nxt = error.__cause__ or error.__context__
        if nxt is None or id(nxt) in seen:
            return error
        seen.add(id(nxt))
        error = nxt


def _describe(error: BaseException) -> tuple[str, str]:
    """(``Type: first line [at file:line]``, origin) of the innermost exception."""
    inner = _innermost(error)
    frames = traceback.extract_tb(inner.__traceback__)
    roots = _coil_roots()
    coil_frames = [f for f in frames if f.filename.startswith(roots)]
    first = (str(inner).strip().splitlines() or [""])[0][:200]
    where = f" [at {Path(coil_frames[-1].filename).name}:{coil_frames[-1].lineno}]" if coil_frames else ""
    return f"{type(inner).__name__}: {first}{where}", "coil" if coil_frames else "torch"


def check(program: Program, backend: str = "coil") -> Outcome:
    """Run ``program`` eagerly and through ``torch.compile(backend=backend)`` and compare (see
    the module docstring)."""
    from coil.compile import add_observer, remove_observer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ns = load(program)
            ref = harness.collect(ns["program"], ns["make_inputs"], program.backward)
        except harness.PhaseError as exc:
            return Outcome("skip", exc.phase, _describe(exc.error)[0])
        except Exception as exc:  # noqa: BLE001 - a program eager cannot run is skipped
            return Outcome("skip", "inputs", _describe(exc)[0])
        precision = getattr(torch, program.precision)
        fresh = ns["make_inputs"]()
        mutated = frozenset(spec.name for spec, before, after in zip(program.inputs, fresh, ref.inputs)
                            if not torch.equal(before.detach(), after))
        jittered = load(program, jitter=True, mutated=mutated)
        try:
            noisy = harness.collect(jittered["program"], jittered["make_inputs"], program.backward)
        except harness.PhaseError as exc:
            return Outcome("skip", "conditioning", _describe(exc.error)[0])
        shaky = [d for d in harness.compare(ref, noisy, precision) if not d.ok]
        if shaky:
            return Outcome("skip", "conditioning", f"rounding-size noise moves {shaky[0]}")
        torch._dynamo.reset()
        graphs: list = []
        add_observer(graphs.append)
        try:
            compiled = torch.compile(ns["program"], backend=backend, dynamic=program.dynamic)
            # A second call runs the cached compiled code again on fresh inputs.
            calls = [harness.collect(compiled, ns["make_inputs"], program.backward) for _ in range(2)]
        except harness.PhaseError as exc:
            detail, origin = _describe(exc.error)
            return Outcome("error", exc.phase, detail, origin, graphs)
        finally:
            remove_observer(graphs.append)
    diffs = harness.compare_calls(ref, calls, precision)
    bad = [d for d in diffs if not d.ok]
    if bad:
        return Outcome("mismatch", bad[0].kind, "; ".join(map(str, bad[:4])), graphs=graphs)
    return Outcome("pass", graphs=graphs)


def pytorch_fails_too(program: Program, outcome: Outcome) -> bool:
    """Whether PyTorch's own compile stack without Coil (``aot_eager``: Dynamo and
    AOTAutograd, eager kernels) fails the same way: then the bug is not Coil's."""
    return check(program, backend="aot_eager").signature == outcome.signature


# -- minimising --------------------------------------------------------------------------------

def _simpler(program: Program) -> Iterator[Program]:
    """Variants of ``program`` one simplification away, most shrinking first."""
    for out in program.outputs if len(program.outputs) > 1 else []:
        yield program.with_outputs([o for o in program.outputs if o != out])
    for k, out in enumerate(program.outputs):  # return what the last step read instead
        for read in dict.fromkeys(program.reads(out)):
            if read not in program.outputs:
                yield program.with_outputs(program.outputs[:k] + [read] + program.outputs[k + 1:])
    for index in reversed(range(len(program.steps))):
        smaller = program.without_step(index)
        if smaller is not None:
            yield smaller
    if program.backward:
        yield replace(program, backward=False)
    if program.dynamic:
        yield replace(program, dynamic=False)
    for index, spec in enumerate(program.inputs):
        if spec.requires_grad:
            yield program.with_input(index, replace(spec, requires_grad=False))
        if spec.layout != "contiguous":
            yield program.with_input(index, InputSpec(spec.name, spec.shape, spec.dtype, spec.seed,
                                                      requires_grad=spec.requires_grad))


def minimize(program: Program, outcome: Outcome, max_trials: int = 80) -> Program:
    """The smallest variant of ``program`` found (greedily, at most ``max_trials`` compiles)
    that fails with ``outcome``'s signature."""
    target, trials = outcome.signature, 0
    program = program.pruned()
    improved = True
    while improved and trials < max_trials:
        improved = False
        for candidate in _simpler(program):
            if trials >= max_trials:
                break
            trials += 1
            if check(candidate).signature == target:
                log.info("minimise: %d steps, %d outputs", len(candidate.steps), len(candidate.outputs))
                program, improved = candidate, True
                break
    try:  # the dropped steps may have taken the program's lowest precision with them
        tighter = replace(program, precision=measured_precision(program))
    except Exception:  # noqa: BLE001 - keep the looser tolerance
        return program
    if tighter.precision != program.precision and check(tighter).signature == target:
        program = tighter
    return program


if __name__ == "__main__":
    from .campaign import main

    sys.exit(main())
