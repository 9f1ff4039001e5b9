"""Coil's errors live in the SDK, :mod:`coil.sdk.errors` (plugins raise some of them); the
core's modules import them from here."""
from .sdk.errors import *  # noqa: F401,F403
