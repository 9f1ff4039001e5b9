"""The out-of-tree example plugin (``examples/emu_chip``) works as a vendor would ship it.

The package is pip-installed, offline (``--no-index``, ``--no-build-isolation``: torch and
Coil come from the environment), into a fresh virtual environment that sees this one's
packages; the install builds the device emulation's C++ library. In that environment a
subprocess compiles graphs for the ``emu`` device (PyTorch's PrivateUse1, registered on
``import torch`` through the ``torch.backends`` entry point) and checks that the outputs stay
on the device, match CPU eager, and come from fused kernels of the plugin with no fallback.
``coil doctor`` must list the plugin serving ``emu``, and the conformance kit (``coil
conformance emu``) must pass. Static checks: the plugin imports only
``coil.sdk``, torch and the standard library, and stays under its line budget."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "emu_chip"
PLUGIN = EXAMPLE / "coil_emu_chip"
LINE_BUDGET = 300


def _run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def emu_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """(python of a fresh venv with the example installed, the environment to run it in)."""
    for tool in ("cc", os.environ.get("CXX", "c++")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: the example builds C and C++")
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools not installed: the example builds with it (--no-build-isolation)")
    root = tmp_path_factory.mktemp("emu_chip")
    # Build from a copy: pip writes build/ and *.egg-info next to the sources.
    src = root / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "*.so", "__pycache__"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # The parent environment's packages (torch, coil, pip...), .pth files included (an editable
    # install of Coil is one).
    parents = "; ".join(f"site.addsitedir({d!r})" for d in site.getsitepackages())
    Path(purelib, "_parent_environment.pth").write_text(f"import site; {parents}\n")
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INPUT": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
           "COIL_CACHE_DIR": str(root / "cache")}
    _run([python, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-cache-dir",
          str(src)], env, timeout=600)
    return python, env


_COMPILE_SCRIPT = textwrap.dedent('''
    import json
    import torch
    import torch.nn.functional as F
    import coil
    from coil import plugins

    def chain(x):  # one pointwise kernel
        return torch.sigmoid(x * 2.0 + 1.0).tanh() - x.abs() / 3.0

    def softmax(x):  # max, exp-sum and normalisation in one kernel
        return torch.softmax(x, dim=-1)

    def layer_norm(x, w, b):  # one-pass Welford, then the normalisation, in one kernel
        return F.layer_norm(x, (x.shape[-1],), w, b)

    torch.manual_seed(0)
    x, w, b = torch.randn(16, 100), torch.randn(100), torch.randn(100)
    cases = {"chain": (chain, (x,)), "softmax": (softmax, (x,)), "layer_norm": (layer_norm, (x, w, b))}
    result = {"plugins": {p.name: p.source for p in plugins.registry().plugins}}
    for name, (fn, args) in cases.items():
        report = coil.explain(fn, *[a.to("emu") for a in args])
        out = report.result
        torch.testing.assert_close(out.cpu(), fn(*args), atol=1e-5, rtol=1e-5)
        result[name] = {
            "device": out.device.type, "real_memory": out.data_ptr() != 0,
            "kernels": [(k.name, k.device) for k in report.kernels],
            "fallbacks": report.fallbacks, "library_calls": report.library_calls,
            "source": report.kernels[0].source if report.kernels else "",
        }
    # dynamic shapes: one symbolic compile serves a second size
    compiled = torch.compile(softmax, backend="coil", dynamic=True)
    for rows in (5, 9):
        y = torch.randn(rows, 33)
        torch.testing.assert_close(compiled(y.to("emu")).cpu(), softmax(y), atol=1e-5, rtol=1e-5)
    print(json.dumps(result))
''')


def test_compiled_graphs_run_fused_on_the_emu_device(emu_env: tuple[str, dict[str, str]]) -> None:
    python, env = emu_env
    proc = _run([python, "-c", _COMPILE_SCRIPT], env)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["plugins"].get("emu_chip") == "entry point"
    for name in ("chain", "softmax", "layer_norm"):
        case = result[name]
        assert case["device"] == "emu" and case["real_memory"], case
        assert case["fallbacks"] == [] and case["library_calls"] == [], case
        assert len(case["kernels"]) == 1, f"{name} should be one fused kernel: {case['kernels']}"
        assert case["kernels"][0][1] == "emu"
        assert case["source"].startswith("void k"), case["source"]  # the plugin's C
    assert "acc_" in result["layer_norm"]["source"]  # the plugin's accumulators, not a library call


def test_doctor_lists_the_plugin_serving_emu(emu_env: tuple[str, dict[str, str]]) -> None:
    python, env = emu_env
    proc = subprocess.run([python, "-m", "coil.cli", "doctor"], env=env, capture_output=True, text=True,
                          timeout=300)
    lines = proc.stdout.splitlines()
    assert any(line.split()[:1] == ["emu_chip"] and "(entry point)" in line for line in lines), proc.stdout
    start = next(i for i, line in enumerate(lines) if line.split()[:4] == ["emu", "served", "by", "emu_chip"])
    checks = []
    for line in lines[start + 1:]:
        if not line.startswith("    ["):
            break
        checks.append(line.strip())
    assert checks and all(c.startswith("[ok]") for c in checks), proc.stdout
    assert "emu_chip:" not in proc.stdout.partition("plugins that failed to load:")[2], proc.stdout


def test_conformance_kit_passes_on_emu(emu_env: tuple[str, dict[str, str]]) -> None:
    python, env = emu_env
    has_kit = subprocess.run([python, "-c", "import coil.sdk.testing.scorecard"], env=env,
                             capture_output=True).returncode == 0
    if not has_kit:
        pytest.skip("this Coil has no conformance kit (coil.sdk.testing.scorecard)")
    proc = subprocess.run([python, "-m", "coil.cli", "conformance", "emu"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "CONFORMANT" in proc.stdout and "NOT CONFORMANT" not in proc.stdout, proc.stdout[-3000:]


def _imported_modules(path: Path) -> list[tuple[str, int]]:
    """Absolute module names a file imports (relative imports are the plugin's own)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module or "", node.lineno))
    return found


def test_plugin_imports_only_the_sdk_torch_and_the_standard_library() -> None:
    bad = []
    for path in sorted(PLUGIN.glob("*.py")):
        for module, line in _imported_modules(path):
            root = module.split(".")[0]
            allowed = (module == "coil.sdk" or module.startswith("coil.sdk.") or root == "torch"
                       or (root in sys.stdlib_module_names and root != "coil"))
            if not allowed:
                bad.append(f"{path.name}:{line}: {module}")
    assert not bad, "the plugin may import only coil.sdk, torch and the standard library:\n" + "\n".join(bad)


def test_plugin_stays_under_its_line_budget() -> None:
    spec = importlib.util.spec_from_file_location("emu_chip_count_lines", EXAMPLE / "count_lines.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    per_file = module.count()
    assert sum(per_file.values()) < LINE_BUDGET, per_file
