"""The plugin contract: every hook a Coil plugin may implement. Each hook is a typed stub
whose docstring is the contract."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .backend import DeviceBackend

hookspec = pluggy.HookspecMarker("coil")
hookimpl = pluggy.HookimplMarker("coil")


@hookspec
def coil_api_version() -> str:
    """The ``coil.sdk`` API version the plugin was written for (``coil.sdk.API_VERSION`` at
    the time). A plugin whose major version differs from Coil's, or whose minor version is
    newer, is skipped and reported with what changed (policy: :mod:`coil.sdk.versions`)."""


@hookspec
def coil_device_backends() -> "list[DeviceBackend]":
    """Device backends this plugin provides, one per device type (``backend.device_type``).
    A backend registered later for the same device type (or by
    ``coil.register_backend_for_device``) overrides an earlier one."""


@hookspec
def coil_lowerings() -> "list[tuple[Any, Any, str | None]]":
    """Extra or overriding lowerings: ``(aten_overload, fn, device_type_or_None)``. ``fn`` has
    the signature of Coil's lowering functions, ``fn(ctx, *args, **kwargs)``; a device-specific
    entry beats the generic one for that device."""


@hookspec
def coil_graph_passes() -> "list[Any]":
    """FX passes ``fn(gm: torch.fx.GraphModule) -> None`` run on every ATen graph before
    lowering (pattern rewrites, for example)."""


@hookspec
def coil_templates() -> "list[Any]":
    """Matrix-product templates (:class:`coil.sdk.templates.Template`) for every device whose
    backend speaks their dialect (``Capabilities.template_dialects``): a capability plugin
    adds GEMM kernels with fused epilogues to devices other plugins serve (SDK 0.9.0)."""
