"""``coil_template_gemm``: matrix-product templates (GEMM) with fused epilogues, as a
capability plugin. It serves no device of its own: through the ``coil_templates`` hook it
adds a Triton template and a C++ template to every backend that speaks their dialect
(``Capabilities.template_dialects``: the Triton plugin for ``"triton"``, the C++ plugin for
``"cpp"``), which embed them and write the epilogue the scheduler fused after them. Whether a
product runs as the template or as the device's library is measured per shape where the
backend tunes, else chosen by :meth:`Template.prefer`."""
from __future__ import annotations

from coil.sdk import hookimpl

#: The coil.sdk API this plugin is written for: 1.0.0, the first stable SDK (it uses the
#: coil_templates hook and coil.sdk.templates, 0.9.0, and the SDK's own kernel IR).
API_VERSION = "1.0.0"


@hookimpl
def coil_api_version() -> str:
    return API_VERSION


@hookimpl
def coil_templates() -> list:
    from .cpp_gemm import CppGemm
    from .triton_gemm import TritonGemm
    return [TritonGemm(), CppGemm()]
