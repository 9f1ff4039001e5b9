"""Coil's configuration lives in the SDK, :mod:`coil.sdk.config` (the knobs in
:mod:`coil.sdk.knobs`), where plugins and the SDK's caches read it; ``coil.config`` and the
core's modules reach it through this module."""
from .sdk.config import *  # noqa: F401,F403
