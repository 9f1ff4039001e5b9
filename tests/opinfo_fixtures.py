"""The pytest fixtures every OpInfo test file uses (import them by name into the file)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from opinfo_harness import CountingBackend, default_backend_name, quiet_trace_log, resolve_backend


@pytest.fixture(autouse=True)
def _quiet_torch_trace_log() -> Iterator[None]:
    """Keep torch's structured-trace records out of failure reports."""
    with quiet_trace_log():
        yield


@pytest.fixture(scope="module")
def counting_backend() -> CountingBackend:
    """The backend under test (``COIL_OPINFO_BACKEND``), wrapped to count graphs that reach it."""
    return CountingBackend(resolve_backend(default_backend_name()))
