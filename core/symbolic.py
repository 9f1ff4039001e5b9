"""Index expressions (floor division, modulo, loop variables, printers) live in the SDK,
:mod:`coil.sdk.symbolic`; the core's modules import them from here."""
from .sdk.symbolic import *  # noqa: F401,F403
