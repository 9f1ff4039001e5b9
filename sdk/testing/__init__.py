"""``coil.sdk.testing``: the conformance kit a plugin author runs against a device.

``pytest --pyargs coil.sdk.testing --coil-device=NAME`` runs the kit's tiers (see
:mod:`coil.sdk.testing.tiers`) against the backend serving ``NAME``; ``coil conformance NAME``
runs the same and prints a scorecard. Every check runs the compiled function on the device and
compares it with eager on the CPU. The pytest options come from :mod:`coil.sdk.testing.plugin`
(a ``pytest11`` plugin); the shared checks from :mod:`coil.sdk.testing.kit`. See
``docs/conformance.md``."""
from __future__ import annotations

from .tiers import DEFAULT_TIERS, TIERS

__all__ = ["TIERS", "DEFAULT_TIERS"]
