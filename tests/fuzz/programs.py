"""Random straight-line tensor programs for the fuzzer, as data that prints as Python.

A `Program` is a list of input specs (shape, dtype, memory layout, seed, requires_grad) and a
list of `Step` records, each one line of Python (``v3 = torch.tanh(a0)`` or
``v2[:, 1::2].add_(v0)``). `Program.to_source()` gives the two functions a repro script needs,
``make_inputs()`` and ``program(...)``, and the fuzzer runs exactly that text, so what a
failure prints is what failed.

`programs()` is the hypothesis strategy. It builds a program step by step while running it
eagerly on the real inputs (a *dry run*): a step whose eager run raises, makes a value that is
not finite or too large, or breaks autograd is dropped, so nearly every program drawn is one
eager accepts. The op families live in `tests/fuzz/ops.py`."""
from __future__ import annotations

import json
import logging
import math
import random
import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from hypothesis import reject, strategies as st

from . import harness

log = logging.getLogger(__name__)

Layout = Literal["contiguous", "permuted", "strided", "channels_last", "offset", "expanded"]

#: Largest number of elements of any value a step may make, and largest magnitude.
MAX_NUMEL = 2048
MAX_ABS = 1e4


def shape_src(shape: tuple[int, ...]) -> str:
    """``(2, 3)``, ``(2,)``, ``()``: a tuple literal."""
    return f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"


@dataclass(frozen=True)
class InputSpec:
    """One program input: a ``randn`` of ``shape`` seen through ``layout``.

    ``permuted``: memory order ``perm`` (a permute of a contiguous tensor); ``strided``: every
    ``step``-th element along ``dim`` from ``start``; ``channels_last``: 4-D NHWC;
    ``offset``: an ``as_strided`` view at ``offset`` of a larger buffer whose rows are padded
    by ``pad``; ``expanded``: dim ``dim`` broadcast from size 1 (stride 0)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    seed: int
    layout: Layout = "contiguous"
    perm: tuple[int, ...] = ()
    dim: int = 0
    step: int = 2
    start: int = 0
    pad: tuple[int, ...] = ()
    offset: int = 0
    requires_grad: bool = False

    def expression(self) -> str:
        dtype = f"torch.{self.dtype}"
        if self.layout == "permuted":
            base = tuple(self.shape[p] for p in self.perm)
            inverse = tuple(sorted(range(len(self.perm)), key=lambda i: self.perm[i]))
            src = f"randn({shape_src(base)}, {self.seed}, {dtype}).permute{shape_src(inverse)}"
        elif self.layout == "strided":
            base = tuple(s * self.step if i == self.dim else s for i, s in enumerate(self.shape))
            index = [":"] * self.dim + [f"{self.start or ''}::{self.step}"]
            src = f"randn({shape_src(base)}, {self.seed}, {dtype})[{', '.join(index)}]"
        elif self.layout == "channels_last":
            src = (f"randn({shape_src(self.shape)}, {self.seed}, {dtype})"
                   ".to(memory_format=torch.channels_last)")
        elif self.layout == "offset":
            padded = [s + p for s, p in zip(self.shape, self.pad)]
            strides = [math.prod(padded[i + 1:]) for i in range(len(padded))]
            numel = self.offset + math.prod(padded)
            src = (f"randn(({numel},), {self.seed}, {dtype})"
                   f".as_strided({shape_src(self.shape)}, {shape_src(tuple(strides))}, {self.offset})")
        elif self.layout == "expanded":
            base = tuple(1 if i == self.dim else s for i, s in enumerate(self.shape))
            src = f"randn({shape_src(base)}, {self.seed}, {dtype}).expand{shape_src(self.shape)}"
        else:
            src = f"randn({shape_src(self.shape)}, {self.seed}, {dtype})"
        return src + (".requires_grad_()" if self.requires_grad else "")


@dataclass(frozen=True)
class Step:
    """One line of the program. ``out`` names the value it defines (``None`` for an in-place
    statement); ``family`` is the op family that drew it (for statistics)."""

    out: str | None
    code: str
    family: str

    @property
    def line(self) -> str:
        return f"{self.out} = {self.code}" if self.out else self.code

    def __repr__(self) -> str:
        return self.line


_NAME = re.compile(r"\b[av]\d+\b")


@dataclass
class Program:
    inputs: list[InputSpec]
    steps: list[Step]
    outputs: list[str]
    backward: bool
    #: the lowest-precision floating dtype any value of the program has (picks the tolerance)
    precision: str = "float32"
    #: compile with ``dynamic=True`` (symbolic sizes in every kernel)
    dynamic: bool = False

    def to_source(self, jitter: bool = False, mutated: frozenset[str] = frozenset()) -> str:
        """``make_inputs()`` and ``program(...)``, runnable where ``torch``, ``F`` and
        `harness.randn` are defined; with ``jitter``, every input but the ``mutated`` ones
        and every computed value passes through `harness.jitter` (the conditioning check)."""
        lines = ["def make_inputs():"]
        lines += [f"    {i.name} = {i.expression()}" for i in self.inputs]
        lines += [f"    return [{', '.join(i.name for i in self.inputs)}]", "", ""]
        lines.append(f"def program({', '.join(i.name for i in self.inputs)}):")
        if jitter:  # an input the program writes into must stay the caller's tensor
            lines += [f"    {i.name} = jitter({i.name}, None, {100 + k})"
                      for k, i in enumerate(self.inputs) if i.name not in mutated]
        # Without in-place updates aliasing cannot matter: jitter views too.
        scope = "locals()" if any(s.out is None for s in self.steps) else "None"
        for k, step in enumerate(self.steps):
            lines.append(f"    {step.line}")
            if jitter and step.out:
                lines.append(f"    {step.out} = jitter({step.out}, {scope}, {k})")
        lines.append(f"    return ({', '.join(self.outputs)},)")
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        mode = "forward and backward" if self.backward else "forward only"
        dynamic = ", dynamic=True" if self.dynamic else ""
        return f"# {mode}, precision {self.precision}{dynamic}\n{self.to_source()}"

    def to_json(self) -> str:
        """One line that `Program.from_json` reads back (repro scripts carry it)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Program":
        data = json.loads(text)
        inputs = [InputSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in i.items()})
                  for i in data.pop("inputs")]
        return cls(inputs, [Step(**s) for s in data.pop("steps")], **data)

    def families(self) -> list[str]:
        return [s.family for s in self.steps]

    # -- smaller variants, for the minimiser ---------------------------------------------
    def pruned(self) -> "Program":
        """Drop inputs no step or output names."""
        used = {n for s in self.steps for n in _NAME.findall(s.code)} | set(self.outputs)
        return replace(self, inputs=[i for i in self.inputs if i.name in used])

    def without_step(self, index: int) -> "Program | None":
        step = self.steps[index]
        outputs = [o for o in self.outputs if o != step.out]
        if not outputs:
            return None
        return replace(self, steps=self.steps[:index] + self.steps[index + 1:], outputs=outputs).pruned()

    def reads(self, name: str) -> list[str]:
        """The values (not inputs) the step defining ``name`` reads."""
        step = next((s for s in self.steps if s.out == name), None)
        return [] if step is None else [n for n in _NAME.findall(step.code) if n.startswith("v")]

    def with_outputs(self, outputs: list[str]) -> "Program":
        return replace(self, outputs=outputs)

    def with_input(self, index: int, spec: InputSpec) -> "Program":
        return replace(self, inputs=self.inputs[:index] + [spec] + self.inputs[index + 1:])


