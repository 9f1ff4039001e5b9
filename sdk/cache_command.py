"""``coil cache stats|clear|export FILE|import FILE``: what Coil's on-disk cache
(:mod:`coil.sdk.diskcache`) holds per namespace against its size cap, emptying it, and
moving it to another machine as a bundle of artifacts (:mod:`coil.cache`). Registered in
``coil.cli``."""
from __future__ import annotations

import argparse
import os
import sys

from .diskcache import clear, max_bytes, namespaces, stats, unmanaged

HELP = "show (stats), empty (clear), export or import Coil's on-disk cache"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cache_command", required=True)
    sub.add_parser("stats", help="entries and bytes per namespace, and the size cap")
    clear_parser = sub.add_parser("clear", help="delete the cached files")
    clear_parser.add_argument("namespaces", nargs="*",
                              help="only these namespaces (default: every managed one)")
    export_parser = sub.add_parser("export", help="write every cached entry to FILE (an artifact bundle)")
    export_parser.add_argument("file")
    import_parser = sub.add_parser("import", help="load an artifact bundle (coil cache export, "
                                                  "coil.cache.save_artifacts) into the cache")
    import_parser.add_argument("file")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def run(args: argparse.Namespace) -> int:
    from coil import config
    from coil.errors import ConfigError

    try:
        root, cap = config.current().cache_dir, max_bytes()
    except ConfigError as exc:
        print(f"coil cache: {exc}", file=sys.stderr)
        return 2
    if args.cache_command in ("export", "import"):
        return _transfer(args.cache_command, args.file, root)
    if args.cache_command == "clear":
        known = [ns.name for ns in namespaces(root)]
        unknown = [n for n in args.namespaces if n not in known]
        if unknown:
            print(f"coil cache clear: no namespace {', '.join(map(repr, unknown))} under {root}; "
                  f"managed namespaces: {', '.join(known) or '(none)'}", file=sys.stderr)
            return 2
        count, freed = clear(root, args.namespaces or None)
        print(f"removed {count} file(s), {_human(freed)}, from {root}")
        return 0
    env = os.environ.get("COIL_CACHE_MAX_BYTES")
    source = f"COIL_CACHE_MAX_BYTES={env}" if env else "the default; set COIL_CACHE_MAX_BYTES to change it"
    rows = stats(root)
    print(f"cache folder: {root}")
    print(f"size cap:     {_human(cap)} ({source})")
    print()
    print(f"{'namespace':<20} {'entries':>8} {'other':>6} {'size':>11} {'temporary':>10} {'quarantined':>12}")
    for r in rows:
        print(f"{r.name:<20} {r.entries:>8} {r.other_files:>6} {_human(r.bytes):>11} "
              f"{r.temporaries:>10} {r.quarantined:>12}")
    if not rows:
        print("(no cache yet)")
    print(f"{'total':<20} {sum(r.entries for r in rows):>8} {sum(r.other_files for r in rows):>6} "
          f"{_human(sum(r.bytes for r in rows)):>11}")
    others = unmanaged(root)
    if others:
        print()
        print("not managed here (no size cap; `coil cache clear` leaves them): "
              + ", ".join(f"{name} ({_human(size)})" for name, size in others))
    return 0


def _transfer(command: str, file: str, root: str) -> int:
    from coil import cache
    if command == "export":
        data = cache.export_cache()
        with open(file, "wb") as f:
            f.write(data)
        print(f"wrote {_human(len(data))} of cached entries from {root} to {file}")
        return 0
    try:
        with open(file, "rb") as f:
            summary = cache.load_artifacts(f.read())
    except (OSError, ValueError) as exc:
        print(f"coil cache import: {exc}", file=sys.stderr)
        return 2
    print(summary)
    return 0
