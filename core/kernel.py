"""Kernels, their loops and nodes live in the SDK, :mod:`coil.sdk.kernel`; the core's modules
import them from here."""
from .sdk.kernel import *  # noqa: F401,F403
