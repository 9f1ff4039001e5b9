"""Writing repro scripts: what self-check mode (:mod:`coil.selfcheck`) leaves behind when a
compiled graph disagrees with eager. :mod:`coil.repro` reads and re-runs them (``coil repro
FILE``); this side needs nothing of the compiler, so self-check imports it without importing
the compiler back.

A repro is one Python file (plus a ``.pt`` file next to it when there is data to keep) in
``<COIL_DEBUG_DIR>/repro/``, or ``./coil-repro/`` in the working directory when no debug
directory is set (beside the user's code, like a crash dump, and never evicted with the cache).
It holds the ATen graph as it reached Coil (a ``torch.nn.Module`` whose ``forward`` is the FX
graph's code, so it can be edited to shrink it), one spec per input (sizes, strides, storage
offset, dtype, device; the range of integer tensors, so indices stay valid; symbolic sizes as
the graph saw them), a seed, and the graph kind. The ``.pt`` file holds the graph's tensor
constants and, when their storages total at most :data:`SAVE_INPUTS_LIMIT` bytes, the failing
call's inputs themselves."""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import re
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
import torch.fx

from .version import __version__

if TYPE_CHECKING:
    from .selfcheck import CheckedGraph

log = logging.getLogger(__name__)

#: Version of the script format this module writes and :mod:`coil.repro` reads.
FORMAT = 1
#: The failing call's inputs are saved next to the script when their storages hold at most
#: this many bytes; larger inputs are re-created at random from the seed.
SAVE_INPUTS_LIMIT = 64 * 2**20

_replaying: contextvars.ContextVar[str | None] = contextvars.ContextVar("coil_replaying", default=None)


def replaying() -> str | None:
    """The repro script being re-run, if any: a mismatch found then is reported against it
    rather than written out again."""
    return _replaying.get()


@contextlib.contextmanager
def replaying_script(path: str) -> Iterator[None]:
    """While a repro script at ``path`` is re-run (:func:`replaying` names it)."""
    token = _replaying.set(path)
    try:
        yield
    finally:
        _replaying.reset(token)


def repro_dir(debug_dir: str) -> Path:
    """Where repro scripts go: ``<debug_dir>/repro``, else ``./coil-repro``."""
    return Path(debug_dir).expanduser() / "repro" if debug_dir else Path.cwd() / "coil-repro"


def write(graph: "CheckedGraph", inputs: Sequence[Any], message: str, seed: int = 0) -> Path:
    """Write the repro of ``graph`` called on ``inputs`` (their values before the call)."""
    code = graph.reference.graph.python_code(root_module="self")
    digest = hashlib.sha256(code.src.encode()).hexdigest()[:8]
    folder = repro_dir(graph.debug_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"coil_repro_{graph.name}_{graph.kind}_{digest}"
    data: dict[str, Any] = {"constants": _constants(graph.reference)}
    tensors = [v for v in inputs if isinstance(v, torch.Tensor)]
    if sum(t.untyped_storage().nbytes() for t in tensors) <= SAVE_INPUTS_LIMIT:
        data["inputs"] = [v.detach() if isinstance(v, torch.Tensor) else v for v in inputs]
    data_name = f"{stem}.pt" if data["constants"] or "inputs" in data else None
    if data_name:
        torch.save(data, folder / data_name)
    specs = [_input_spec(v, sym) for v, sym in zip(inputs, graph.symbolic)]
    script = _render(graph, code, specs, data_name, message, seed)
    path = folder / f"{stem}.py"
    path.write_text(script)
    log.warning("coil self-check: wrote repro %s", path)
    return path


def _constants(gm: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    out = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = gm
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if isinstance(value, torch.Tensor):
                out[str(node.target)] = value.detach()
    return out


def _input_spec(value: Any, symbolic: Any) -> dict[str, Any]:
    if not isinstance(value, torch.Tensor):
        return {"value": value, "symbolic": symbolic}
    spec: dict[str, Any] = {"shape": tuple(value.shape), "stride": tuple(value.stride()),
                            "offset": value.storage_offset(), "dtype": value.dtype,
                            "device": str(value.device), "low": None, "high": None}
    exact = not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    if exact and value.numel():
        spec["low"], spec["high"] = int(value.min().item()), int(value.max().item())
    spec["symbolic"] = symbolic
    return spec


def _imports(code: Any) -> list[str]:
    """Import lines for the globals the graph's code uses."""
    from torch.fx.graph import _custom_builtins
    lines = ["import torch"]
    for name, value in code.globals.items():
        if not re.search(rf"\b{re.escape(name)}\b", code.src):
            continue
        if name in _custom_builtins:
            line = _custom_builtins[name].import_str
        elif isinstance(value, types.ModuleType):
            line = f"import {value.__name__} as {name}"
        elif getattr(value, "__module__", None) and getattr(value, "__qualname__", None):
            line = f"from {value.__module__} import {value.__qualname__} as {name}"
        else:
            line = f"# {name}: {value!r} (could not write an import for it)"
        if line not in lines:
            lines.append(line)
    return lines


def _render(graph: "CheckedGraph", code: Any, specs: list[dict[str, Any]], data_name: str | None,
            message: str, seed: int) -> str:
    message = message.replace("\\", "\\\\").replace('"""', "'''")
    body = "\n".join(("    " + line) if line.strip() else "" for line in code.src.strip("\n").splitlines())
    inputs = "\n".join(f"    {spec!r}," for spec in specs)
    return f'''"""Coil self-check repro: {graph.name} ({graph.kind}), by coil {__version__}, torch {torch.__version__}.

Coil's result differed from eager: {message}.

Run it with `coil repro THIS_FILE` (or `python THIS_FILE`): it re-creates the inputs, compiles
the graph below with Coil and runs it eagerly, and prints the first mismatch or "no mismatch".
`--random` ignores saved inputs and draws random ones from SEED. Edit `forward` to shrink it."""
{chr(10).join(_imports(code))}

FORMAT = {FORMAT}
KIND = {graph.kind!r}
SEED = {seed}
#: One entry per graph input: a tensor to create (sizes, strides and storage offset kept;
#: integer tensors drawn from [low, high]) or a plain value; "symbolic" is what the graph saw.
INPUTS = [
{inputs}
]
#: Saved next to this file: the graph's tensor constants, and the failing call's inputs when
#: they were small enough (None: neither).
DATA = {data_name!r}


class Repro(torch.nn.Module):
{body}


if __name__ == "__main__":
    import sys
    from coil.repro import main
    sys.exit(main(__file__, sys.argv[1:]))
'''


__all__ = ["FORMAT", "SAVE_INPUTS_LIMIT", "replaying", "replaying_script", "repro_dir", "write"]
