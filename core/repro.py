"""Repro scripts: ``coil repro FILE``, which re-runs one of the scripts self-check mode
(:mod:`coil.selfcheck`) leaves behind when a compiled graph disagrees with eager, and the
public face of writing them (:mod:`coil.repro_writer`, whose names this module re-exports,
describes what a script holds and where it goes).

Running it re-creates the graph by tracing that module (tensor constants become ``get_attr``
nodes again, so nothing is folded), propagates fake tensors through it (symbolic sizes
re-created with the same symbols, hinted by the failing call's values), makes the inputs (the
saved ones, or, with ``--random`` or when none were saved, random ones from the seed with the
recorded strides), compiles the graph with ``coil.compile.compile_graph`` in self-check mode,
calls it once, and prints the first mismatch (producer included) or "no mismatch"."""
from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.fx

from . import config
from .errors import CheckError
# the writing side, re-exported: coil.repro is the public face of repro scripts
from .repro_writer import FORMAT, SAVE_INPUTS_LIMIT, replaying, replaying_script, repro_dir, write

HELP = "re-run a self-check repro script (written by COIL_CHECK=1) and print the first mismatch"


def load(path: str | Path) -> types.ModuleType:
    """Import a repro script as a module (its ``__main__`` block does not run)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"coil_repro_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if getattr(module, "FORMAT", None) != FORMAT:
        raise ValueError(f"{path} is not a Coil repro script of format {FORMAT} "
                         f"(it says {getattr(module, 'FORMAT', None)!r}); re-create it with this Coil")
    module.__file__ = str(path)
    return module


class _Tracer(torch.fx.Tracer):
    """Records tensor constants (registered as buffers) as ``get_attr`` nodes, as the graph had
    them, instead of computing with them."""

    proxy_buffer_attributes = True


def _set_constant(root: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    *path, leaf = target.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, torch.nn.Module())
        module = getattr(module, part)
    module.register_buffer(leaf, value)


def _random_input(spec: dict[str, Any], gen: torch.Generator) -> torch.Tensor:
    shape, stride, offset, dtype = spec["shape"], spec["stride"], spec["offset"], spec["dtype"]
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    n = offset + span
    if dtype == torch.bool:
        flat = torch.randint(0, 2, (n,), generator=gen).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        flat = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    else:
        low, high = spec.get("low"), spec.get("high")
        low = 0 if low is None else low
        high = low + 16 if high is None else high
        flat = torch.randint(low, high + 1, (n,), generator=gen, dtype=torch.int64).to(dtype)
    return flat.to(spec["device"]).as_strided(shape, stride, offset)


def _inputs(module: types.ModuleType, data: dict[str, Any], use_saved: bool, seed: int) -> list[Any]:
    saved = data.get("inputs") if use_saved else None
    if saved is not None:
        return [v.to(spec["device"]) if isinstance(v, torch.Tensor) else v
                for v, spec in zip(saved, module.INPUTS)]
    gen = torch.Generator().manual_seed(seed)
    return [_random_input(spec, gen) if "shape" in spec else spec["value"] for spec in module.INPUTS]


def _fake_inputs(specs: list[dict[str, Any]], inputs: list[Any]) -> tuple[Any, list[Any]]:
    """A fake mode and fake versions of ``inputs``; symbolic where the graph saw symbols."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    if not any(spec.get("symbolic") for spec in specs):
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        return mode, [mode.from_tensor(v, static_shapes=True) if isinstance(v, torch.Tensor) else v
                      for v in inputs]
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    shape_env = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    symbols = _SymbolTable(shape_env)
    fakes = []
    for spec, value in zip(specs, inputs):
        sym = spec.get("symbolic")
        if not isinstance(value, torch.Tensor):
            fakes.append(symbols.symint(sym, value) if sym else value)
        elif not sym:
            fakes.append(mode.from_tensor(value, static_shapes=True))
        else:
            size = [symbols.symint(t, n) for t, n in zip(sym["size"], value.shape)]
            stride = [symbols.symint(t, s) for t, s in zip(sym["stride"], value.stride())]
            offset = symbols.symint(sym["offset"], value.storage_offset())
            with mode:
                if value.storage_offset() == 0:
                    fake = torch.empty_strided(size, stride, dtype=value.dtype, device=value.device)
                else:
                    span = 1 + sum((n - 1) * s for n, s in zip(size, stride))
                    base = torch.empty(offset + span, dtype=value.dtype, device=value.device)
                    fake = base.as_strided(size, stride, offset)
            fakes.append(fake)
    return mode, fakes


