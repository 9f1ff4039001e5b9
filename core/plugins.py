"""The plugin registry lives in the SDK, :mod:`coil.sdk.registry` (a plugin's tests look it
up there); ``coil.plugins`` and the core's modules reach it through this module."""
from .sdk.registry import *  # noqa: F401,F403
