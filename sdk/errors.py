"""Coil's error hierarchy: every error a user can see carries fields and says what to do."""
from __future__ import annotations


class CoilError(Exception):
    """Base class of every error Coil raises on purpose."""


class ConfigError(CoilError):
    """An unknown or badly typed configuration key."""

    def __init__(self, key: str, known: list[str], reason: str = "unknown option") -> None:
        self.key = key
        self.known = known
        super().__init__(f"{reason}: {key!r}; known options: {', '.join(sorted(known))}")


class LoweringError(CoilError):
    """An ATen op that Coil cannot lower natively (caught by the graph lowering, which falls back)."""

    def __init__(self, op: str, reason: str) -> None:
        self.op = op
        self.reason = reason
        super().__init__(f"cannot lower {op}: {reason}")


class PluginError(CoilError):
    """A plugin failed to load or validate; it is skipped and reported by name."""

    def __init__(self, plugin: str, reason: str) -> None:
        self.plugin = plugin
        self.reason = reason
        super().__init__(f"plugin {plugin!r}: {reason}")


class NoBackendError(CoilError):
    """No plugin serves a device type."""

    def __init__(self, device_type: str, known: list[str]) -> None:
        self.device_type = device_type
        self.known = known
        super().__init__(
            f"no Coil backend serves device type {device_type!r}; known device types: "
            f"{', '.join(sorted(known)) or '(none)'}. Install a plugin for it or call "
            f"coil.register_backend_for_device({device_type!r}, backend)."
        )


class ToolchainError(CoilError):
    """A compiler or tool a backend needs is missing or failed."""

    def __init__(self, tool: str, message: str, hint: str = "") -> None:
        self.tool = tool
        self.message = message
        self.hint = hint
        super().__init__(f"{tool}: {message}" + (f"\n{hint}" if hint else ""))


class KernelCompileError(CoilError):
    """Generated kernel source failed to compile; carries the compiler output and source path."""

    def __init__(self, source_path: str, output: str) -> None:
        self.source_path = source_path
        self.output = output
        super().__init__(f"kernel compile failed for {source_path}:\n{output}")


class CheckError(CoilError):
    """Self-check mode (``COIL_CHECK=1``) found a compiled graph whose result differs from
    eager's on the same inputs: names the output, how far off it is, the kernel or ATen call
    that produced it, and a standalone repro script."""

    def __init__(self, graph: str, output: int, max_abs: float, max_rel: float, producer: str,
                 repro_path: str | None, what: str = "", detail: str = "") -> None:
        self.graph = graph
        self.output = output
        self.max_abs = max_abs
        self.max_rel = max_rel
        self.producer = producer
        self.repro_path = repro_path
        self.what = what or f"output {output}"
        self.detail = detail
        rerun = (f"Reproduce it with `coil repro {repro_path}` and attach that file (and the "
                 f".pt file next to it, if any) to a bug report. " if repro_path else "")
        super().__init__(
            f"coil self-check: {graph}'s {self.what} differs from eager "
            f"(max abs diff {max_abs:.3g}, max rel diff {max_rel:.3g}{', ' + detail if detail else ''}); "
            f"it was produced by {producer}. {rerun}"
            f"Until it is fixed, run this model without Coil (torch.compile(..., backend=\"eager\")).")


class OutputMismatchError(CoilError):
    """A compiled Dynamo graph's first call returned an output whose dtype, rank or static
    size is not the one Dynamo traced (:mod:`coil.output_check`): PyTorch's AOTAutograd
    returned the wrong tensor in its place. Every call of that graph raises it."""

    def __init__(self, output: int, got: str, traced: str) -> None:
        self.output = output
        self.got = got
        self.traced = traced
        super().__init__(
            f"coil: output {output} of a compiled graph is {got} where the graph traced {traced}: "
            "AOTAutograd returned a wrong tensor in its place (seen in PyTorch 2.11-2.13 with "
            "inaccurate input-mutation bookkeeping, e.g. a module that updates spectral_norm's "
            "buffers and calls nn.Embedding(max_norm=...) under grad; every AOTAutograd backend, "
            "inductor's too). This call's side effects (buffer updates) have happened. Run this "
            "module without torch.compile (torch.compiler.disable) or with backend=\"eager\".")


class DistributedCompileError(CoilError):
    """Under ``torch.distributed``, another rank failed to compile a graph this rank compiled
    too (:mod:`coil.compile_agreement`); this rank stops as well rather than wait for it in a
    collective. ``rank`` is the rank that failed, ``reason`` its error."""

    def __init__(self, rank: int, this_rank: int, what: str, reason: str) -> None:
        self.rank = rank
        self.this_rank = this_rank
        self.what = what
        self.reason = reason
        super().__init__(
            f"coil: rank {rank} failed to compile {what} that this rank ({this_rank}) compiled "
            f"too: {reason}. This rank stops rather than wait for rank {rank} in a collective; "
            f"rank {rank}'s own error has the details (COIL_COMPILE_AGREEMENT=0 lets each rank "
            f"fail on its own).")
