"""Tier ``autotune_cache`` (devices with ``Capabilities.autotune``): tuning results persist on
disk, so a second compile of the same function in a fresh process tunes nothing.

What a backend must expose: an integer attribute (or property) ``tuning_count`` (declared
on ``DeviceBackend``, None there), how much tuning it did in this process (searches, or
configurations benchmarked: any count that grows exactly when its tuning cache misses), and
a tuning cache kept under
``coil.sdk.cache_dir(...)`` (that is, under ``COIL_CACHE_DIR``). The tier compiles
:func:`coil.sdk.testing.autotune_probe.probe_function` in a new process
(``python -m coil.sdk.testing.autotune_probe``) with an empty ``COIL_CACHE_DIR`` (it must
tune: otherwise nothing is observable), then in another new process with that directory,
which must tune nothing; both results must match eager. Both runs are fresh processes so a
backend that fixes its cache folder when it is created is measured fairly."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coil.sdk.testing.kit import Kit

pytestmark = pytest.mark.coil_tier("autotune_cache")

PROBE_TIMEOUT_S = 600


def _check(result: dict[str, Any], where: str) -> dict[str, Any]:
    assert "error" not in result, result.get("error")
    assert not result["mismatch"], f"{where}: wrong result: {result['mismatch']}"
    assert result["kernels"] > 0, f"{where}: Coil generated no kernel on the device"
    return result


def _fresh_process(kit: Kit, cache_dir: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "coil.sdk.testing.autotune_probe", "--device", str(kit.device)]
    spec = getattr(kit.options, "backend_spec", None)
    if spec:
        command += ["--backend", spec]
    # the graph cache off: a hit would skip the backend's compile, tuning cache and all
    env = dict(os.environ, COIL_CACHE_DIR=str(cache_dir), COIL_GRAPH_CACHE="0",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    assert done.returncode == 0, f"the probe process failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fresh_process_reads_the_tuning_cache(coil_kit: Kit, tmp_path: Path) -> None:
    assert getattr(coil_kit.backend, "tuning_count", None) is not None, (
        f"{type(coil_kit.backend).__name__} declares capabilities.autotune but has no "
        f"tuning_count attribute (tuning searches run in this process)")
    cold = _check(_fresh_process(coil_kit, tmp_path), "first process")
    assert cold["tuning_count"] > 0, "with an empty COIL_CACHE_DIR the backend tuned nothing"
    warm = _check(_fresh_process(coil_kit, tmp_path), "second process")
    assert warm["tuning_count"] == 0, (
        f"a fresh process with a warm COIL_CACHE_DIR tuned {warm['tuning_count']} time(s) again; "
        f"keep tuning results under coil.sdk.cache_dir()")
