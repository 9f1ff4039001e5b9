"""Coil's on-disk cache: entries checked before use, written atomically, swept of debris and
capped in size. Plugins keep compiled libraries and tuning results here; ``coil cache
stats|clear`` (:mod:`coil.sdk.cache_command`) shows and empties it. Each lookup is counted
as a hit, a remote hit or a miss in its namespace's layer (:mod:`coil.sdk.cachestats`).

Layout: ``<COIL_CACHE_DIR>/<namespace>/``, marked as managed by a ``.coil-diskcache`` file
(eviction and ``coil cache`` touch nothing else), one file per entry,
``[<key[:2]>/]<key><suffix>``. An entry is its payload followed by a one-line trailer,
``\\n#coil-diskcache-v1 <payload size, 16 hex digits> <sha256 of the payload>\\n``.

Why this shape:

* One rename commits payload and checksum together: the writer fills a temporary file in
  the entry's folder, appends the trailer last and renames the file over the entry. A
  reader finds no entry or a whole one, never one writer's payload beside another's
  sidecar. ELF loaders map only what the program headers name, so ``dlopen`` loads a
  library entry as it is, trailer included.
* Nothing is written in place, so a library that a process has mapped is never truncated
  under it (that would be a SIGBUS). A file damaged anyway (a full disk, a crash before the
  data reached the disk -- there is no fsync: the check catches it --, a stray edit) fails
  the check before anyone loads it; it is moved to ``quarantine/`` with one warning and the
  caller builds it again.
* The check is one sha256 pass (SHA-NI on current x86): measured on the 2-core development
  machine, about 1 ms for a 1 MB library and 8-11 ms for 5 MB (blake2b: 2-3x slower there).
  A typical kernel library is 15-30 KB: 0.03 ms.
* A temporary file is named after its writer (pid and host); the sweep removes it when
  that writer is dead, or when it is older than :data:`STALE_TEMP_S`. A sweep runs at a
  process's first use of a cache root and after a write, at most every
  :data:`SWEEP_INTERVAL_S` seconds (a sweep stats every file: 0.1-0.2 s for 5,000 files on
  the development machine, too much after each of a model's autotuning results).
* The total size of the managed namespaces is capped (:func:`max_bytes`: the knob
  ``cache_max_bytes``, ``COIL_CACHE_MAX_BYTES``, default 2 GiB). Least recently used entries go first (a hit
  touches the entry's mtime), but an entry used in the last :data:`RECENT_S` seconds stays,
  so no process loses a library between checking it and loading it: the cap is soft by
  what the last minute used."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Literal

from . import cachestats, knobs, remotecache

log = logging.getLogger(__name__)

#: A temporary file older than this (seconds) is debris even if its writer looks alive.
STALE_TEMP_S = 3600.0
#: An entry used this recently (seconds) is never evicted.
RECENT_S = 60.0
#: Quarantined files are kept this long (seconds) for a post-mortem, then removed.
QUARANTINE_KEEP_S = 86400.0
#: Writes sweep at most this often (seconds) per process and cache root.
SWEEP_INTERVAL_S = 30.0
MARKER = ".coil-diskcache"
QUARANTINE = "quarantine"

_TRAILER = re.compile(rb"\n#coil-diskcache-v1 ([0-9a-f]{16}) ([0-9a-f]{64})\n")
TRAILER_LEN = len(b"\n#coil-diskcache-v1  \n") + 16 + 64
_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TEMP = re.compile(r"\.(\d+)@([0-9a-f]{8})\.[0-9a-f]+\.tmp$")
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_CHUNK = 1 << 20
_last_sweep: dict[Path, float] = {}  # cache root -> time.monotonic() of this process's last sweep
#: Entries this process read or wrote: (namespace folder, key, suffix) -> fanout, in order
#: (``coil.cache.save_artifacts`` bundles them).
used: dict[tuple[str, str, str], bool] = {}


def cache_dir(subdir: str) -> str:
    """A folder under ``COIL_CACHE_DIR`` (created) where a plugin keeps its on-disk cache."""
    path = os.path.join(knobs.current().cache_dir, subdir)
    os.makedirs(path, exist_ok=True)
    return path


def max_bytes() -> int:
    """The cap on the total size of the managed namespaces: the ``cache_max_bytes`` knob of
    the configuration in force (``COIL_CACHE_MAX_BYTES``, default 2 GiB; checked there)."""
    return knobs.current().cache_max_bytes


# ----------------------------------------------------------------------------- entries


class _Damaged(Exception):
    """A cache file that fails its check; the argument says how."""


def _trailer(size: int, digest: str) -> bytes:
    return f"\n#coil-diskcache-v1 {size:016x} {digest}\n".encode()


def _check(f: BinaryIO) -> int:
    """The payload size of the open entry ``f``, or :class:`_Damaged`."""
    on_disk = os.fstat(f.fileno()).st_size
    if on_disk == 0:
        raise _Damaged("the file is empty")
    if on_disk < TRAILER_LEN:
        raise _Damaged(f"{on_disk} bytes, too short to hold its checksum")
    f.seek(on_disk - TRAILER_LEN)
    match = _TRAILER.fullmatch(f.read(TRAILER_LEN))
    if match is None:
        raise _Damaged("no checksum at its end (cut short, overwritten, or not written by Coil)")
    size = int(match[1], 16)
    if size != on_disk - TRAILER_LEN:
        raise _Damaged(f"its checksum covers {size} bytes but it holds {on_disk - TRAILER_LEN}")
    f.seek(0)
    digest = hashlib.sha256()
    left = size
    while left:
        chunk = f.read(min(_CHUNK, left))
        if not chunk:
            raise _Damaged("it shrank while being checked")
        digest.update(chunk)
        left -= len(chunk)
    if digest.hexdigest() != match[2].decode():
        raise _Damaged("its contents do not match their checksum")
    return size


def _seal(path: Path) -> None:
    """Append the trailer to the finished temporary file ``path``."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    with open(path, "ab") as f:
        f.write(_trailer(size, digest.hexdigest()))