class _SymbolTable:
    """The graph's size symbols re-created in a fresh shape environment, hinted by the values
    of the failing call; expressions over them become SymInts."""

    def __init__(self, shape_env: Any) -> None:
        self.shape_env = shape_env
        self.symbols: dict[str, Any] = {}

    def symint(self, text: str, value: int) -> Any:
        import sympy
        from torch._dynamo.source import ConstantSource
        from torch.fx.experimental.symbolic_shapes import DimDynamic
        expr = sympy.sympify(text)
        if expr.is_number:
            return int(expr)
        if isinstance(expr, sympy.Symbol) and text not in self.symbols:
            self.symbols[text] = self.shape_env.create_symbol(
                value, ConstantSource(f"repro_{text}"), dynamic_dim=DimDynamic.DYNAMIC)
        expr = expr.xreplace({s: self.symbols[s.name] for s in expr.free_symbols if s.name in self.symbols})
        return self.shape_env.create_symintnode(expr, hint=value)


def build(module: types.ModuleType, *, use_saved: bool = True,
          seed: int | None = None) -> tuple[torch.fx.GraphModule, list[Any], list[Any]]:
    """The repro's graph (with fake-tensor metadata, as Coil receives graphs), its example
    inputs, and the real inputs to call it with."""
    data: dict[str, Any] = {}
    if module.DATA:
        data = torch.load(Path(module.__file__).parent / module.DATA, weights_only=True)
    root = module.Repro()
    for target, value in data.get("constants", {}).items():
        _set_constant(root, target, value)
    inputs = _inputs(module, data, use_saved, module.SEED if seed is None else seed)
    gm = torch.fx.GraphModule(root, _Tracer().trace(root), class_name="Repro")
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode, fakes = _fake_inputs(module.INPUTS, inputs)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    return gm, fakes, inputs


def replay(path: str | Path, *, use_saved: bool = True, seed: int | None = None) -> CheckError | None:
    """Run a repro script's graph through Coil and eagerly; the mismatch, or None."""
    # local: `coil` builds every subcommand's parser by importing its module (`coil doctor`
    # too), and the compiler costs ~0.4 s to import; only a replay needs it
    from .compile import compile_graph
    module = load(path)
    gm, example_inputs, inputs = build(module, use_saved=use_saved, seed=seed)
    cfg = config.with_options(config.get(), {"check": True})
    with replaying_script(str(path)):
        fn = compile_graph(gm, example_inputs, cfg, module.KIND)
        try:
            fn(list(inputs))
        except CheckError as exc:
            return exc
    return None


def _describe(exc: CheckError) -> str:
    detail = f", {exc.detail}" if exc.detail else ""
    return (f"mismatch: {exc.what} differs from eager (max abs diff {exc.max_abs:.3g}, max rel diff "
            f"{exc.max_rel:.3g}{detail}); produced by {exc.producer}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a coil_repro_*.py script")
    parser.add_argument("--random", action="store_true",
                        help="draw random inputs from the seed even when the failing ones were saved")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for random inputs (default: the script's)")


def run(args: argparse.Namespace) -> int:
    """``coil repro FILE``: 1 when the mismatch reproduces, 0 when it does not (2: no such
    script)."""
    if not Path(args.file).is_file():
        print(f"coil repro: no file {args.file}; self-check mode (COIL_CHECK=1) names the script "
              f"it writes in the error it raises", file=sys.stderr)
        return 2
    exc = replay(args.file, use_saved=not args.random, seed=args.seed)
    print(_describe(exc) if exc is not None else "no mismatch")
    return 1 if exc is not None else 0


def main(path: str, argv: Sequence[str] = ()) -> int:
    """``python FILE`` of a repro script."""
    parser = argparse.ArgumentParser(prog=Path(path).name, description=HELP)
    add_arguments(parser)
    return run(parser.parse_args([path, *argv]))


__all__ = ["FORMAT", "SAVE_INPUTS_LIMIT", "build", "load", "main", "replay", "replaying", "repro_dir",
           "write"]
