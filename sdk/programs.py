"""Host programs (SDK 1.12.0): a run of a graph's kernel launches that a backend compiles into
one host function of its module, so the wrapper crosses from Python into the module once for
the whole run instead of once per kernel, and the run's short-lived intermediate buffers are
memory the host function takes for the call (``scratch``) instead of tensors the wrapper
allocates and frees one by one.

The core proposes programs to backends that declare ``Capabilities.host_programs``: maximal
runs of at least two consecutive launches on the backend with no ATen call between them,
every size static. It passes them to ``DeviceBackend.compile(kernels, graph_name,
programs=...)`` and later asks ``DeviceBackend.host_call_line(module_var, compiled,
program)`` for the wrapper's line; a backend that did not build a program answers None
there, and the core writes the program's launches one by one as usual."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kernel import Kernel


@dataclass(frozen=True)
class ProgramOperand:
    """Where one buffer argument of a launch lives: the program's parameter ``index``
    (``scratch`` False: a tensor the wrapper passes in, by its address) or the start of its
    scratch region ``index`` (``scratch`` True)."""

    index: int
    scratch: bool = False


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a program: ``operands`` holds where each buffer argument of
    ``kernel`` lives, in ``Kernel.args`` order (inputs, then outputs). Kernels in programs
    take no size arguments (every size is static)."""

    kernel: Kernel
    operands: tuple[ProgramOperand, ...]


@dataclass(frozen=True)
class HostProgram:
    """A run of launches compiled into one host function.

    ``name``: the program's name, unique in its graph (the wrapper calls it from the module as
    an attribute, like a kernel); ``launches``: in order; ``params``: the wrapper's names of
    the tensors the program takes, by address, in parameter order (graph inputs, buffers
    allocated outside the program or outliving it); ``scratch``: the bytes of each scratch
    region. A region holds buffers that live and die inside the program (a later one may
    take over an earlier one's memory, as the memory plan says); the host function provides
    the memory for the call, aligned to at least 64 bytes, and never hands it out beyond the
    call. The launches run in order on the calling thread, as the wrapper would have run
    them."""

    name: str
    launches: tuple[Launch, ...]
    params: tuple[str, ...]
    scratch: tuple[int, ...]

    @property
    def kernels(self) -> list[Kernel]:
        return [launch.kernel for launch in self.launches]