def _temp_for(final: Path) -> Path:
    return final.with_name(f"{final.name}.{os.getpid()}@{_HOST}.{secrets.token_hex(4)}.tmp")


class DiskCache:
    """One namespace of the cache: a folder of checked entries. ``fanout`` spreads entries
    over 256 subfolders (``key[:2]``) for namespaces that grow large; ``max_bytes`` overrides
    :func:`max_bytes` (tests use a tiny one); ``layer`` (``"graph"``, ``"kernel"``,
    ``"autotune"``) is where its hits and misses are counted (:mod:`coil.sdk.cachestats`;
    ``"other"`` by default)."""

    def __init__(self, folder: str | os.PathLike[str], *, fanout: bool = False,
                 max_bytes: int | None = None, layer: str = "other") -> None:
        self.folder = Path(folder)
        self.root = self.folder.parent
        self.fanout = fanout
        self.layer = layer
        self._max_bytes = max_bytes
        self.folder.mkdir(parents=True, exist_ok=True)
        marker = self.folder / MARKER
        if not marker.exists():
            marker.touch()
        if self.root not in _last_sweep:
            self.sweep()

    @classmethod
    def in_namespace(cls, namespace: str, *, fanout: bool = False, max_bytes: int | None = None,
                     layer: str = "other") -> DiskCache:
        """The namespace ``namespace`` under the configured ``COIL_CACHE_DIR``."""
        return cls(cache_dir(namespace), fanout=fanout, max_bytes=max_bytes, layer=layer)

    @property
    def max_bytes(self) -> int:
        return max_bytes() if self._max_bytes is None else self._max_bytes

    def path(self, key: str, suffix: str = "") -> Path:
        """Where the entry ``key`` lives (whether or not it exists)."""
        if not _KEY.fullmatch(key):
            raise ValueError(f"cache key {key!r}: use letters, digits, '-' and '_' (a hex digest)")
        return (self.folder / key[:2] if self.fanout else self.folder) / f"{key}{suffix}"

    def lookup(self, key: str, suffix: str = "", *, remote: bool = True, count: bool = True) -> Path | None:
        """The path of the entry, checked and touched; ``None`` when it is missing or was
        damaged (then quarantined, with a warning). On a local miss the remote cache is
        asked unless ``remote`` is False. The lookup is counted (a hit, a remote hit or a
        miss) unless ``count`` is False: a caller looking at an entry it already counted."""
        path = self.path(key, suffix)
        try:
            with open(path, "rb") as f:
                try:
                    _check(f)
                except _Damaged as exc:
                    self._quarantine(path, f, str(exc))
                    return path if self._from_remote(key, suffix, remote, count) is not None else None
        except FileNotFoundError:
            return path if self._from_remote(key, suffix, remote, count) is not None else None
        self._hit(path, key, suffix, count)
        return path

    def read(self, key: str, suffix: str = "", *, remote: bool = True, count: bool = True) -> bytes | None:
        """The payload of the entry, checked; ``None`` (and ``remote``, ``count``) as for
        :meth:`lookup`."""
        path = self.path(key, suffix)
        try:
            with open(path, "rb") as f:
                try:
                    size = _check(f)
                except _Damaged as exc:
                    self._quarantine(path, f, str(exc))
                    return self._from_remote(key, suffix, remote, count)
                f.seek(0)
                data = f.read(size)
        except FileNotFoundError:
            return self._from_remote(key, suffix, remote, count)
        self._hit(path, key, suffix, count)
        return data

    def write(self, key: str, suffix: str, data: bytes, *, remote: bool = True) -> Path:
        """Store ``data`` as the entry ``key`` (atomically; the last writer wins), and send
        it to the remote cache unless ``remote`` is False."""
        with self.producing(key, suffix, remote=remote) as tmp:
            tmp.write_bytes(data)
        return self.path(key, suffix)

    def _count(self, event: cachestats.Event) -> None:
        cachestats.count(self.layer, self.folder.name, event, root=self.root)

    def _hit(self, path: Path, key: str, suffix: str, count: bool) -> None:
        _touch(path)
        used[(str(self.folder), key, suffix)] = self.fanout
        if count:
            self._count("hit")

    def _from_remote(self, key: str, suffix: str, ask: bool = True, count: bool = True) -> bytes | None:
        """On a local miss: the entry from the remote cache (``remote_cache`` knob), stored
        locally too; None without one, when it lacks the entry or ``ask`` is False."""
        remote = remotecache.current() if ask else None
        data, answer = remote.fetch(self.folder.name, key, suffix) if remote is not None else (None, None)
        if data is not None:
            with self.producing(key, suffix, remote=False) as tmp:
                tmp.write_bytes(data)
            used[(str(self.folder), key, suffix)] = self.fanout
        if count:
            self._count("remote_hit" if data is not None else "miss")
            if answer in ("miss", "error"):
                self._count("remote_miss" if answer == "miss" else "remote_error")
        return data

    def _to_remote(self, key: str, suffix: str, path: Path) -> None:
        remote = remotecache.current()
        if remote is None:
            return
        size = path.stat().st_size - TRAILER_LEN
        if 0 <= size <= remotecache.MAX_ENTRY_BYTES:
            with open(path, "rb") as f:
                sent = remote.send(self.folder.name, key, suffix, f.read(size))
            if sent != "kept":
                self._count("remote_write" if sent == "stored" else "remote_error")

    @contextlib.contextmanager
    def producing(self, key: str, suffix: str = "", *, remote: bool = True) -> Iterator[Path]:
        """A temporary path for a tool to write the entry to (a compiler's ``-o``). When the
        block ends normally the file gets its checksum and becomes the entry (sent to the
        remote cache too, unless ``remote`` is False); when it raises, the file is removed.
        The path is not created: the tool creates it."""
        final = self.path(key, suffix)
        final.parent.mkdir(exist_ok=True)
        tmp = _temp_for(final)
        try:
            yield tmp
            _seal(tmp)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        used[(str(self.folder), key, suffix)] = self.fanout
        self._count("write")
        if remote:
            self._to_remote(key, suffix, final)
        if time.monotonic() - _last_sweep.get(self.root, 0.0) >= SWEEP_INTERVAL_S:
            self.sweep()

    def write_plain(self, key: str, suffix: str, text: str) -> Path:
        """A companion file with no checksum (a library's source, for error messages and
        debugging): written atomically, counted and evicted like an entry, never checked."""
        final = self.path(key, suffix)
        final.parent.mkdir(exist_ok=True)
        tmp = _temp_for(final)
        try:
            tmp.write_text(text)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return final

    def sweep(self) -> None:
        """Remove stale temporaries and old quarantine, then evict down to the cap."""
        _last_sweep[self.root] = time.monotonic()
        sweep(self.root, self.max_bytes)

    def _quarantine(self, path: Path, f: BinaryIO, reason: str) -> None:
        seen = os.fstat(f.fileno())
        try:
            now = os.stat(path)
            if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
                return  # a writer replaced it meanwhile; the caller rebuilds, harmlessly
            dest = self.folder / QUARANTINE / f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
            dest.parent.mkdir(exist_ok=True)
            os.replace(path, dest)
        except FileNotFoundError:
            return  # another process moved it first, and warned
        except OSError as exc:
            log.warning("coil: cache file %s is damaged (%s) and could not be moved aside (%s); "
                        "rebuilding it. Delete it, or run `coil cache clear`.", path, reason, exc)
            return
        log.warning("coil: cache file %s was damaged (%s); moved it to %s and rebuilding it",
                    path, reason, dest)


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # a read-only cache still serves hits
        os.utime(path)


