"""``coil cache stats|clear|export FILE|import FILE``: what Coil's on-disk cache
(:mod:`coil.sdk.diskcache`) holds per namespace against its size cap, its hits and misses
per layer (:mod:`coil.sdk.cachestats`) and, with a remote cache configured, what Redis holds
under Coil's prefix; emptying both; and moving the local cache to another machine as a
bundle of artifacts (the compiler's ``coil.cache``, reached through :mod:`coil.sdk.host`).
Registered in ``coil.cli``."""
from __future__ import annotations

import argparse
import datetime
import os
import sys

from . import cachestats, host, knobs, remotecache
from .diskcache import clear, max_bytes, namespaces, stats, unmanaged
from .errors import ConfigError

HELP = "show (stats), empty (clear), export or import Coil's on-disk cache"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cache_command", required=True)
    sub.add_parser("stats", help="entries and bytes per namespace against the size cap, hits and misses "
                                 "per layer, and the remote cache's entries")
    clear_parser = sub.add_parser("clear", help="delete the cached files, and Coil's entries on the remote "
                                                "cache when one is configured (COIL_REMOTE_CACHE)")
    clear_parser.add_argument("namespaces", nargs="*",
                              help="only these namespaces (default: every managed one)")
    clear_parser.add_argument("--local-only", action="store_true",
                              help="leave the remote cache alone")
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
    try:
        root, cap = knobs.current().cache_dir, max_bytes()
    except ConfigError as exc:
        print(f"coil cache: {exc}", file=sys.stderr)
        return 2
    if args.cache_command in ("export", "import"):
        return _transfer(args.cache_command, args.file, root)
    if args.cache_command == "clear":
        return _clear(root, args.namespaces, args.local_only)
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
    counts = cachestats.saved(root)
    since = (f"since {datetime.datetime.fromtimestamp(counts.since).isoformat(' ', 'seconds')}"
             if counts.since else "so far")
    print()
    print(f"lookups and writes {since}, all processes (`coil cache clear` resets them):")
    print(counts.table_text())
    _remote_stats()
    return 0


def _remote_stats() -> None:
    remote = remotecache.current()
    if remote is None:
        return
    print()
    try:
        entries, size = remote.count()
    except Exception as exc:  # noqa: BLE001 - any client or server failure: say so, go on
        print(f"remote cache {remote.url} (prefix {remote.prefix!r}): unreachable ({type(exc).__name__}: {exc})")
        return
    print(f"remote cache {remote.url} (prefix {remote.prefix!r}): {entries} entr(y/ies), {_human(size)}")


def _clear(root: str, only: list[str], local_only: bool) -> int:
    known = [ns.name for ns in namespaces(root)]
    unknown = [n for n in only if n not in known]
    remote = None if local_only else remotecache.current()
    if unknown and remote is None:
        print(f"coil cache clear: no namespace {', '.join(map(repr, unknown))} under {root}; "
              f"managed namespaces: {', '.join(known) or '(none)'}", file=sys.stderr)
        return 2
    count, freed = clear(root, only or None)
    cachestats.reset(root, only or None)
    print(f"removed {count} file(s), {_human(freed)}, from {root}")
    if remote is None:
        return 0
    try:
        deleted = remote.clear(only or None)
    except Exception as exc:  # noqa: BLE001 - the local cache is cleared; say what was not
        print(f"coil cache clear: remote cache {remote.url} not cleared: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1
    print(f"removed {deleted} entr(y/ies) under prefix {remote.prefix!r} from the remote cache {remote.url}")
    return 0


def _transfer(command: str, file: str, root: str) -> int:
    compiler = host.current()
    if command == "export":
        data = compiler.export_cache()
        with open(file, "wb") as f:
            f.write(data)
        print(f"wrote {_human(len(data))} of cached entries from {root} to {file}")
        return 0
    try:
        with open(file, "rb") as f:
            summary = compiler.load_artifacts(f.read())
    except (OSError, ValueError) as exc:
        print(f"coil cache import: {exc}", file=sys.stderr)
        return 2
    print(summary)
    return 0
