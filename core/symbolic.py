"""Index expressions (floor division, modulo, loop variables, printers) live in the SDK,
:mod:`coil.sdk.symbolic`; the core's modules import them from here."""
from typing import Any

import sympy
import torch

from .sdk.symbolic import *  # noqa: F401,F403


def defined_symbol(meta: Any) -> str | None:
    """The unbacked symbol a call's scalar result defines (``u0`` of ``x.item()`` with
    ``capture_scalar_outputs``), or None."""
    if not isinstance(meta, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return None
    expr = meta.node.expr
    return expr.name if isinstance(expr, sympy.Symbol) else None