# ----------------------------------------------------------------------------- sweeping

Kind = Literal["entry", "temp", "quarantine"]


@dataclass(frozen=True)
class _File:
    path: Path
    namespace: str
    kind: Kind
    size: int
    mtime: float


def namespaces(root: str | os.PathLike[str]) -> list[Path]:
    """The managed namespace folders under ``root``."""
    try:
        return sorted(p for p in Path(root).iterdir() if (p / MARKER).is_file())
    except FileNotFoundError:
        return []


def _files(root: str | os.PathLike[str], only: list[str] | None = None) -> list[_File]:
    out = []
    for ns in namespaces(root):
        if only is not None and ns.name not in only:
            continue
        for folder, _, names in os.walk(ns):
            in_quarantine = Path(folder).name == QUARANTINE
            for name in names:
                if name == MARKER and folder == str(ns):
                    continue
                path = Path(folder, name)
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                kind: Kind = "quarantine" if in_quarantine else "temp" if name.endswith(".tmp") else "entry"
                out.append(_File(path, ns.name, kind, st.st_size, st.st_mtime))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True


def _stale(f: _File, now: float) -> bool:
    match = _TEMP.search(f.path.name)
    if match and match[2] == _HOST and not _alive(int(match[1])):
        return True
    return now - f.mtime > STALE_TEMP_S


