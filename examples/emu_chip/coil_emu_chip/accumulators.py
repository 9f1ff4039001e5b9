"""How each reduction type accumulates in the emu chip's serial loops, one table entry per
type: the fields of its state (C type and initial value), the C statement that folds in one
value, and the field each output of the node reads. max/min/argmax/argmin let the first NaN
win, and argmax/argmin keep the first index of a tie, as ATen does.

Templates use ``$acc``/``$val`` (accumulator and value C types), ``$s`` (the value type's
helper suffix), ``$a`` (the state's name), ``$v`` (the value) and ``$i`` (the flat reduction
index)."""
from __future__ import annotations

from dataclasses import dataclass
from string import Template

import torch

from coil.sdk import ReductionNode

from .optable import SUFFIX, VALUE_TYPES

_ARG = ("if (${a}_idx < 0 || $v CMP ${a}_val || (emu_isnan_$s($v) && !emu_isnan_$s(${a}_val))) "
        "{ ${a}_val = $v; ${a}_idx = $i; }")
_TABLE: dict[str, tuple[tuple[tuple[str, str, str], ...], str, tuple[str, ...]]] = {
    "sum": ((("", "$acc", "0"),), "$a += $v;", ("",)),
    "prod": ((("", "$acc", "1"),), "$a *= $v;", ("",)),
    "any": ((("", "$acc", "0"),), "$a = $a || $v;", ("",)),
    "all": ((("", "$acc", "1"),), "$a = $a && $v;", ("",)),
    "max": ((("", "$acc", "emu_lowest_$s"),), "if ($v > $a || emu_isnan_$s($v)) $a = $v;", ("",)),
    "min": ((("", "$acc", "emu_highest_$s"),), "if ($v < $a || emu_isnan_$s($v)) $a = $v;", ("",)),
    "argmax": ((("_val", "$val", "0"), ("_idx", "int64_t", "-1")), _ARG.replace("CMP", ">"), ("_idx",)),
    "argmin": ((("_val", "$val", "0"), ("_idx", "int64_t", "-1")), _ARG.replace("CMP", "<"), ("_idx",)),
    "welford": ((("_mean", "$acc", "0"), ("_m2", "$acc", "0"), ("_n", "$acc", "0")),
                "${a}_n += 1; { $acc delta = $v - ${a}_mean; ${a}_mean += delta / ${a}_n; "
                "${a}_m2 += delta * ($v - ${a}_mean); }", ("_mean", "_m2")),
}


@dataclass(frozen=True)
class Accumulator:
    """The state of one reduction: C locals ``<prefix><field suffix>``."""

    fields: tuple[tuple[str, str, str], ...]  # (suffix, C type, initial value)
    update: Template
    results: tuple[str, ...]  # the field each output reads

    def declare(self, prefix: str) -> list[str]:
        return [f"{t} {prefix}{suffix} = {init};" for suffix, t, init in self.fields]

    def fold(self, prefix: str, value: str, index: str) -> str:
        return self.update.substitute(a=prefix, v=value, i=index)


def accumulator(node: ReductionNode, value_dtype: torch.dtype) -> Accumulator:
    types = {"acc": VALUE_TYPES[node.acc_dtype], "val": VALUE_TYPES[value_dtype],
             "s": SUFFIX[VALUE_TYPES[value_dtype]]}
    fields, update, results = _TABLE[node.reduction_type]
    typed = tuple((suffix, Template(t).substitute(types), Template(init).substitute(types))
                  for suffix, t, init in fields)
    return Accumulator(typed, Template(Template(update).safe_substitute(types)), results)
