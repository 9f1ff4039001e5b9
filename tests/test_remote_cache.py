"""The shared cache on Redis (``coil.sdk.remotecache``) behind the local disk cache, against a
real ``redis-server`` on its own port: a second machine (an empty local cache) compiles
nothing, a server killed mid-run never fails a compile, damaged values are rebuilt, and
concurrent writers leave one whole value."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

import coil
from coil import cli, config
from coil.sdk import remotecache
from coil.sdk.diskcache import DiskCache

pytestmark = pytest.mark.graph_cache

redis = pytest.importorskip("redis", reason="the redis client is not installed (pip install 'coil[remote]')")
if shutil.which("redis-server") is None:
    pytest.skip("redis-server is not installed (scripts/setup-env.sh installs it as root: "
                "apt-get install redis-server)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, *extra: str, password: str | None = None):
    """A redis-server on a free port (the ``redis`` package is the tests' own client, so
    Coil's client is checked against another one)."""
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=password)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    return proc, port, client


@pytest.fixture
def server(tmp_path):
    proc, port, client = _start(tmp_path)
    yield proc, f"redis://127.0.0.1:{port}/0", client
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_the_client_logs_in_and_selects_the_database(tmp_path):
    proc, port, _ = _start(tmp_path, "--requirepass", "s3cret", password="s3cret")
    try:
        remote = remotecache.RemoteCache(f"redis://:s3cret@127.0.0.1:{port}/2?prefix=p")
        assert remote.put("ns", "key", ".bin", b"\x00\r\n" * 1000)  # binary-safe
        assert remote.get("ns", "key", ".bin") == b"\x00\r\n" * 1000
        assert redis.Redis(port=port, password="s3cret", db=2).keys("*") == [b"p:ns:key.bin"]
        assert redis.Redis(port=port, password="s3cret", db=0).keys("*") == []
        wrong = remotecache.RemoteCache(f"redis://:nope@127.0.0.1:{port}/2")
        assert wrong.fetch("ns", "key", ".bin") == (None, "error")  # refused login: a failure, no crash
    finally:
        proc.kill()
        proc.wait()


SCRIPT = """
import json, torch
from coil import compile as cc
from coil.demo import Block
reports = []
cc.add_observer(reports.append)
torch.manual_seed(0)
block = Block(dim=32, heads=2).eval()
x = torch.randn(2, 8, 32)
with torch.no_grad():
    err = (torch.compile(block, backend="coil")(x) - block(x)).abs().max().item()
print(json.dumps({"err": err, "cached": [r.cached for r in reports]}))
"""


def _process(url: str, local) -> dict:
    env = dict(os.environ, COIL_CACHE_DIR=str(local), COIL_REMOTE_CACHE=url)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_machine_compiles_nothing(server, tmp_path):
    _, url, client = server
    first = _process(url, tmp_path / "machine1")
    assert first["cached"] == [False] and first["err"] < 1e-4
    names = {k.decode().split(":")[1] for k in client.keys("coil:*")}
    assert {"graphs", "cpu_cpp"} <= names, names
    second = _process(url, tmp_path / "machine2")  # an empty local cache
    assert second["cached"] == [True] and second["err"] < 1e-4
    assert list((tmp_path / "machine2" / "graphs").glob("*/*.graph"))  # the local disk is filled


def _f(x):
    return torch.softmax(x, -1) * 3


def _compile(x):
    torch._dynamo.reset()
    from coil import compile as cc
    reports = []
    cc.add_observer(reports.append)
    try:
        result = torch.compile(_f, backend="coil")(x)
    finally:
        cc.remove_observer(reports.append)
    torch.testing.assert_close(result, _f(x))
    return reports


def test_a_server_killed_mid_run_falls_back_with_one_warning(server, tmp_path, caplog, monkeypatch):
    proc, url, _ = server
    monkeypatch.setattr(remotecache, "_remotes", {})
    with config.override(cache_dir=str(tmp_path / "a"), remote_cache=url):
        assert not _compile(torch.randn(4, 8))[0].cached
        proc.kill()
        proc.wait()
        with caplog.at_level(logging.WARNING, logger="coil.sdk.remotecache"):
            with config.override(cache_dir=str(tmp_path / "b")):
                _compile(torch.randn(4, 8))
                _compile(torch.randn(5, 8))
        warnings = [r for r in caplog.records if r.name == "coil.sdk.remotecache"]
        assert len(warnings) == 1 and "local cache only" in warnings[0].getMessage()


def test_a_retry_after_the_pause_reaches_the_server_again(server, monkeypatch):
    _, url, client = server
    remote = remotecache.RemoteCache(url.replace(url.rsplit(":", 1)[1].split("/")[0], str(_free_port())))
    assert remote.get("ns", "k", ".x") is None  # nothing listens there: a pause begins
    assert not remote._usable()
    remote.url, remote._client = url, None
    monkeypatch.setattr(remotecache.time, "monotonic", lambda: time.time() + 1e6)
    assert remote.put("ns", "k", ".x", b"back") and remote.get("ns", "k", ".x") == b"back"


def test_a_damaged_remote_value_is_deleted_and_rebuilt(server, tmp_path, monkeypatch, caplog):
    _, url, client = server
    monkeypatch.setattr(remotecache, "_remotes", {})
    with config.override(cache_dir=str(tmp_path / "a"), remote_cache=url):
        _compile(torch.randn(4, 8))
    [name] = client.keys("coil:graphs:*")
    value = bytearray(client.get(name))
    value[-10] ^= 0xFF
    client.set(name, bytes(value))
    with config.override(cache_dir=str(tmp_path / "b"), remote_cache=url):
        assert not _compile(torch.randn(4, 8))[0].cached  # compiled again, correct
    assert "damaged" in caplog.text
    assert remotecache._unpack(client.get(name)) is not None  # written again, whole
    with config.override(cache_dir=str(tmp_path / "c"), remote_cache=url):
        assert _compile(torch.randn(4, 8))[0].cached


