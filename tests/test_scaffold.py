"""``coil new-plugin``: the generated package installs without network, loads through its entry
point, serves its device, and passes its own tests as generated (which run the conformance
kit's runtime and pointwise tiers); for a device torch does not know, everything the author
sees says it needs PrivateUse1 registration, and the device tests skip instead of failing."""
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
    assert 'device_type = "npu"' in backend
    assert "class MyChipBackend(sdk.DeviceBackend[ReferenceModule])" in backend  # typed
    assert f'return "{API_VERSION}"' in (tmp_path / "pkg" / "coil_my_chip" / "__init__.py").read_text()
    for f in files:
        if f.suffix == ".py":
            compile(f.read_text(), str(f), "exec")


def test_unknown_device_is_explained_where_the_author_looks(tmp_path, capsys):
    """``--device npu`` on a torch without an npu extension: the command, the README and the
    generated tests all say that the device needs PrivateUse1 registration."""
    assert not scaffold.torch_knows("npu") and scaffold.torch_knows("cpu")
    assert main(["new-plugin", "npuchip", "--device", "npu", "--output", str(tmp_path / "npu")]) == 0
    out = capsys.readouterr().out
    assert "torch does not know device type 'npu'" in out and "PrivateUse1" in out, out
    readme = (tmp_path / "npu" / "README.md").read_text()
    assert "## A device torch does not know" in readme
    assert 'torch.utils.rename_privateuse1_backend("npu")' in readme and "examples/emu_chip" in readme
    tests = (tmp_path / "npu" / "tests" / "test_npuchip.py").read_text()
    assert tests.count("@needs_device") == 2
    scaffold.generate("cpuchip", "cpu", tmp_path / "cpu")
    assert "PrivateUse1" not in (tmp_path / "cpu" / "README.md").read_text()
    assert main(["new-plugin", "other", "--device", "cpu", "--output", str(tmp_path / "c2")]) == 0
    assert "torch does not know" not in capsys.readouterr().out


def _kit_available() -> bool:
    return all(importlib.util.find_spec(f"coil.sdk.testing.test_{tier}") is not None
               for tier in scaffold.TIERS.split(","))


def test_generated_package_installs_loads_and_passes_its_tests(tmp_path):
    """Two generated packages, installed together: one for ``cpu`` (every test passes) and the
    quick start's ``--device npu``, which torch does not know here (its plugin loads, its device
    tests skip saying why, and ``coil doctor`` shows its check as skipped, not ok)."""
    pkg = tmp_path / "coil-scaffoldchip"
    npu = tmp_path / "coil-npuchip"
    assert main(["new-plugin", "scaffoldchip", "--device", "cpu", "--output", str(pkg)]) == 0
    assert main(["new-plugin", "npuchip", "--device", "npu", "--output", str(npu)]) == 0
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                          "--no-deps", "--no-index", "--target", str(site), str(pkg), str(npu)],
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
    assert "npu        served by npuchip" in doctor.stdout
    assert "[skipped] torch tensors on npu: torch does not know device type 'npu'" in doctor.stdout
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    select = [] if _kit_available() else ["-k", "not conformance"]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                            str(pkg / "tests"), str(npu / "tests"), *select], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, tests.stdout[-6000:] + tests.stderr[-3000:]
    # cpu: all of them; npu: the plugin loads, the 2 device tests skip with the reason
    assert ("4 passed, 2 skipped" if not select else "3 passed, 1 skipped") in tests.stdout, tests.stdout
    skips = [line for line in tests.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("test_npuchip.py" in s and "PrivateUse1 registration" in s for s in skips), skips
