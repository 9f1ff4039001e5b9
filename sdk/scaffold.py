"""``coil new-plugin NAME --device DEV [--output DIR]``: writes a pip-installable plugin package.

The package holds a ``pyproject.toml`` with the ``coil.plugins`` entry point, the plugin module
(its hooks), a backend skeleton that works as generated (it runs kernels with the reference
executor, :mod:`coil.sdk.reference`, and marks with ``VENDOR`` what real codegen replaces),
and tests: the plugin loads, compiles like eager, and passes the conformance kit's first tiers
(``pytest --pyargs coil.sdk.testing --coil-device=DEV --coil-tiers=runtime,pointwise``).
The files come from the templates in ``scaffold_templates/`` (``${slot}`` placeholders).

A device type torch does not know (``--device npu`` with no ``torch_npu``) needs PrivateUse1
registration before any tensor exists on it: the command says so, the generated README gains
a section on how, and the generated tests that need the device skip with that reason."""
from __future__ import annotations

import argparse
import re
import string
import sys
import textwrap
from pathlib import Path

from .versions import API_VERSION

HELP = "write a new plugin package (pyproject, backend skeleton, conformance tests)"

TEMPLATES = Path(__file__).with_name("scaffold_templates")

#: Generated file (a ``string.Template`` of the slots) -> its template.
FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "README.md": "README.md.tmpl",
    "${package}/__init__.py": "__init__.py.tmpl",
    "${package}/backend.py": "backend.py.tmpl",
    "tests/test_${name}.py": "test_plugin.py.tmpl",
}

#: The README section added when torch does not know the device type (the ``device_note`` slot).
UNKNOWN_DEVICE_NOTE = "README_unknown_device.md.tmpl"

#: Conformance tiers the generated tests run.
TIERS = "runtime,pointwise"

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class ScaffoldError(ValueError):
    """A name, device or output folder ``coil new-plugin`` cannot use; says what to do."""


def slots(name: str, device: str) -> dict[str, str]:
    """Template slots for plugin ``name`` serving ``device``; ScaffoldError if unusable."""
    name = name.replace("-", "_")
    if not _NAME.match(name):
        raise ScaffoldError(f"plugin name {name!r}: use lower-case letters, digits and '_', "
                            f"starting with a letter (e.g. 'mychip')")
    if not _NAME.match(device):
        raise ScaffoldError(f"device {device!r}: give a torch device type such as 'cpu', "
                            f"'cuda' or your PrivateUse1 name (no index)")
    camel = "".join(part.capitalize() for part in name.split("_") if part)
    values = {"name": name, "device": device, "package": f"coil_{name}",
              "dist": f"coil-{name.replace('_', '-')}", "cls": f"{camel}Backend",
              "env_name": name.upper(), "api_version": API_VERSION, "tiers": TIERS}
    values["device_note"] = "" if torch_knows(device) else _render(UNKNOWN_DEVICE_NOTE, values)
    return values


def torch_knows(device: str) -> bool:
    """Whether this torch knows device type ``device`` (built in, or registered as PrivateUse1
    by an extension already imported)."""
    import torch  # the `coil` command imports this module for its arguments: torch on use
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        return False
    return True


def _render(template: str, values: dict[str, str]) -> str:
    return string.Template((TEMPLATES / template).read_text()).substitute(values)


def generate(name: str, device: str, output: str | Path | None = None) -> list[Path]:
    """Write the package for plugin ``name`` serving ``device`` into ``output`` (default
    ``./coil-NAME``), which must not exist or be empty. Returns the files written."""
    values = slots(name, device)
    root = Path(output if output is not None else values["dist"])
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ScaffoldError(f"{root} exists and is not an empty folder; choose another "
                            f"--output or remove it")
    written = []
    for target, template in FILES.items():
        path = root / string.Template(target).substitute(values)
        text = _render(template, values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="plugin name, e.g. mychip (package coil_mychip)")
    parser.add_argument("--device", required=True,
                        help="torch device type the plugin serves (cpu, cuda, your PrivateUse1 name)")
    parser.add_argument("--output", metavar="DIR",
                        help="folder to create (default ./coil-NAME); must not exist or be empty")


def run(args: argparse.Namespace) -> int:
    try:
        files = generate(args.name, args.device, args.output)
    except ScaffoldError as exc:
        print(f"coil new-plugin: {exc}", file=sys.stderr)
        return 2
    root = files[0].parent
    values = slots(args.name, args.device)
    print(f"wrote plugin {values['name']!r} for device {args.device!r} in {root}:")
    for f in files:
        print(f"  {f.relative_to(root)}")
    print(f"\nnext:\n  pip install -e {root}\n  coil doctor\n  pytest {root / 'tests'}\n"
          f"then replace the VENDOR parts of {values['package']}/backend.py with real codegen.")
    if values["device_note"]:
        print("\n" + textwrap.fill(
              f"note: torch does not know device type {args.device!r}. It needs PrivateUse1 "
              f"registration (a PyTorch extension with an allocator, "
              f"torch.utils.rename_privateuse1_backend({args.device!r}), a device module) "
              f"imported before use; until then the generated tests that need {args.device!r} "
              f"tensors skip and `coil doctor` shows the device check as skipped. How: "
              f"{root / 'README.md'}, section 'A device torch does not know'; a working "
              f"example: Coil's examples/emu_chip.", width=92, subsequent_indent="  "))
    return 0


__all__ = ["HELP", "add_arguments", "run", "generate", "slots", "torch_knows", "ScaffoldError", "FILES",
           "TIERS", "UNKNOWN_DEVICE_NOTE"]
