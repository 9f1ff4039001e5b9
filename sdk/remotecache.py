"""A shared cache on Redis behind the local disk cache (:mod:`coil.sdk.diskcache`): the knob
``remote_cache`` (``COIL_REMOTE_CACHE=redis://host:port/db``) names the server, and every
namespace (graphs, kernel libraries, autotune results) reads from it on a local miss and
writes to it what it stores locally.

Why this shape:

* It never fails a compile. A server that is down, slow (1 s timeouts) or full answers "miss"
  and "not stored": one warning per process, then the local cache alone until
  :data:`RETRY_S` seconds have passed, when the next use tries again.
* Entries are checked: a value is ``MAGIC``, the sha256 of the payload, then the payload. A
  value that fails the check is deleted with a warning and counts as a miss (whoever
  compiles next writes it again).
* First writer wins: ``SET NX``, so concurrent writers of one key leave exactly one whole
  value, and entries (keyed by content digests) are never overwritten.
* Size-capped: payloads over :data:`MAX_ENTRY_BYTES` are not sent; the server's own
  ``maxmemory`` policy bounds the total.
* Namespaced: keys are ``<prefix>:<namespace>:<key><suffix>``, the prefix ``coil`` unless
  the URL says ``?prefix=NAME``, so one Redis serves several projects. ``coil cache clear``
  (:meth:`RemoteCache.clear`) deletes only names of that shape under the prefix whose values
  start with :data:`MAGIC`: another project's keys survive it, even under a prefix that
  begins like this one.

The client is Coil's own (:mod:`coil.sdk.redisclient`: the few commands used here, standard
library only), not the ``redis`` package, whose import alone took 0.2 s of a first call on
the development machine."""
from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from typing import Iterator, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from . import knobs
from .redisclient import Client

log = logging.getLogger(__name__)

MAGIC = b"coil-remote-1\n"
#: Payloads larger than this (bytes) stay local.
MAX_ENTRY_BYTES = 64 * 2**20
#: After a failure, the remote cache is left alone this long (seconds).
RETRY_S = 30.0
#: Seconds to connect and to wait for an answer.
TIMEOUT_S = 1.0

Answer = Literal["hit", "miss", "error"]
Sent = Literal["stored", "kept", "error"]


