"""A 0-d tensor operand of a float16/bfloat16 op: eager's CUDA kernels cast it to the result's
type first, eager's CPU kernels read it as a Python number (``core/zero_dim_operands.py``;
found on an H100, session 37). Here the C++ plugin declares the CUDA behaviour
(``Capabilities.zero_dim_operands_cast``) and Coil is checked against the graph computed with
the operand rounded first; without the capability, against eager."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import coil
from coil import plugins
from coil.zero_dim_operands import cast_zero_dim_operands

H = (torch.linspace(-30, 30, 33) + 0.37).to(torch.float16)
Z = 28.414979934692383

OPS = {
    "add": (lambda h, z: h + z, lambda h, z: h + z.to(h.dtype)),
    "sub": (lambda h, z: z - h, lambda h, z: z.to(h.dtype) - h),
    "mul": (lambda h, z: h * (z / 10), lambda h, z: h * (z / 10).to(h.dtype)),
    "div": (lambda h, z: h / z, lambda h, z: h / z.to(h.dtype)),
    "mean": (lambda h, z: h + z.expand(33).mean(), lambda h, z: h + z.expand(33).mean().to(h.dtype)),
    "addcmul": (lambda h, z: torch.addcmul(h, h, z), lambda h, z: torch.addcmul(h, h, z.to(h.dtype))),
    "int": (lambda h, z: h + (z * 100).long(), lambda h, z: h + (z * 100).long().to(h.dtype)),
}


@pytest.fixture
def casting_cpu():
    """The C++ plugin serving the CPU, declaring that its eager casts 0-d operands."""
    from coil_cpu_cpp.backend import CppBackend
    plugins.reset()
    backend = CppBackend()
    backend.capabilities = dataclasses.replace(backend.capabilities, zero_dim_operands_cast=True)
    coil.register_backend_for_device("cpu", backend, name="zero-dim-cast")
    try:
        yield backend
    finally:
        plugins.reset()


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_zero_dim_operand_is_cast_first_where_declared(casting_cpu, name, dtype):
    fn, rounded_first = OPS[name]
    h, z = H.to(dtype), torch.tensor(Z)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="coil")(h, z)
    want = rounded_first(h, z)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(OPS))
def test_without_the_capability_the_cpu_reads_it_as_eager(name):
    fn, rounded_first = OPS[name]
    torch._dynamo.reset()
    got = torch.compile(fn, backend="coil")(H, torch.tensor(Z))
    torch.testing.assert_close(got, fn(H, torch.tensor(Z)), rtol=0, atol=0)
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_cases_tell_the_two_readings_apart(dtype):
    """Each case gives another result with the operand rounded first than computed in float32
    (else the tests above could not fail)."""
    h, z = H.to(dtype), torch.tensor(Z)
    same = [name for name, (fn, first) in OPS.items()
            if torch.equal(fn(h.float(), z).to(dtype), first(h, z))]
    assert not same


def test_only_zero_dim_operands_of_the_same_device_and_another_type_are_cast():
    def fn(h, z, w, q):
        return h * z + h * w + torch.where(h > 0, h, z) + h * q

    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    with mode:
        args = (torch.empty(4, dtype=torch.float16), torch.empty(()), torch.empty(4),
                torch.empty((), dtype=torch.float16))
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn, tracing_mode="fake", pre_dispatch=False)(*args)
    # h * z: cast; h * w (float32 result, 1-d w): no; where: selects; h * q: already float16
    assert cast_zero_dim_operands(gm, lambda device: True) == 1
    assert cast_zero_dim_operands(gm, lambda device: True) == 0  # now float16
