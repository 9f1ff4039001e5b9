"""The measurement of the ``autotune_cache`` tier: compile and run a small function with Coil
on the device and report how many tuning searches the backend ran (``backend.tuning_count``
after minus before), whether the result matched eager on the CPU, and the kernel count. The
tier runs it in a new process with an empty ``COIL_CACHE_DIR``, then in another sharing that
directory; each prints its result as one JSON line::

    python -m coil.sdk.testing.autotune_probe --device NAME [--backend module:factory]
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from coil.sdk import registry

from .routing import route


def probe_function(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A row-wise normalisation and a column reduction: kernels any tuner has configs for."""
    return torch.softmax(x * 2, -1), (y * y).sum(0)


def measure(kit: Any) -> dict[str, Any]:
    """Compile and run :func:`probe_function` on ``kit``'s device: tuning searches the backend
    ran meanwhile, whether the result matched eager (empty string) or how it did not, and the
    number of kernels Coil generated on the device."""
    from .kit import recording

    backend = kit.backend
    if getattr(backend, "tuning_count", None) is None:  # DeviceBackend.tuning_count
        return {"error": f"{type(backend).__name__} declares capabilities.autotune but has no "
                         f"tuning_count attribute (tuning searches run in this process)"}
    torch.manual_seed(0)
    args = (torch.randn(64, 512), torch.randn(512, 256))
    expected = probe_function(*args)
    before = backend.tuning_count
    compiled = kit.compile(probe_function)
    with recording() as report:
        out = compiled(*kit.to_device(args))
    backend.synchronize()
    tuned = backend.tuning_count - before
    try:
        kit.assert_close(out, expected, atol=1e-4, rtol=1e-4)
        mismatch = ""
    except AssertionError as exc:
        mismatch = " ".join(str(exc).split())[:300]
    return {"tuning_count": tuned, "mismatch": mismatch, "kernels": len(kit.device_kernels(report))}


def run(device_name: str, backend_spec: str | None) -> dict[str, Any]:
    """:func:`measure` in this (fresh) process, routing ``backend_spec`` first when given."""
    from .kit import Kit

    device_type = device_name.partition(":")[0]
    if backend_spec:
        route(device_type, backend_spec)
    return measure(Kit(torch.device(device_name), registry.registry().backend_for(device_type)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True)
    parser.add_argument("--backend", default=None)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.device, args.backend)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
