"""One compiled-versus-eager comparison of the OpInfo runner: a :class:`Case` (the function
to compile, its call arguments, the context around both runs, the tolerance, Dynamo settings,
the graph breaks the mode causes on purpose), the :data:`CaseFactory` that builds one, and
:class:`SkipSample` for a sample with nothing to compare. Its own module so that the modes
(:mod:`.opinfo_modes`) and the gradient program (:mod:`.opinfo_grad`), which the modes build
on, both import it at the top without importing each other."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ContextManager

import torch

from .compare import DEFAULT_TOLERANCE, Tolerance

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import SampleInput


@dataclasses.dataclass
class Case:
    """One compiled-versus-eager comparison: ``fn(sample.input, *sample.args,
    **sample.kwargs)`` run eagerly (twice) and compiled, each inside ``context(device)``
    (``device`` is ``None`` for the eager runs on the CPU)."""

    fn: Callable[..., Any]
    sample: SampleInput
    context: Callable[[torch.device | None], ContextManager[Any]] = lambda device: contextlib.nullcontext()
    tolerance: Tolerance = DEFAULT_TOLERANCE
    #: Dynamo settings for the compiled run (``torch._dynamo.config.patch``).
    dynamo_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Substrings of graph-break messages the mode causes on purpose; not counted.
    expected_breaks: tuple[str, ...] = ()
    #: When values differ beyond ``tolerance``: build the float64 reference run (eager,
    #: float64 copies of the inputs, no autocast). The compiled result then passes if it is
    #: no further from it than :data:`FP64_MULTIPLIER` times eager's own distance.
    fp64_reference: Callable[[], Any] | None = None


#: How much further than eager a compiled low-precision result may be from float64 truth.
FP64_MULTIPLIER = 3.0

#: Builds a :class:`Case`; called inside the runner's guarded region, so an exception there
#: (the grad mode runs eager to size its projection) marks the sample ``eager-error``.
CaseFactory = Callable[[], Case]


class SkipSample(Exception):
    """Raised by a :data:`CaseFactory` when a sample has nothing to compare in this mode
    (the runner records it as ``eager-error`` with the message)."""


__all__ = ["Case", "CaseFactory", "FP64_MULTIPLIER", "SkipSample"]