def _remove(files: list[_File]) -> int:
    """Bytes freed by deleting ``files`` (ones already gone count nothing)."""
    freed = 0
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            f.path.unlink()
            freed += f.size
    return freed


def sweep(root: str | os.PathLike[str], cap: int, now: float | None = None) -> None:
    """Remove stale temporaries and quarantine older than :data:`QUARANTINE_KEEP_S` in every
    managed namespace under ``root``, then evict (quarantine first, then least recently used
    entries, never one used in the last :data:`RECENT_S` seconds) until the total is at most
    ``cap`` bytes."""
    now = time.time() if now is None else now
    files = _files(root)
    stale = [f for f in files if f.kind == "temp" and _stale(f, now)]
    expired = [f for f in files if f.kind == "quarantine" and now - f.mtime > QUARANTINE_KEEP_S]
    if stale:
        _remove(stale)
        log.info("coil: removed %d temporary cache file(s) left by interrupted writers", len(stale))
    _remove(expired)
    gone = {f.path for f in stale + expired}
    files = [f for f in files if f.path not in gone]
    total = sum(f.size for f in files)
    if total <= cap:
        return
    victims = sorted((f for f in files if f.kind == "quarantine"), key=lambda f: f.mtime)
    victims += sorted((f for f in files if f.kind == "entry" and now - f.mtime > RECENT_S),
                      key=lambda f: f.mtime)
    chosen = []
    for f in victims:
        if total <= cap:
            break
        chosen.append(f)
        total -= f.size
    freed = _remove(chosen)
    log.info("coil: cache over its %d-byte cap (COIL_CACHE_MAX_BYTES): evicted %d file(s), %d bytes",
             cap, len(chosen), freed)