class RemoteCache:
    """One Redis server, used by every :class:`~coil.sdk.diskcache.DiskCache` of the process."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        self.prefix = query.pop("prefix", "coil")
        self.url = urlunsplit(parts._replace(query=urlencode(query)))
        self._client: Client | None = None
        self._down_until = 0.0
        self._warned = False
        self._lock = threading.Lock()

    def _redis(self) -> Client:
        if self._client is None:
            self._client = Client(self.url, TIMEOUT_S)
        return self._client

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self._down_until = time.monotonic() + RETRY_S
            if not self._warned:
                self._warned = True
                log.warning("coil: remote cache %s failed (%s: %s); using the local cache only, "
                            "retrying every %.0f s", self.url, type(exc).__name__, exc, RETRY_S)

    def _usable(self) -> bool:
        return time.monotonic() >= self._down_until

    def name(self, namespace: str, key: str, suffix: str) -> str:
        return f"{self.prefix}:{namespace}:{key}{suffix}"

    def get(self, namespace: str, key: str, suffix: str) -> bytes | None:
        """The payload stored under the entry's name, checked; None when absent, damaged
        (then deleted) or the server is unavailable."""
        return self.fetch(namespace, key, suffix)[0]

    def fetch(self, namespace: str, key: str, suffix: str) -> tuple[bytes | None, Answer]:
        """As :meth:`get`, with how it went: ``"hit"``, ``"miss"`` (absent, or damaged and
        deleted) or ``"error"`` (the server is unavailable, or paused after a failure)."""
        if not self._usable():
            return None, "error"
        name = self.name(namespace, key, suffix)
        try:
            value = self._redis().get(name)
        except Exception as exc:  # noqa: BLE001 - a bad URL, or any client/server failure
            self._failed("get", exc)
            return None, "error"
        if value is None:
            return None, "miss"
        payload = _unpack(value)
        if payload is None:
            log.warning("coil: remote cache entry %s is damaged (bad checksum); deleting it and "
                        "rebuilding", name)
            try:
                self._redis().delete(name)
            except Exception as exc:  # noqa: BLE001
                self._failed("delete", exc)
            return None, "miss"
        return payload, "hit"

    def put(self, namespace: str, key: str, suffix: str, payload: bytes) -> bool:
        """Store ``payload`` unless the name exists (first writer wins) or it is too large;
        whether this call stored it."""
        return self.send(namespace, key, suffix, payload) == "stored"

    def send(self, namespace: str, key: str, suffix: str, payload: bytes) -> Sent:
        """As :meth:`put`, with how it went: ``"stored"``, ``"kept"`` (the name exists, or
        the payload is over :data:`MAX_ENTRY_BYTES`) or ``"error"``."""
        if len(payload) > MAX_ENTRY_BYTES:
            return "kept"
        if not self._usable():
            return "error"
        try:
            stored = self._redis().set_nx(self.name(namespace, key, suffix), _pack(payload))
        except Exception as exc:  # noqa: BLE001
            self._failed("put", exc)
            return "error"
        return "stored" if stored else "kept"

    # -- management (``coil cache stats|clear``)

    def _ours(self, namespaces: list[str] | None) -> Iterator[list[bytes]]:
        """Batches of the names this prefix holds (of ``namespaces`` only, when given) whose
        values are Coil's (start with :data:`MAGIC`): another project's keys, even under a
        prefix that starts like this one, never match."""
        client = self._redis()
        patterns = [f"{_glob_escape(self.prefix)}:{_glob_escape(ns)}:*" for ns in namespaces] \
            if namespaces is not None else [f"{_glob_escape(self.prefix)}:*"]
        shape = re.compile(re.escape(self.prefix).encode() + rb":[^:]+:[A-Za-z0-9_-]+[^:]*")
        for pattern in patterns:
            batch: list[bytes] = []
            for name in client.scan_iter(match=pattern, count=1000):
                if shape.fullmatch(name):
                    batch.append(name)
                if len(batch) >= 500:
                    yield self._coil_values(batch)
                    batch = []
            if batch:
                yield self._coil_values(batch)

    def _coil_values(self, names: list[bytes]) -> list[bytes]:
        heads = self._redis().pipeline([("GETRANGE", name, 0, len(MAGIC) - 1) for name in names])
        return [name for name, head in zip(names, heads) if head == MAGIC]

    def count(self, namespaces: list[str] | None = None) -> tuple[int, int]:
        """(entries, bytes) Coil holds on the server under this prefix."""
        entries = size = 0
        for batch in self._ours(namespaces):
            entries += len(batch)
            size += sum(self._redis().pipeline([("STRLEN", name) for name in batch]))
        return entries, size

    def clear(self, namespaces: list[str] | None = None) -> int:
        """Delete Coil's entries under this prefix (of ``namespaces`` only, when given); how
        many. Other keys on the server are left alone. Raises the client's errors (a command
        the user ran should say that the server is unreachable)."""
        deleted = 0
        for batch in self._ours(namespaces):
            deleted += self._redis().unlink(*batch)
        return deleted


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis ``MATCH`` pattern."""
    return re.sub(r"([*?\[\]\\^])", r"\\\1", text)


def _pack(payload: bytes) -> bytes:
    return MAGIC + hashlib.sha256(payload).digest() + payload


def _unpack(value: bytes) -> bytes | None:
    head = len(MAGIC) + 32
    if len(value) < head or not value.startswith(MAGIC):
        return None
    payload = value[head:]
    return payload if hashlib.sha256(payload).digest() == value[len(MAGIC):head] else None


_remotes: dict[str, RemoteCache] = {}


def current() -> RemoteCache | None:
    """The remote cache the configuration in force names (one per URL and process)."""
    url = knobs.current().remote_cache
    if not url:
        return None
    remote = _remotes.get(url)
    if remote is None:
        remote = _remotes[url] = RemoteCache(url)
    return remote


__all__ = ["RemoteCache", "current", "MAX_ENTRY_BYTES", "RETRY_S"]
