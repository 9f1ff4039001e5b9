"""Factories for running the Triton plugin without a GPU: its kernels under Triton's
interpreter on CPU tensors (``coil.register_backend_for_device("cpu", interpreted_backend())``,
or ``--coil-backend=coil_cuda_triton.testing:conformance_backend`` in the conformance kit).
Both need ``TRITON_INTERPRET=1`` in the environment before triton is imported."""
from __future__ import annotations

from .backend import TritonBackend


def interpreted_backend() -> TritonBackend:
    """The interpreted backend, launching one configuration per kernel (fast)."""
    backend = TritonBackend(interpret=True)
    backend.device_type = "cpu"
    return backend


def conformance_backend() -> TritonBackend:
    """The interpreted backend that also tunes, as on the GPU (the kit's autotune tier)."""
    backend = TritonBackend(interpret=True, tune_in_interpreter=True)
    backend.device_type = "cpu"
    return backend