# ----------------------------------------------------------------------------- stats and clear


@dataclass(frozen=True)
class NamespaceStats:
    """One line of ``coil cache stats``."""

    name: str
    entries: int
    other_files: int
    bytes: int
    temporaries: int
    quarantined: int


def _is_entry(path: Path, size: int) -> bool:
    """Whether ``path`` ends with a trailer (the checksum itself is not verified)."""
    if size < TRAILER_LEN:
        return False
    try:
        with open(path, "rb") as f:
            f.seek(size - TRAILER_LEN)
            return _TRAILER.fullmatch(f.read(TRAILER_LEN)) is not None
    except OSError:
        return False


def stats(root: str | os.PathLike[str]) -> list[NamespaceStats]:
    """Per managed namespace under ``root``: entries, other files, bytes, temporaries,
    quarantined files."""
    files = _files(root)
    out = []
    for ns in namespaces(root):
        mine = [f for f in files if f.namespace == ns.name]
        entries = sum(1 for f in mine if f.kind == "entry" and _is_entry(f.path, f.size))
        out.append(NamespaceStats(
            ns.name, entries, sum(1 for f in mine if f.kind == "entry") - entries,
            sum(f.size for f in mine), sum(1 for f in mine if f.kind == "temp"),
            sum(1 for f in mine if f.kind == "quarantine")))
    return out


@dataclass(frozen=True)
class EntryRef:
    """Where one entry lives: its namespace, key, suffix and whether the namespace fans out."""

    namespace: str
    key: str
    suffix: str
    fanout: bool
    path: Path


def entries(root: str | os.PathLike[str]) -> list[EntryRef]:
    """Every entry (a file with a trailer; companions, temporaries and quarantine left out)
    of the managed namespaces under ``root``."""
    out = []
    for f in _files(root):
        if f.kind != "entry" or not _is_entry(f.path, f.size):
            continue
        key = _KEY.match(f.path.name)
        if key is None:
            continue
        fanout = f.path.parent.name != f.namespace
        out.append(EntryRef(f.namespace, key[0], f.path.name[key.end():], fanout, f.path))
    return out


def unmanaged(root: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """Folders under ``root`` that this module does not manage, with their sizes in bytes."""
    managed = set(namespaces(root))
    out = []
    try:
        folders = sorted(p for p in Path(root).iterdir() if p.is_dir() and p not in managed)
    except FileNotFoundError:
        return []
    for folder in folders:
        size = 0
        for sub, _, names in os.walk(folder):
            for name in names:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(sub, name)).st_size
        out.append((folder.name, size))
    return out


def clear(root: str | os.PathLike[str], only: list[str] | None = None) -> tuple[int, int]:
    """Delete every entry, companion and quarantined file of the managed namespaces under
    ``root`` (or of those named in ``only``), and temporaries whose writer is gone; a live
    writer's temporary stays so its compile still succeeds. Returns (files, bytes) removed."""
    now = time.time()
    files = [f for f in _files(root, only) if f.kind != "temp" or _stale(f, now)]
    return len(files), _remove(files)