def test_concurrent_writers_leave_the_first_whole_value(server):
    _, url, client = server
    remote = remotecache.RemoteCache(url + "?prefix=proj2")
    payloads = [bytes([i]) * 300_000 for i in range(8)]
    results: list[bool] = []
    threads = [threading.Thread(target=lambda p=p: results.append(remote.put("ns", "key", ".bin", p)))
               for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 1
    assert remote.get("ns", "key", ".bin") in payloads
    assert client.keys("proj2:*") == [b"proj2:ns:key.bin"]  # namespaced by the URL's prefix


def test_oversized_payloads_stay_local(server, tmp_path, monkeypatch):
    _, url, client = server
    monkeypatch.setattr(remotecache, "_remotes", {})
    monkeypatch.setattr(remotecache, "MAX_ENTRY_BYTES", 100)
    with config.override(cache_dir=str(tmp_path), remote_cache=url):
        cache = DiskCache.in_namespace("remote-test")
        cache.write("small", ".bin", b"x" * 10)
        cache.write("large", ".bin", b"x" * 1000)
    assert client.keys("coil:remote-test:*") == [b"coil:remote-test:small.bin"]


def test_hits_and_misses_from_the_remote_are_counted(server, tmp_path, monkeypatch):
    proc, url, _ = server
    monkeypatch.setattr(remotecache, "_remotes", {})
    x = torch.randn(4, 8)
    with config.override(cache_dir=str(tmp_path / "a"), remote_cache=url):
        first = coil.explain(_f, x)
        with config.override(cache_dir=str(tmp_path / "b")):  # another machine
            second = coil.explain(_f, x)
        proc.kill()
        proc.wait()
        with config.override(cache_dir=str(tmp_path / "c")):
            third = coil.explain(_f, x)
    for ns in ("aot", "graphs"):  # the graph layer's namespaces: Dynamo graph (coil.aot_cache), ATen graph
        assert first.cache.get("graph", "miss", ns) == 1 and first.cache.get("graph", "remote_miss", ns) == 1
        assert first.cache.get("graph", "remote_write", ns) == 1
        assert second.cache.get("graph", "remote_hit", ns) == 1 and second.cache.get("graph", "miss", ns) == 0
        assert third.cache.get("graph", "miss", ns) == 1 and third.cache.get("graph", "remote_error", ns) == 2  # get, put
    assert first.cache.get("kernel", "remote_write") == 1
    assert "graph 0 hit(s), 0 miss(es), 2 from the remote cache" in str(second)
    assert "remote cache unavailable" in str(third)


def _coil_keys(client, prefix="coil"):
    return sorted(k.decode() for k in client.keys(f"{prefix}:*"))


def test_cache_clear_empties_coils_namespace_on_the_server_and_nothing_else(server, tmp_path, monkeypatch, capsys):
    _, url, client = server
    monkeypatch.setattr(remotecache, "_remotes", {})
    with config.override(cache_dir=str(tmp_path / "a"), remote_cache=url):
        _compile(torch.randn(4, 8))
    ours = _coil_keys(client)
    assert {k.split(":")[1] for k in ours} == {"aot", "graphs", "cpu_cpp"}, ours
    packed = remotecache._pack(b"a payload")
    foreign = {
        "other:graphs:abc.graph": packed,  # another prefix
        "coilx:graphs:abc.graph": packed,  # a prefix that starts like ours
        "coil:graphs:abc.graph": b"not a Coil value",  # Coil's shape, someone else's value
        "coil:user:key:with:colons": packed,  # not the shape of a Coil name
        "coil": b"x", "unrelated": b"y",
    }
    for name, value in foreign.items():
        client.set(name, value)
    remotecache.RemoteCache(url + "?prefix=proj2").put("graphs", "k", ".graph", b"another project")

    with config.override(cache_dir=str(tmp_path / "a"), remote_cache=url):
        assert cli.main(["cache", "stats"]) == 0
        assert f"remote cache {url} (prefix 'coil'): {len(ours)} entr(y/ies)" in capsys.readouterr().out
        assert cli.main(["cache", "clear", "--local-only"]) == 0
        assert _coil_keys(client) == sorted(ours + ["coil:graphs:abc.graph", "coil:user:key:with:colons"])
        assert cli.main(["cache", "clear", "cpu_cpp"]) == 0  # one namespace
        assert all(":cpu_cpp:" not in k for k in _coil_keys(client))
        assert any(k.startswith("coil:graphs:") and k != "coil:graphs:abc.graph" for k in _coil_keys(client))
        assert cli.main(["cache", "clear"]) == 0
        assert "from the remote cache" in capsys.readouterr().out
    for name, value in foreign.items():
        assert client.get(name) == value, name
    assert _coil_keys(client) == ["coil:graphs:abc.graph", "coil:user:key:with:colons"]
    assert client.keys("proj2:*") == [b"proj2:graphs:k.graph"]
    with config.override(cache_dir=str(tmp_path / "fresh"), remote_cache=url):
        assert not _compile(torch.randn(4, 8))[0].cached  # nothing left to hit: compiled again


def test_cache_clear_says_when_the_server_is_unreachable(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(remotecache, "_remotes", {})
    with config.override(cache_dir=str(tmp_path), remote_cache=f"redis://127.0.0.1:{_free_port()}/0"):
        assert cli.main(["cache", "clear"]) == 1
        assert cli.main(["cache", "stats"]) == 0
    captured = capsys.readouterr()
    assert "not cleared" in captured.err and "unreachable" in captured.out
