"""``coil new-plugin``: the generated package installs without network, loads through its entry
point, serves its device, and passes its own tests as generated (which run the conformance
kit's runtime and pointwise tiers)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from coil.cli import main
from coil.sdk import API_VERSION, scaffold


def test_refuses_bad_names_devices_and_full_folders(tmp_path, capsys):
    with pytest.raises(scaffold.ScaffoldError, match="lower-case letters"):
        scaffold.generate("9chip", "cpu", tmp_path / "a")
    with pytest.raises(scaffold.ScaffoldError, match="no index"):
        scaffold.generate("chip", "cuda:0", tmp_path / "b")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("")
    with pytest.raises(scaffold.ScaffoldError, match="not an empty folder"):
        scaffold.generate("chip", "cpu", full)
    assert main(["new-plugin", "my chip", "--device", "cpu", "--output", str(tmp_path / "c")]) == 2
    assert "lower-case letters" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_generated_files(tmp_path):
    files = scaffold.generate("my-chip", "npu", tmp_path / "pkg")
    names = sorted(str(f.relative_to(tmp_path / "pkg")) for f in files)
    assert names == ["README.md", "coil_my_chip/__init__.py", "coil_my_chip/backend.py",
                     "pyproject.toml", "tests/test_my_chip.py"]
    pyproject = (tmp_path / "pkg" / "pyproject.toml").read_text()
    assert '[project.entry-points."coil.plugins"]\nmy_chip = "coil_my_chip"' in pyproject
    backend = (tmp_path / "pkg" / "coil_my_chip" / "backend.py").read_text()
    assert 'device_type = "npu"' in backend and "class MyChipBackend(sdk.DeviceBackend)" in backend
    assert f'return "{API_VERSION}"' in (tmp_path / "pkg" / "coil_my_chip" / "__init__.py").read_text()
    for f in files:
        if f.suffix == ".py":
            compile(f.read_text(), str(f), "exec")


def _kit_available() -> bool:
    return all(importlib.util.find_spec(f"coil.sdk.testing.test_{tier}") is not None
               for tier in scaffold.TIERS.split(","))


def test_generated_package_installs_loads_and_passes_its_tests(tmp_path):
    pkg = tmp_path / "coil-scaffoldchip"
    assert main(["new-plugin", "scaffoldchip", "--device", "cpu", "--output", str(pkg)]) == 0
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                          "--no-deps", "--no-index", "--target", str(site), str(pkg)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # The shipped CPU plugin serves "cpu" too: block it so the entry point path is the one tested.
    env = dict(os.environ, COIL_BLOCK_PLUGINS="cpu_cpp",
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    doctor = subprocess.run([sys.executable, "-m", "coil.cli", "doctor"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert re.search(rf"scaffoldchip +version 0\.1\.0 +API {re.escape(API_VERSION)} +\(entry point\)",
                     doctor.stdout), doctor.stdout + doctor.stderr
    assert "cpu        served by scaffoldchip" in doctor.stdout
    assert "[ok] torch tensors on cpu" in doctor.stdout
    select = [] if _kit_available() else ["-k", "not conformance"]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(pkg / "tests"), *select], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    assert ("3 passed" if not select else "2 passed") in tests.stdout
