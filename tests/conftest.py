"""Shared fixtures: a per-session Coil cache directory and fresh Dynamo state per test."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch

os.environ.setdefault("COIL_CACHE_DIR", tempfile.mkdtemp(prefix="coil-test-cache-"))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
