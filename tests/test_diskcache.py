"""Coil's disk cache (:mod:`coil.sdk.diskcache`) distrusts what it finds: a damaged library is
set aside with a warning and rebuilt, never loaded (a truncated one must not SIGBUS the
process); debris of interrupted writers is swept; the size cap evicts the least recently used
entries; concurrent writers never expose half a file. Each case ends by compiling through
the CPU plugin and comparing with eager. Also ``coil cache stats|clear``."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from coil import cli, config
from coil.sdk import diskcache
from coil.sdk.diskcache import DiskCache

LOGGER = "coil.sdk.diskcache"


def fn(x):
    return torch.softmax(x * 3, -1) + x.sum(0)


def other(x):
    return torch.tanh(x) * 2 - x.amax(-1, keepdim=True)


X = torch.randn(5, 37)


def _compile_and_check(f=fn):
    torch._dynamo.reset()
    got = torch.compile(f, backend="coil")(X)
    torch.testing.assert_close(got, f(X))


def _libraries(root: Path) -> list[Path]:
    return sorted((root / "cpu_cpp").rglob("*.so"))


def _damaged_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING and "damaged" in r.getMessage()]


def _replace(path: Path, data: bytes) -> None:
    """Damage ``path`` through a new inode: this test process may have the old one mapped,
    and truncating a mapped library in place would crash it (which is the point of the
    subprocess test below)."""
    tmp = path.with_name(path.name + ".damage")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- damaged entries

DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "garbage": lambda data: os.urandom(len(data)),
    "one flipped byte": lambda data: data[:100] + bytes([data[100] ^ 0xFF]) + data[101:],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_library_is_quarantined_and_rebuilt(damage, tmp_path, caplog):
    with config.override(cache_dir=str(tmp_path)):
        _compile_and_check()
        [lib] = _libraries(tmp_path)
        _replace(lib, DAMAGE[damage](lib.read_bytes()))
        with caplog.at_level(logging.WARNING, LOGGER):
            _compile_and_check()
        assert len(_damaged_warnings(caplog)) == 1, caplog.text
        assert len(list((lib.parent.parent / "quarantine").iterdir())) == 1
        assert DiskCache(tmp_path / "cpu_cpp", fanout=True).lookup(lib.stem, ".so") == lib
        caplog.clear()
        _compile_and_check()  # the rebuilt entry is trusted: no second warning
        assert not _damaged_warnings(caplog)


SCRIPT = textwrap.dedent("""
    import torch
    def fn(x):
        return torch.softmax(x * 3, -1) + x.sum(0)
    x = torch.randn(5, 37)
    torch.testing.assert_close(torch.compile(fn, backend="coil")(x), fn(x))
    print("ok")
