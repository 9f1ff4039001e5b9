"""Hit and miss counts of Coil's caches, per layer (graph, kernel, autotune) and namespace,
for ``coil.explain`` (the counts of one compile and first call) and ``coil cache stats``
(every process's counts since the last ``coil cache clear``).

:class:`~coil.sdk.diskcache.DiskCache` counts its own lookups and writes, the remote cache's
answers included (:mod:`coil.sdk.remotecache`); a plugin whose cache is not a ``DiskCache``
(Triton's own binary cache) calls :func:`count`. One lookup counts once: a local ``hit``, a
``remote_hit`` (missing locally, fetched from Redis), or a ``miss`` (built), with
``remote_miss`` or ``remote_error`` beside a miss when a remote cache was asked.

Why this shape:

* Counting is a dictionary increment under a lock: nothing on the compile path waits for
  a file. The counts of a process reach the cache folder's ``cache-stats.json`` (next to the
  namespaces, not in one of them) at most every :data:`SAVE_INTERVAL_S` seconds and when the
  process exits, added under an exclusive ``flock`` so concurrent processes lose nothing,
  written to a temporary file and renamed (a reader sees the old or the new file).
* Saving never fails anything: an unwritable folder loses the counts, with a debug log.
* A process killed before it exits loses the counts of its last seconds; they are
  statistics, not accounting."""
from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal, Mapping

from . import knobs

log = logging.getLogger(__name__)

#: The layers ``coil.explain`` and ``coil cache stats`` show, in this order; a namespace
#: declared with another layer (or none) shows under ``other``.
LAYERS = ("graph", "kernel", "autotune", "other")
Layer = Literal["graph", "kernel", "autotune", "other"]
#: What is counted, and the column each becomes.
EVENTS = {"hit": "hits", "remote_hit": "remote hits", "miss": "misses", "remote_miss": "remote misses",
          "remote_error": "remote errors", "write": "writes", "remote_write": "remote writes"}
Event = Literal["hit", "remote_hit", "miss", "remote_miss", "remote_error", "write", "remote_write"]

FILE = "cache-stats.json"
#: A process adds its counts to the file at most this often (seconds), and when it exits.
SAVE_INTERVAL_S = 30.0

_Key = tuple[str, str, str]  # (layer, namespace, event)


@dataclass(frozen=True)
class Counts:
    """Counts by (layer, namespace, event). ``b - a`` is what happened between two
    :func:`snapshot` calls."""

    table: Mapping[_Key, int] = field(default_factory=dict)
    #: When the counting began (seconds since the epoch; 0 when unknown).
    since: float = 0.0

    def __sub__(self, other: Counts) -> Counts:
        diff = {k: v - other.table.get(k, 0) for k, v in self.table.items()}
        return Counts({k: v for k, v in diff.items() if v}, other.since or self.since)

    def get(self, layer: str, event: str, namespace: str | None = None) -> int:
        """The count of ``event`` in ``layer`` (in one namespace, or all of them)."""
        return sum(v for (lay, ns, ev), v in self.table.items()
                   if lay == layer and ev == event and namespace in (None, ns))

    def rows(self) -> list[tuple[str, str, dict[str, int]]]:
        """(layer, namespace, event -> count) per namespace with any count, layers in order."""
        by_ns: dict[tuple[str, str], dict[str, int]] = {}
        for (layer, ns, event), v in self.table.items():
            by_ns.setdefault((layer, ns), {})[event] = v
        order = {name: i for i, name in enumerate(LAYERS)}
        return [(layer, ns, events) for (layer, ns), events in
                sorted(by_ns.items(), key=lambda item: (order.get(item[0][0], len(LAYERS)), item[0][1]))]

    def __bool__(self) -> bool:
        return any(self.table.values())

    def summary(self) -> str:
        """One line per layer: ``graph 2 hits, 1 miss; ...`` (lookups only)."""
        parts = []
        for layer in LAYERS:
            hits, remote, misses = (self.get(layer, e) for e in ("hit", "remote_hit", "miss"))
            if hits or remote or misses:
                text = f"{layer} {hits} hit(s), {misses} miss(es)"
                if remote:
                    text += f", {remote} from the remote cache"
                parts.append(text)
        remote_errors = sum(self.get(layer, "remote_error") for layer in LAYERS)
        if remote_errors:
            parts.append(f"remote cache unavailable {remote_errors} time(s)")
        return "; ".join(parts) or "no cache lookups"

    def table_text(self) -> str:
        """A table: one row per namespace; its hits (local, remote), misses, hit rate, and
        the rest of :data:`EVENTS`."""
        columns = ["hits", "remote hits", "misses", "hit rate", "remote misses", "remote errors",
                   "writes", "remote writes"]
        lines = [f"{'layer':<9} {'namespace':<18}" + "".join(f" {c:>{max(len(c), 6)}}" for c in columns)]
        for layer, ns, events in self.rows():
            found = events.get("hit", 0) + events.get("remote_hit", 0)
            asked = found + events.get("miss", 0)
            cells = {name: str(events.get(event, 0)) for event, name in EVENTS.items()}
            cells["hit rate"] = f"{100 * found / asked:.0f}%" if asked else "-"
            lines.append(f"{layer:<9} {ns:<18}" + "".join(f" {cells[c]:>{max(len(c), 6)}}" for c in columns))
        if len(lines) == 1:
            lines.append("(nothing counted yet)")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- counting

