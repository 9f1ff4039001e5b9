"""The pointwise op catalogue lives in the SDK, :mod:`coil.sdk.ops`; the core's modules import
it from here."""
from .sdk.ops import *  # noqa: F401,F403