""")


def test_library_truncated_in_place_does_not_crash_a_new_process(tmp_path):
    """The reported failure: a library cut short where it lies killed the next process with
    SIGBUS at load. Populated here, copied to a fresh folder (so this process never maps the
    file that gets truncated), then loaded by a new process."""
    populated, damaged = tmp_path / "a", tmp_path / "b"
    with config.override(cache_dir=str(populated)):
        _compile_and_check()
    shutil.copytree(populated, damaged)
    [lib] = _libraries(damaged)
    with open(lib, "r+b") as f:
        f.truncate(lib.stat().st_size // 3)
    env = dict(os.environ, COIL_CACHE_DIR=str(damaged))
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok" in done.stdout
    assert "damaged" in done.stderr and "rebuilding" in done.stderr


def test_tuning_result_damaged_is_tuned_again(tmp_path, caplog):
    from coil_cuda_triton import autotune
    from coil_cuda_triton.configs import Config

    cache = autotune.TuneCache(str(tmp_path / "triton-autotune"))
    cache.put("k" * 32, Config(256, num_warps=2), {"a": 1.0}, "kernel")
    assert cache.get("k" * 32) == Config(256, num_warps=2)
    path = Path(cache.folder) / f"{'k' * 32}.json"
    path.write_bytes(path.read_bytes().replace(b"256", b"257"))
    with caplog.at_level(logging.WARNING, LOGGER):
        assert cache.get("k" * 32) is None
    assert len(_damaged_warnings(caplog)) == 1
    assert not path.exists()


# ----------------------------------------------------------------------------- debris and the cap


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_are_swept(tmp_path, caplog):
    folder = tmp_path / "cpu_cpp" / "ab"
    folder.mkdir(parents=True)
    (tmp_path / "cpu_cpp" / diskcache.MARKER).touch()
    host = diskcache._HOST
    dead = folder / f"abcd.so.{_dead_pid()}@{host}.0001.tmp"  # its writer was killed
    old = folder / "tmpx1y2.so.tmp"  # an older Coil's name, two hours old
    live = folder / f"abce.so.{os.getpid()}@{host}.0002.tmp"  # a compile in progress
    elsewhere = folder / f"abcf.so.{_dead_pid()}@{'0' * 8}.0003.tmp"  # another host's writer
    for path in (dead, old, live, elsewhere):
        path.write_bytes(b"\x7fELF half a library")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    with config.override(cache_dir=str(tmp_path)), caplog.at_level(logging.INFO, LOGGER):
        _compile_and_check()  # writing the new library sweeps
    assert not dead.exists() and not old.exists()
    assert live.exists() and elsewhere.exists()
    assert "removed 2 temporary cache file(s)" in caplog.text


def _age(paths, seconds: float) -> None:
    then = time.time() - seconds
    for p in paths:
        os.utime(p, (then, then))


def test_cap_evicts_least_recently_used(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(diskcache, "SWEEP_INTERVAL_S", 0.0)
    root = tmp_path
    with config.override(cache_dir=str(root), cache_max_bytes=1):  # every write evicts what it may
        _compile_and_check(fn)
        [first] = _libraries(root)
        _age((root / "cpu_cpp").rglob(f"{first.stem}.*"), 3600)
        with caplog.at_level(logging.INFO, LOGGER):
            _compile_and_check(other)
        assert "evicted 2 file(s)" in caplog.text  # the old library and its source
        [second] = _libraries(root)
        assert second != first and not first.exists()
        _compile_and_check(fn)  # evicted, so rebuilt: still right
        assert set(_libraries(root)) == {first, second}  # both used within the minute: kept


def test_hit_refreshes_recency(tmp_path, monkeypatch):
    monkeypatch.setattr(diskcache, "SWEEP_INTERVAL_S", 0.0)
    cache = DiskCache(tmp_path / "ns")
    with config.override(cache_max_bytes=10_000):
        a, b = cache.write("a", ".bin", b"a" * 4000), cache.write("b", ".bin", b"b" * 4000)
        _age([a, b], 3600)
        assert cache.read("a", ".bin") == b"a" * 4000  # a is now the recent one
        cache.write("c", ".bin", b"c" * 4000)
    assert a.exists() and not b.exists()


def test_cap_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(diskcache, "SWEEP_INTERVAL_S", 0.0)
    monkeypatch.setenv("COIL_CACHE_MAX_BYTES", "8K")
    config.reload_from_env()
    try:
        cache = DiskCache(tmp_path / "ns")
        old = [cache.write(k, ".bin", b"x" * 3000) for k in ("a", "b", "c")]
        for hours, path in zip((3, 2, 1), old):
            _age([path], hours * 3600)
        cache.write("d", ".bin", b"x" * 3000)
    finally:
        monkeypatch.delenv("COIL_CACHE_MAX_BYTES")
        config.reload_from_env()
    assert [p.exists() for p in old] == [False, False, True]  # 2 x 3102 bytes left: under 8 KiB


# ----------------------------------------------------------------------------- concurrent writers

WRITER = textwrap.dedent("""
    import sys
    from coil.sdk.diskcache import DiskCache
    cache = DiskCache(sys.argv[1], max_bytes=1 << 30)
    mine = bytes([int(sys.argv[2])]) * (50_000 * int(sys.argv[2]))
    payloads = {bytes([n]) * (50_000 * n) for n in (1, 2)}
    for _ in range(150):
        cache.write("shared", ".bin", mine)
        got = cache.read("shared", ".bin")
        assert got in payloads, (len(got) if got is not None else None)
""") + SCRIPT


def test_concurrent_writers_never_expose_half_a_file(tmp_path):
    env = dict(os.environ, COIL_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "stress"), str(n)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert "ok" in out and "damaged" not in err
    assert not list(tmp_path.rglob("*.tmp"))
    [lib] = _libraries(tmp_path)
    assert DiskCache(tmp_path / "cpu_cpp", fanout=True).lookup(lib.stem, ".so") == lib


# ----------------------------------------------------------------------------- the CLI


def test_cache_stats_and_clear(tmp_path, capsys):
    with config.override(cache_dir=str(tmp_path)):
        _compile_and_check()
        (tmp_path / "unrelated").mkdir()
        (tmp_path / "unrelated" / "keep.txt").write_text("not Coil's disk cache")
        assert cli.main(["cache", "stats"]) == 0
        out = capsys.readouterr().out
        assert "cpu_cpp" in out and "size cap" in out and "unrelated" in out
        [row] = [r for r in diskcache.stats(tmp_path) if r.name == "cpu_cpp"]
        assert (row.entries, row.other_files, row.temporaries) == (1, 1, 0)  # library, source
        assert cli.main(["cache", "clear", "nonexistent"]) == 2
        assert cli.main(["cache", "clear"]) == 0
        assert not _libraries(tmp_path)
        assert (tmp_path / "unrelated" / "keep.txt").exists()
        _compile_and_check()  # an emptied cache just fills again
        assert len(_libraries(tmp_path)) == 1
