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
  the URL says ``?prefix=NAME``, so one Redis serves several projects.

The client is the ``redis`` package (``pip install "coil[remote]"``); without it the knob
logs one warning and the local cache works alone."""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

log = logging.getLogger(__name__)

MAGIC = b"coil-remote-1\n"
#: Payloads larger than this (bytes) stay local.
MAX_ENTRY_BYTES = 64 * 2**20
#: After a failure, the remote cache is left alone this long (seconds).
RETRY_S = 30.0
#: Seconds to connect and to wait for an answer.
TIMEOUT_S = 1.0


class RemoteCache:
    """One Redis server, used by every :class:`~coil.sdk.diskcache.DiskCache` of the process."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        self.prefix = query.pop("prefix", "coil")
        self.url = urlunsplit(parts._replace(query=urlencode(query)))
        self._client: Any = None
        self._down_until = 0.0
        self._warned = False
        self._lock = threading.Lock()

    def _redis(self) -> Any:
        if self._client is None:
            import redis
            self._client = redis.Redis.from_url(self.url, socket_timeout=TIMEOUT_S,
                                                socket_connect_timeout=TIMEOUT_S)
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
        if not self._usable():
            return None
        name = self.name(namespace, key, suffix)
        try:
            value = self._redis().get(name)
        except Exception as exc:  # noqa: BLE001 - ImportError or any client/server failure
            self._failed("get", exc)
            return None
        if value is None:
            return None
        payload = _unpack(value)
        if payload is None:
            log.warning("coil: remote cache entry %s is damaged (bad checksum); deleting it and "
                        "rebuilding", name)
            try:
                self._redis().delete(name)
            except Exception as exc:  # noqa: BLE001
                self._failed("delete", exc)
            return None
        return payload

    def put(self, namespace: str, key: str, suffix: str, payload: bytes) -> bool:
        """Store ``payload`` unless the name exists (first writer wins) or it is too large;
        whether this call stored it."""
        if len(payload) > MAX_ENTRY_BYTES or not self._usable():
            return False
        try:
            return bool(self._redis().set(self.name(namespace, key, suffix), _pack(payload), nx=True))
        except Exception as exc:  # noqa: BLE001
            self._failed("put", exc)
            return False


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
    from coil import config
    url = config.current().remote_cache
    if not url:
        return None
    remote = _remotes.get(url)
    if remote is None:
        remote = _remotes[url] = RemoteCache(url)
    return remote


__all__ = ["RemoteCache", "current", "MAX_ENTRY_BYTES", "RETRY_S"]
