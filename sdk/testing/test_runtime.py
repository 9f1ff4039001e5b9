"""Tier ``runtime``: the device's backend is registered and healthy, a trivial compiled
function runs on the device and matches eager, and a second call reuses the compiled code."""
from __future__ import annotations

import pytest
import torch

from coil.sdk import Capabilities, DeviceBackend, registry
from coil.sdk.errors import NoBackendError
from coil.sdk.testing.kit import CountingCompiler, Kit
from coil.sdk.testing.plugin import options_of

pytestmark = pytest.mark.coil_tier("runtime")


def test_backend_is_registered(request: pytest.FixtureRequest) -> None:
    device_type = options_of(request.config).device_type
    reg = registry.registry()
    assert device_type in reg.backends, (
        f"no backend serves {device_type!r}; served: {sorted(reg.backends)}; plugins that failed "
        f"to load: {[str(e) for e in reg.errors] or 'none'}")
    backend = reg.backend_for(device_type)
    assert isinstance(backend, DeviceBackend), f"{backend!r} is not a coil.sdk.DeviceBackend"
    assert backend.device_type == device_type
    assert isinstance(backend.capabilities, Capabilities), "backend.capabilities must be a Capabilities"


def test_doctor_checks_pass(coil_kit: Kit) -> None:
    checks = coil_kit.backend.doctor()
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    assert not failed, "backend.doctor() reports failing checks:\n  " + "\n  ".join(failed)


def test_synchronize_after_a_copy(coil_kit: Kit) -> None:
    x = torch.arange(1000, dtype=torch.float32)
    on_device = coil_kit.to_device(x)
    coil_kit.backend.synchronize()
    assert on_device.device.type == coil_kit.device.type
    torch.testing.assert_close(on_device.cpu(), x)


def test_trivial_function_is_one_kernel(coil_kit: Kit) -> None:
    report = coil_kit.check(lambda x: x + 1, torch.randn(17))
    coil_kit.assert_kernels(report, count=1)
    coil_kit.assert_no_fallbacks(report)


def test_second_call_reuses_compiled_code(coil_kit: Kit) -> None:
    counter = CountingCompiler()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, y: x * y - 1, backend=counter, dynamic=False)
    for _ in range(3):  # fresh values each call: a stale cached result would not match
        x, y = torch.randn(8, 5), torch.randn(8, 5)
        coil_kit.assert_close(compiled(*coil_kit.to_device((x, y))), x * y - 1)
    assert counter.calls == 1, f"Dynamo compiled {counter.calls} times for one shape"


def test_outputs_feed_the_next_call(coil_kit: Kit) -> None:
    """Device outputs (allocated by Coil's wrapper) are valid inputs of the next call."""
    compiled = coil_kit.compile(lambda x: torch.tanh(x) * 2)
    x = torch.randn(4, 6)
    out = compiled(compiled(coil_kit.to_device(x)))
    coil_kit.assert_on_device(out)
    coil_kit.assert_close(out, torch.tanh(torch.tanh(x) * 2) * 2)


def test_unknown_device_error_names_the_served_devices(coil_kit: Kit) -> None:
    with pytest.raises(NoBackendError) as info:
        registry.registry().backend_for("coil_conformance_no_such_device")
    message = str(info.value)
    assert "coil_conformance_no_such_device" in message and coil_kit.device.type in message
    assert "register_backend_for_device" in message
