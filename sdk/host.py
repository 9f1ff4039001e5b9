"""The compiler, as the SDK's own tools see it.

The SDK is the layer beneath Coil's compiler and imports none of it. Two of its tools are
the compiler's clients all the same: the conformance kit (:mod:`coil.sdk.testing`) compiles
functions on the device under test and reads what was generated, and ``coil cache
export|import`` (:mod:`coil.sdk.cache_command`) moves the compiler's caches between machines.
They call the compiler through :class:`Host`, the few operations they need, which the
compiler registers (:func:`register`) when it is imported: ``import coil`` does, and as
``coil.sdk`` is a subpackage of ``coil``, importing the SDK imports the compiler's package
first. The reports are described by what the kit reads of them (:class:`CompileReport`).
Plugins never need this module."""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol, Sequence

from .errors import CoilError


class KernelInfo(Protocol):
    """One generated kernel: its name and the device type it runs on."""

    name: str
    device: str


class FallbackInfo(Protocol):
    """An ATen op left to ATen (``kind`` ``"fallback"``, ``"library"``, ``"template"`` or
    ``"collective"``), and why."""

    op: str
    reason: str
    kind: str


class GraphInfo(Protocol):
    """One compiled graph (``kind``: ``"forward"``, ``"backward"`` or ``"inference"``)."""

    name: str
    kind: str
    symbolic: bool
    #: The host programs the graph's wrapper calls (SDK 1.13.0), each "<name>: <kernel>,
    #: <kernel>...": runs of launches a backend with ``Capabilities.host_programs`` compiled
    #: into one host function.
    programs: Sequence[str]

    @property
    def kernels(self) -> Sequence[KernelInfo]: ...

    @property
    def fallbacks(self) -> Sequence[FallbackInfo]: ...


class CompileReport(Protocol):
    """What the compiler reports of the graphs it compiled inside :meth:`Host.recording`
    (``coil.explain``'s report); its text lists every graph, kernel and fallback."""

    #: The caller's to set (the kit keeps the compiled function's result here).
    result: Any

    @property
    def graphs(self) -> Sequence[GraphInfo]: ...

    @property
    def kernels(self) -> Sequence[KernelInfo]: ...

    @property
    def library_calls(self) -> list[str]: ...

    @property
    def peak_bytes(self) -> int: ...


class Host(Protocol):
    """The compiler's side of the SDK's tools."""

    def compile_fx(self, gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
        """The Dynamo backend, as ``torch.compile(..., backend="coil")`` calls it (for
        wrappers that count what reaches it)."""
        ...

    def recording(self) -> ContextManager[CompileReport]:
        """A block whose compiled graphs (forward and backward alike) are reported."""
        ...

    def export_cache(self) -> bytes:
        """The whole local cache as an artifact bundle (``coil cache export``)."""
        ...

    def load_artifacts(self, data: bytes) -> object:
        """Write an artifact bundle into the local cache; the result's text says what was
        loaded and what was refused, and why (``coil cache import``)."""
        ...


class NoHostError(CoilError):
    """An SDK tool that drives the compiler ran where no compiler registered itself."""

    def __init__(self) -> None:
        super().__init__("no compiler is registered with coil.sdk.host: the conformance kit and "
                         "`coil cache export|import` drive Coil's compiler, which registers itself "
                         "when the `coil` package is imported; import coil first")


_host: Host | None = None


def register(host: Host) -> None:
    """Make ``host`` the compiler the SDK's tools call (the compiler does, when imported)."""
    global _host
    _host = host


def current() -> Host:
    """The registered compiler; :class:`NoHostError` when none is."""
    if _host is None:
        raise NoHostError()
    return _host


__all__ = ["Host", "CompileReport", "GraphInfo", "KernelInfo", "FallbackInfo", "NoHostError",
           "register", "current"]