_lock = threading.Lock()
_total: Counter[_Key] = Counter()  # this process, since it started
_unsaved: dict[str, Counter[_Key]] = {}  # cache root -> counts not yet in its file
_last_save = time.monotonic()
_started = time.time()
_registered = False


def count(layer: str, namespace: str, event: Event, n: int = 1, *, root: str | os.PathLike[str] | None = None) -> None:
    """Count ``n`` of ``event`` for ``namespace`` in ``layer`` (``root``: the cache folder
    the counts are saved under, by default the configured ``COIL_CACHE_DIR``)."""
    global _registered
    layer = layer if layer in LAYERS else "other"
    key = (layer, namespace, event)
    folder = _norm(root if root is not None else _default_root())
    with _lock:
        _total[key] += n
        _unsaved.setdefault(folder, Counter())[key] += n
        if not _registered:
            _registered = True
            atexit.register(save)
        due = time.monotonic() - _last_save >= SAVE_INTERVAL_S
    if due:
        save()


def _default_root() -> str:
    return knobs.current().cache_dir


def _norm(root: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(root))


def snapshot() -> Counts:
    """This process's counts so far."""
    with _lock:
        return Counts(dict(_total), _started)


# ----------------------------------------------------------------------------- the file


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    try:
        import fcntl  # POSIX only
    except ImportError:  # no flock here: the rename still keeps the file whole
        yield
        return
    with open(root / f"{FILE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> tuple[Counter[_Key], float]:
    try:
        data = json.loads(path.read_text())
        return Counter({tuple(k.split("\t")): int(v) for k, v in data["counts"].items()}), float(data["since"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Counter(), 0.0


def _write(path: Path, counts: Mapping[_Key, int], since: float) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"since": since, "counts": {"\t".join(k): v for k, v in sorted(counts.items()) if v}},
                              indent=1))
    os.replace(tmp, path)


def save() -> None:
    """Add this process's unsaved counts to each cache folder's file (called by itself)."""
    global _last_save
    with _lock:
        pending = {root: counts for root, counts in _unsaved.items() if counts}
        _unsaved.clear()
        _last_save = time.monotonic()
    for root, counts in pending.items():
        folder = Path(root)
        try:
            if not folder.is_dir():
                continue  # the cache folder is gone (a test's temporary one)
            with _locked(folder):
                saved, since = _read(folder / FILE)
                saved.update(counts)
                _write(folder / FILE, saved, since or time.time())
        except OSError as exc:
            log.debug("coil: cache counts not saved under %s: %s", root, exc)


def saved(root: str | os.PathLike[str]) -> Counts:
    """The counts saved under ``root`` (every process's, since the last :func:`reset`),
    with this process's unsaved ones added."""
    counts, since = _read(Path(root) / FILE)
    with _lock:
        counts.update(_unsaved.get(_norm(root), Counter()))
    return Counts(dict(counts), since)


def reset(root: str | os.PathLike[str], namespaces: list[str] | None = None) -> None:
    """Forget the saved counts under ``root`` (of ``namespaces`` only, when given)."""
    folder = Path(root)
    with _lock:
        pending = _unsaved.get(_norm(root))
        if pending is not None:
            for key in [k for k in pending if namespaces is None or k[1] in namespaces]:
                del pending[key]
    if not folder.is_dir():
        return
    try:
        with _locked(folder):
            counts, since = _read(folder / FILE)
            if namespaces is None:
                counts, since = Counter(), time.time()
            else:
                counts = Counter({k: v for k, v in counts.items() if k[1] not in namespaces})
            _write(folder / FILE, counts, since or time.time())
    except OSError as exc:
        log.debug("coil: cache counts under %s not reset: %s", root, exc)


__all__ = ["Counts", "count", "snapshot", "save", "saved", "reset", "LAYERS", "EVENTS"]
