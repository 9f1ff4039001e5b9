"""The lowering registry: ATen overload -> function that builds IR. Entries are keyed by
overload and, optionally, by device type; a device-specific entry beats the generic one."""
from __future__ import annotations

from typing import Any, Callable

import torch

LoweringFn = Callable[..., Any]


class LoweringRegistry:
    """Maps ATen overloads to lowering functions, with per-device overrides."""

    def __init__(self) -> None:
        self._rules: dict[tuple[Any, str | None], LoweringFn] = {}

    def register(self, op: Any, fn: LoweringFn, device_type: str | None = None) -> None:
        for overload in _overloads(op):
            self._rules[(overload, device_type)] = fn

    def lookup(self, op: Any, device_type: str | None) -> LoweringFn | None:
        if device_type is not None:
            fn = self._rules.get((op, device_type))
            if fn is not None:
                return fn
        return self._rules.get((op, None))

    def ops(self) -> set[Any]:
        return {op for op, _ in self._rules}

    def copy(self) -> "LoweringRegistry":
        new = LoweringRegistry()
        new._rules = dict(self._rules)
        return new


def _overloads(op: Any) -> list[Any]:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


#: The generic lowerings, filled by the lowering modules at import.
GENERIC = LoweringRegistry()


def lowering(*ops: Any) -> Callable[[LoweringFn], LoweringFn]:
    """Decorator: register a generic lowering for ``ops`` (overloads or packets)."""

    def wrap(fn: LoweringFn) -> LoweringFn:
        for op in ops:
            GENERIC.register(op, fn)
        return fn

    return wrap
