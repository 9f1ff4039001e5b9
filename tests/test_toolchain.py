"""The CPU plugin's compiler handling: clear errors, an on-disk cache that spares a second
process the compiler, and atomic writes under concurrent compiles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import coil.sdk as sdk
from coil import config
from coil_cpu_cpp import toolchain


def test_missing_compiler_says_what_to_install(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(sdk.ToolchainError, match="apt-get install g\\+\\+"):
        toolchain.library_for('extern "C" void f() {}')


def test_compile_error_shows_message_and_source_path(tmp_path):
    with config.override(cache_dir=str(tmp_path)):
        with pytest.raises(sdk.KernelCompileError) as info:
            toolchain.library_for('extern "C" void f() { this is not C++; }')
    assert info.value.source_path.endswith(".cpp") and os.path.exists(info.value.source_path)
    assert "error" in info.value.output


SCRIPT = textwrap.dedent("""
    import torch
    f = torch.compile(lambda x: torch.softmax(x * 3, -1) + 1, backend="coil")
    x = torch.arange(12.0).reshape(3, 4)
    torch.testing.assert_close(f(x), torch.softmax(x * 3, -1) + 1)
    print("ok")
""")


def _run(env, script=SCRIPT):
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )


def test_second_process_calls_no_compiler(tmp_path):
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "logging-cxx"
    wrapper.write_text(
        f'#!/bin/sh\n[ "$1" = "--version" ] || echo compile >> {log}\nexec g++ "$@"\n'
    )
    wrapper.chmod(0o755)
    env = dict(os.environ, COIL_CACHE_DIR=str(tmp_path / "cache"), CXX=str(wrapper))
    first = _run(env)
    assert first.returncode == 0, first.stderr
    assert log.read_text().count("compile") >= 1
    before = log.read_text()
    second = _run(env)
    assert second.returncode == 0, second.stderr
    assert log.read_text() == before


def test_concurrent_processes_compile_safely(tmp_path):
    env = dict(os.environ, COIL_CACHE_DIR=str(tmp_path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "ok" in out
    assert not list(tmp_path.rglob("*.tmp"))
