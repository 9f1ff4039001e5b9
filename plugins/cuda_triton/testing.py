"""Factories for running the Triton plugin without a GPU: its kernels under Triton's
interpreter on CPU tensors (``coil.register_backend_for_device("cpu", interpreted_backend())``,
or ``--coil-backend=coil_cuda_triton.testing:interpreted_backend`` in the conformance kit)."""
from __future__ import annotations

from .backend import TritonBackend


def interpreted_backend() -> TritonBackend:
    backend = TritonBackend(interpret=True)
    backend.device_type = "cpu"
    return backend
