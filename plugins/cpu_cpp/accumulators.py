"""How each reduction type accumulates in C++: the fields of its state, their initial values,
and the ``coil::<kind>_update`` / ``coil::<kind>_combine`` header functions that fold in one
value or another state.

A state is a few plain variables rather than a struct, and a kernel keeps one state per SIMD
lane as arrays (struct of arrays): GCC vectorises elementwise updates of arrays, but not
OpenMP user-defined reductions over structs."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    suffix: str
    ctype: str
    init: str


@dataclass(frozen=True)
class Accumulator:
    """The state of one reduction, named ``name`` plus a per-field suffix in C++."""

    name: str
    kind: str  # prefix of the header functions
    ctype: str  # their template argument
    fields: tuple[Field, ...]
    takes_index: bool  # whether an update also gets the flat reduction index
    results: tuple[str, ...]  # the field suffix each output of the node reads

    def refs(self, prefix: str, lane: str = "") -> list[str]:
        """C++ references to the fields of the state ``prefix + name`` (``lane``: an
        array subscript such as ``[lane]``, for per-lane states)."""
        return [f"{prefix}{self.name}{f.suffix}{lane}" for f in self.fields]

    def declare(self, prefix: str, lanes: int | None = None) -> list[str]:
        """Declarations of the state, initialised unless it is an array of ``lanes``."""
        names = self.refs(prefix)
        if lanes is None:
            return [f"{f.ctype} {n} = {f.init};" for f, n in zip(self.fields, names)]
        return [f"{f.ctype} {n}[{lanes}];" for f, n in zip(self.fields, names)]

    def init(self, prefix: str, lane: str) -> list[str]:
        return [f"{n} = {f.init};" for f, n in zip(self.fields, self.refs(prefix, lane))]

    def update(self, prefix: str, lane: str, value: str, index: str) -> str:
        args = [*self.refs(prefix, lane), value] + ([index] if self.takes_index else [])
        return f"coil::{self.kind}_update<{self.ctype}>({', '.join(args)});"

    def update_counted(self, prefix: str, lane: str, value: str, count: str, weight: str) -> str:
        """A Welford update whose new count ``count`` and its reciprocal ``weight`` are the
        same for every lane (full chunks of the inner schedule), computed once per chunk: a
        division per element where each lane divided by its own count."""
        assert self.kind == "welford"
        return f"coil::welford_update_n<{self.ctype}>({', '.join(self.refs(prefix, lane))}, {value}, {count}, {weight});"

    def combine(self, prefix: str, lane: str, other_prefix: str, other_lane: str) -> str:
        args = self.refs(prefix, lane) + self.refs(other_prefix, other_lane)
        return f"coil::{self.kind}_combine<{self.ctype}>({', '.join(args)});"

    def result(self, prefix: str, lane: str, output: int) -> str:
        return f"{prefix}{self.name}{self.results[output]}{lane}"


#: Initial state of the single-field reductions, formatted with the accumulator type ``t``.
_SCALAR_INIT = {
    "sum": "{t}(0)", "prod": "{t}(1)", "any": "false", "all": "true",
    "max": "coil::lowest<{t}>()", "min": "coil::highest<{t}>()",
}


def accumulator(rtype: str, name: str, acc_t: str, val_t: str) -> Accumulator:
    """The state of a ``rtype`` reduction accumulating in ``acc_t`` over values of ``val_t``."""
    if rtype in _SCALAR_INIT:
        field = Field("", acc_t, _SCALAR_INIT[rtype].format(t=acc_t))
        return Accumulator(name, rtype, acc_t, (field,), False, ("",))
    if rtype in ("argmax", "argmin"):
        fields = (Field("_val", val_t, f"{val_t}(0)"), Field("_idx", "int64_t", "-1"))
        return Accumulator(name, rtype, val_t, fields, True, ("_idx",))
    if rtype == "welford":
        zero = f"{acc_t}(0)"
        fields = (Field("_mean", acc_t, zero), Field("_m2", acc_t, zero), Field("_n", acc_t, zero))
        return Accumulator(name, "welford", acc_t, fields, False, ("_mean", "_m2"))
    raise NotImplementedError(rtype)
