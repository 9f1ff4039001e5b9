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


# ----------------------------------------------------------------------------- failing toolchains


def _fake_compiler(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_link_failure_shows_the_linker_message(tmp_path):
    """ld deletes its output when it fails; that used to surface as FileNotFoundError on
    the temporary library instead of the linker's message."""
    with config.override(cache_dir=str(tmp_path)):
        with pytest.raises(toolchain.CppCompileError) as info:
            toolchain.library_for('extern "C" void f() {}', ["-lcoil_no_such_library"])
    err = info.value
    assert "cannot find -lcoil_no_such_library" in err.output
    assert err.returncode == 1 and "-lcoil_no_such_library" in err.command
    assert os.path.exists(err.source_path) and err.source_path in str(err)
    assert "exit status 1" in str(err) and "-lcoil_no_such_library" in str(err)
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("cxx, expected", [
    ("/bin/false", "the compiler exited with status 1 and printed nothing"),
    ("/bin/true", "exited with status 0 but wrote no library"),
    ("killed", "killed by SIGKILL"),
    ("complaining", "out of coffee"),
])
def test_broken_compiler_says_what_happened(cxx, expected, tmp_path, monkeypatch):
    if cxx == "killed":
        cxx = _fake_compiler(tmp_path, "killed-cxx",
                             'case "$1" in --version) echo fake;; *) kill -9 $$;; esac')
    elif cxx == "complaining":
        cxx = _fake_compiler(tmp_path, "complaining-cxx", "echo 'fatal: out of coffee' >&2; exit 3")
    monkeypatch.setenv("CXX", cxx)
    with config.override(cache_dir=str(tmp_path / "cache")):
        with pytest.raises(toolchain.CppCompileError) as info:
            toolchain.library_for('extern "C" void f() {}')
    assert expected in info.value.output and expected in str(info.value)
    assert f"command: {cxx} " in str(info.value)
    assert info.value.source_path.endswith(".cpp") and os.path.exists(info.value.source_path)
    assert not list((tmp_path / "cache").rglob("*.so*"))


def _build_check(backend):
    [check] = [c for c in backend.doctor() if c.name.startswith("C++ build")]
    return check


def test_doctor_builds_a_library(monkeypatch):
    from coil_cpu_cpp.backend import CppBackend

    assert _build_check(CppBackend()).ok
    monkeypatch.setenv("CXX", "/bin/false")
    check = _build_check(CppBackend())
    assert not check.ok and "exit status 1" in check.detail and "printed nothing" in check.detail


def test_doctor_fails_with_a_broken_compiler(monkeypatch):
    from coil import cli, plugins

    monkeypatch.setenv("CXX", "/bin/false")
    plugins.reset()
    try:
        text, ok = cli.doctor_report()
    finally:
        plugins.reset()
    assert not ok and "[FAIL] C++ build" in text


def test_failing_compile_reaches_the_user_through_torch_compile(tmp_path, monkeypatch):
    import torch
    from coil import plugins

    monkeypatch.setenv("CXX", "/bin/false")
    # the registry's backend reads CXX when it is made: a fresh one here, and none left behind
    # with the broken compiler for the tests that follow
    plugins.reset()
    try:
        with config.override(cache_dir=str(tmp_path)):
            with pytest.raises(Exception) as info:
                torch.compile(lambda x: x.sin() + 1, backend="coil")(torch.randn(4))
    finally:
        plugins.reset()
    inner = getattr(info.value, "inner_exception", info.value)
    assert isinstance(inner, toolchain.CppCompileError), repr(info.value)
    assert "printed nothing" in str(info.value)
