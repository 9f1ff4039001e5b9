"""Coil's side of :mod:`coil.sdk.host`: the operations the SDK's tools (the conformance kit,
``coil cache export|import``) call to drive the compiler. ``import coil`` registers
:class:`CoilHost`; each operation imports what it runs on first use, so that importing
``coil`` (and with it ``coil.sdk``) stays light: no torch (0.06 s against ~1.4 s for the
compiler's modules), no torch._dynamo (~2.4 s with :mod:`coil.backend`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Sequence

if TYPE_CHECKING:
    from .cache import LoadSummary
    from .report import ExplainReport


class CoilHost:
    """:class:`coil.sdk.host.Host`, implemented by Coil's compiler."""

    # every method imports what it runs when first called: see the module docstring

    def compile_fx(self, gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
        from .backend import compile_fx
        return compile_fx(gm, example_inputs, **kwargs)

    def recording(self) -> ContextManager[ExplainReport]:
        from .report import recording
        return recording()

    def export_cache(self) -> bytes:
        from .cache import export_cache
        return export_cache()

    def load_artifacts(self, data: bytes) -> LoadSummary:
        from .cache import load_artifacts
        return load_artifacts(data)
