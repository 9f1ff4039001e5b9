"""The ``coil`` command. ``coil doctor`` (in :mod:`coil.doctor`) lists plugins, which plugin
serves each device, toolchain checks, settings, and every plugin that failed to load;
``coil conformance`` (in :mod:`coil.sdk.testing.scorecard`) and ``coil new-plugin`` (in
:mod:`coil.sdk.scaffold`) live next to what they drive and register themselves here through
``add_arguments``/``run``."""
from __future__ import annotations

import argparse
import sys

from .doctor import doctor_report


def _doctor(args: argparse.Namespace) -> int:
    text, ok = doctor_report()
    print(text)
    return 0 if ok else 1


#: Subcommands implemented elsewhere: name -> module with ``HELP``, ``add_arguments(parser)``
#: and ``run(args) -> int``.
_COMMAND_MODULES = {
    "conformance": "coil.sdk.testing.scorecard",
    "new-plugin": "coil.sdk.scaffold",
    "repro": "coil.repro",
    "cache": "coil.sdk.cache_command",
}


def main(argv: list[str] | None = None) -> int:
    import importlib

    parser = argparse.ArgumentParser(prog="coil", description="Coil, a pluggable-device compiler for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="list plugins, devices, toolchain checks and load errors")
    runners = {"doctor": _doctor}
    for name, module_name in _COMMAND_MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a command whose module is absent is simply not offered
            continue
        module.add_arguments(sub.add_parser(name, help=module.HELP))
        runners[name] = module.run
    args = parser.parse_args(argv)
    return runners[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
