"""A small Redis client for the remote cache (:mod:`coil.sdk.remotecache`): the commands it
uses, in the RESP2 protocol, over one socket per process.

Why not the ``redis`` package: importing it took 180-250 ms on the 2-core development
machine (``redis.commands.core`` alone is 66 ms), against a warm first call of 0.5-0.7 s on
small workloads, and the remote cache exists to make first calls short. This client imports
nothing beyond the standard library's ``socket`` (and ``ssl`` for ``rediss://``).

URLs: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS, the system's
certificate store) and ``unix://[[user]:password@]/path/to/socket[?db=N]``. Every command
waits at most ``timeout`` seconds; any failure closes the connection (the next command opens
a new one) and raises :class:`RedisError` or an ``OSError``."""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence
from urllib.parse import parse_qsl, unquote, urlsplit

CRLF = b"\r\n"


class RedisError(Exception):
    """An error reply from the server (``-ERR ...``), or a reply this client cannot read."""


@dataclass(frozen=True)
class Address:
    """Where a server is and how to log in, from a URL."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str = ""  # a unix socket
    tls: bool = False
    db: int = 0
    username: str = ""
    password: str = ""

    @classmethod
    def parse(cls, url: str) -> Address:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        if parts.scheme == "unix":
            return cls(path=parts.path, db=int(query.get("db", 0)), username=user, password=password)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"remote cache URL {url!r}: use redis://host:port/db, rediss://... or unix://path")
        db = parts.path.strip("/") or query.get("db", "0")
        return cls(parts.hostname or "127.0.0.1", parts.port or 6379, "", parts.scheme == "rediss", int(db),
                   user, password)


def _encode(args: Sequence[Any]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        data = a if isinstance(a, bytes) else str(a).encode()
        out += [b"$%d\r\n" % len(data), data, CRLF]
    return b"".join(out)


class Client:
    """One connection to one server, opened on first use; thread-safe (one command at a time)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.address = Address.parse(url)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._lock = threading.Lock()

    # -- the connection

    def _connect(self) -> None:
        a = self.address
        if a.path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            sock.connect(a.path)
        else:
            sock = socket.create_connection((a.host, a.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if a.tls:
                import ssl  # only for rediss:// (a Python may be built without OpenSSL)
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=a.host)
        self._sock, self._file = sock, sock.makefile("rb")
        if a.password:
            self._call([("AUTH", a.username, a.password) if a.username else ("AUTH", a.password)])
        if a.db:
            self._call([("SELECT", a.db)])

    def close(self) -> None:
        for closable in (self._file, self._sock):
            if closable is not None:
                try:
                    closable.close()
                except OSError:
                    pass
        self._sock = self._file = None

    def _call(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        assert self._sock is not None
        self._sock.sendall(b"".join(_encode(c) for c in commands))
        replies = [self._reply() for _ in commands]
        errors = [r for r in replies if isinstance(r, RedisError)]
        if errors:
            raise errors[0]
        return replies

    def _reply(self) -> Any:
        line = self._file.readline()
        if not line.endswith(CRLF):
            raise ConnectionError("the server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self._file.read(n + 2)
            if len(data) != n + 2:
                raise ConnectionError("the server closed the connection mid-reply")
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RedisError(f"unreadable reply {line[:40]!r}")

    def pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """The replies to ``commands``, sent together (one round trip)."""
        if not commands:
            return []
        with self._lock:
            try:
                if self._sock is None:
                    self._connect()
                return self._call(commands)
            except BaseException:
                self.close()  # a half-read reply leaves the stream unusable
                raise

    def execute(self, *args: Any) -> Any:
        return self.pipeline([args])[0]

    # -- the commands the remote cache uses

    def ping(self) -> bool:
        return self.execute("PING") == b"PONG"

    def get(self, name: str) -> bytes | None:
        return self.execute("GET", name)

    def set_nx(self, name: str, value: bytes) -> bool:
        """Store ``value`` unless ``name`` exists; whether it was stored."""
        return self.execute("SET", name, value, "NX") is not None

    def delete(self, *names: Any) -> int:
        return int(self.execute("DEL", *names)) if names else 0

    def unlink(self, *names: Any) -> int:
        return int(self.execute("UNLINK", *names)) if names else 0

    def scan_iter(self, match: str, count: int = 1000) -> Iterator[bytes]:
        cursor = b"0"
        while True:
            cursor, names = self.execute("SCAN", cursor, "MATCH", match, "COUNT", count)
            yield from names
            if cursor == b"0":
                return


__all__ = ["Client", "Address", "RedisError"]