def namespace() -> dict[str, object]:
    """The globals a program's source runs in."""
    return {"torch": torch, "F": F, "randn": harness.randn, "jitter": harness.jitter}


def load(program: Program, jitter: bool = False, mutated: frozenset[str] = frozenset()) -> dict[str, object]:
    """Execute ``program.to_source(jitter, mutated)``; the result holds ``make_inputs`` and
    ``program``."""
    ns = namespace()
    exec(compile(program.to_source(jitter, mutated), "<fuzz program>", "exec"), ns)  # noqa: S102 - our own text
    return ns


_PRECISION_ORDER = ["float64", "float32", "float16", "bfloat16"]


@dataclass
class Scope:
    """A program under construction and its dry run: ``env`` maps each name to its eager value."""

    inputs: list[InputSpec]
    backward: bool
    dtype: str
    seed: int
    steps: list[Step] = field(default_factory=list)
    env: dict[str, object] = field(default_factory=dict)
    #: uniform choices (family, chaining) that hypothesis's biased draws would skew
    rng: random.Random = field(default_factory=random.Random)
    #: storages in-place steps must not write: those of ``unfold`` views, whose mutation
    #: AOTAutograd's functionalization refuses even where eager allows it
    read_only: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.replay()

    # -- what generators ask --------------------------------------------------------------
    def names(self, pred: Callable[[torch.Tensor], bool] | None = None,
              include_inputs: bool = True) -> list[str]:
        """Floating-point values, most recent first."""
        out = []
        for name, value in reversed(list(self.env.items())):
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                continue
            if not include_inputs and name.startswith("a"):
                continue
            if pred is None or pred(value):
                out.append(name)
        return out

    def tensor(self, name: str) -> torch.Tensor:
        value = self.env[name]
        assert isinstance(value, torch.Tensor)
        return value

    def new_name(self) -> str:
        return f"v{sum(1 for s in self.steps if s.out)}"

    def add_input(self, shape: tuple[int, ...], requires_grad: bool | None = None) -> str:
        """A new contiguous input (a weight for a library call); it requires grad in backward
        programs unless told otherwise."""
        name = f"a{len(self.inputs)}"
        grad = self.backward if requires_grad is None else requires_grad
        spec = InputSpec(name, tuple(shape), self.dtype, self.seed + 101 * (len(self.inputs) + 1),
                         requires_grad=grad)
        self.inputs.append(spec)
        self.env[name] = eval(spec.expression(), namespace())  # noqa: S307 - our own text
        return name

    # -- the dry run ----------------------------------------------------------------------
    def replay(self) -> None:
        """Rebuild ``env`` from the inputs and accepted steps."""
        self.env = namespace()
        self.read_only = set()
        for spec in self.inputs:
            self.env[spec.name] = eval(spec.expression(), self.env)  # noqa: S307
        for step in self.steps:
            exec(step.line, self.env)  # noqa: S102
            self._note(step)

    def _note(self, step: Step) -> None:
        if step.out and ".unfold(" in step.code:
            self.read_only.add(self.tensor(step.out).untyped_storage().data_ptr())

    def writable(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() not in self.read_only

    def try_step(self, step: Step) -> bool:
        """Run ``step`` eagerly; keep it if it runs and every value stays finite and small."""
        n_inputs = len(self.inputs)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(step.line, self.env)  # noqa: S102
                self._validate(step)
        except Exception:  # noqa: BLE001 - any eager failure just drops the step
            del self.inputs[n_inputs:]
            self.replay()
            return False
        self.steps.append(step)
        self._note(step)
        return True

    def _validate(self, step: Step) -> None:
        tensors = [v for k, v in self.env.items() if isinstance(v, torch.Tensor) and k[0] in "av"]
        if step.out is not None:
            value = self.env[step.out]
            if not isinstance(value, torch.Tensor) or not 0 < value.numel() <= MAX_NUMEL or value.dim() > 6:
                raise ValueError("unwanted value")
        for t in tensors:
            if t.is_floating_point() and t.numel() and not bool(t.detach().abs().le(MAX_ABS).all()):
                raise ValueError("value too large or not finite")
        if self.backward and step.out is None:
            # An in-place update may overwrite a value autograd saved: eager would raise at
            # backward time, so check now, while the step can still be dropped.
            live = [t for t in tensors if t.requires_grad and t.is_floating_point()]
            leaves = [t for t in tensors if t.is_leaf and t.requires_grad]
            if live and leaves:
                torch.autograd.grad(sum(t.float().sum() for t in live), leaves,
                                    allow_unused=True, retain_graph=True)

    def precision(self) -> str:
        """The lowest-precision floating dtype among all values (names are never rebound, so
        ``env`` holds every value the program made)."""
        dtypes = [str(v.dtype).removeprefix("torch.") for v in self.env.values()
                  if isinstance(v, torch.Tensor) and v.is_floating_point()]
        return max(dtypes, key=_PRECISION_ORDER.index, default=self.dtype)

    def program(self, outputs: list[str]) -> Program:
        return Program(list(self.inputs), list(self.steps), outputs, self.backward, self.precision())


def measured_precision(program: Program) -> str:
    """The precision a program's values really have (after the minimiser dropped steps, a
    program may no longer touch the lower-precision dtype it started with)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scope = Scope(list(program.inputs), program.backward, program.precision, 0,
                      steps=list(program.steps))
    return scope.precision()


# -- the strategy ---------------------------------------------------------------------------

LAYOUTS: list[Layout] = ["contiguous", "permuted", "strided", "channels_last", "offset", "expanded"]


@st.composite
def input_spec(draw: st.DrawFn, name: str, shape: tuple[int, ...], dtype: str, seed: int,
               requires_grad: bool) -> InputSpec:
    """An input of ``shape`` in a random memory layout."""
    # 4-D inputs are where channels_last meets convolutions, pooling and attention.
    layout = draw(st.sampled_from(LAYOUTS + ["channels_last"] * 2 if len(shape) == 4 else LAYOUTS))
    spec = InputSpec(name, shape, dtype, seed, requires_grad=requires_grad)
    rank = len(shape)
    if layout == "permuted" and rank >= 2:
        perm = tuple(draw(st.permutations(range(rank))))
        return replace(spec, layout="permuted", perm=perm)
    if layout == "strided" and rank >= 1:
        step = draw(st.integers(2, 3))
        return replace(spec, layout="strided", dim=draw(st.integers(0, rank - 1)), step=step,
                       start=draw(st.integers(0, step - 1)))
    if layout == "channels_last" and rank == 4:
        return replace(spec, layout="channels_last")
    if layout == "offset" and rank >= 1:
        pad = tuple(draw(st.lists(st.integers(0, 2), min_size=rank, max_size=rank)))
        return replace(spec, layout="offset", pad=pad, offset=draw(st.integers(1, 7)))
    if layout == "expanded" and rank >= 1:
        big = [d for d, s in enumerate(shape) if s > 1]
        if big:
            return replace(spec, layout="expanded", dim=draw(st.sampled_from(big)))
    return spec


@st.composite
def _shape(draw: st.DrawFn) -> tuple[int, ...]:
    """Dims of 1-7; one shape in eight has a wide last dim (8-40), so that kernels run their
    vector bodies and not only their remainder loops."""
    rank = draw(st.sampled_from([4, 3, 2, 4, 1, 3, 4]))
    shape = draw(st.lists(st.integers(1, 7), min_size=rank, max_size=rank))
    if draw(st.integers(0, 7)) == 0:
        shape[-1] = draw(st.integers(8, 40))
    return tuple(shape)


@st.composite
def _related_shape(draw: st.DrawFn, base: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that often broadcasts with ``base``: the same, a suffix, some dims set to 1,
    or unrelated."""
    kind = draw(st.sampled_from(["same", "suffix", "ones", "other"]))
    if kind == "same":
        return base
    if kind == "suffix" and len(base) > 1:
        return base[draw(st.integers(1, len(base) - 1)):]
    if kind == "ones":
        return tuple(1 if draw(st.booleans()) else s for s in base)
    return draw(_shape())


@st.composite
def programs(draw: st.DrawFn, max_steps: int = 10, families: tuple[str, ...] | None = None,
             allow_dynamic: bool = True) -> Program:
    """A random program of 2..``max_steps`` steps over 1-3 inputs (``families`` restricts the
    op families; see `tests/fuzz/ops.py`); a quarter of them compile with dynamic shapes
    (unless ``allow_dynamic`` is false)."""
    from . import ops  # ops imports this module

    dtype = draw(st.sampled_from(["float32"] * 8 + ["bfloat16", "float64"]))
    backward = draw(st.booleans())
    dynamic = draw(st.integers(0, 3)) == 0 and allow_dynamic
    seed = draw(st.integers(0, 10_000))
    base = draw(_shape())
    shapes = [base] + draw(st.lists(_related_shape(base), max_size=2))
    inputs = []
    for k, shape in enumerate(shapes):
        grad = backward and (k == 0 or draw(st.booleans()))
        inputs.append(draw(input_spec(f"a{k}", shape, dtype, seed + 101 * k, grad)))
    # The family sequence comes from a seeded uniform generator: hypothesis's own choices lean
    # hard towards the first option and short lists, which starved the rarer families.
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    scope = Scope(inputs, backward, dtype, seed, rng=rng)
    for _ in range(rng.randint(min(2, max_steps), max_steps)):
        n_inputs = len(scope.inputs)
        try:
            step = ops.draw_step(draw, scope, ops.choose_family(rng, families))
        except (RuntimeError, ValueError, IndexError) as exc:  # a generator misjudged a shape
            log.debug("step generator failed: %s", exc)
            del scope.inputs[n_inputs:]
            scope.replay()
            continue
        if step is not None:
            scope.try_step(step)
    values = scope.names(include_inputs=False)
    for name in scope.names() if not values else []:  # every step was dropped: add one
        if scope.try_step(Step(scope.new_name(), f"torch.tanh({name})", "pointwise")):
            values = scope.names(include_inputs=False)
            break
    if not values:
        reject()
    outputs = [values[0]] + [v for v in values[1:] if draw(st.integers(0, 3)) == 0][:2]
    return replace(scope.program(outputs), dynamic=dynamic)
