"""The kernel IR (values, nodes, buffers and layouts) lives in the SDK, :mod:`coil.sdk.ir`:
plugins read it there, and the core's modules import it from here."""
from .sdk.ir import *  # noqa: F401,F403
from .sdk.ir import _flatten  # noqa: F401
