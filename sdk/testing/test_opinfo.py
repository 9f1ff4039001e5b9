"""Tier ``opinfo`` (off by default: ``--coil-tiers=...,opinfo`` or ``--coil-opinfo``): PyTorch's
OpInfo samples, generated on the CPU, compiled by Coil on the device and compared with eager
on the CPU (outputs and mutated inputs). One test per OpInfo; ops come from
``--coil-opinfo-ops`` (names, or ``all``), default :data:`coil.sdk.testing.opinfo.DEFAULT_OPS`.
A failure listed in ``--coil-expected-failures`` is an xfail; an op none of whose samples
reached Coil is skipped, never passed."""
from __future__ import annotations

import pytest

from coil.sdk import host
from coil.sdk.testing.kit import Kit
from coil.sdk.testing.opinfo import DEFAULT_OPS, CountingBackend, run_op
from coil.sdk.testing.opinfo_db import eligible_ops, find_ops
from coil.sdk.testing.plugin import OPINFO_FAILURE_PROPERTY, KitOptions, options_of

pytestmark = pytest.mark.coil_tier("opinfo")


def _op_names(opts: KitOptions) -> list[str]:
    text = opts.opinfo_ops.strip()
    if "opinfo" not in opts.tiers or not text:  # deselected: do not load op_db (seconds)
        return list(DEFAULT_OPS)
    if text == "all":
        return [op.full_name for op in eligible_ops()]
    try:
        ops = find_ops([n.strip() for n in text.split(",") if n.strip()])
    except KeyError as exc:
        raise pytest.UsageError(f"--coil-opinfo-ops: {exc.args[0]}") from None
    return [op.full_name for op in ops]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "opinfo_op" in metafunc.fixturenames:
        metafunc.parametrize("opinfo_op", _op_names(options_of(metafunc.config)))


def test_opinfo(coil_kit: Kit, opinfo_op: str, request: pytest.FixtureRequest) -> None:
    (op,) = [o for o in find_ops([opinfo_op], include_skipped=True) if o.full_name == opinfo_op]
    opts = options_of(request.config)
    records = run_op(op, CountingBackend(host.current().compile_fx), num_samples=opts.opinfo_samples,
                     timeout_s=opts.opinfo_timeout, device=str(coil_kit.device))
    failures = [r for r in records if r.status.failed]
    if failures:
        first = failures[0]
        request.node.user_properties.append(
            (OPINFO_FAILURE_PROPERTY, f"{first.status.value} (sample {first.sample_index}): {first.reason}"))
        lines = [f"{opinfo_op} on {coil_kit.device.type} disagrees with eager:"]
        lines += [f"  sample {r.sample_index}: {r.status.value}: {r.reason}\n    {r.sample}" for r in failures]
        pytest.fail("\n".join(lines), pytrace=False)
    compared = [r for r in records if r.status.compared]
    if not compared:
        reasons = "; ".join(f"{r.status.value}: {r.reason}" for r in records) or "no samples"
        pytest.skip(f"no sample could be compared ({reasons})")
    if not any(r.reached_backend for r in compared):
        pytest.skip(f"no sample reached Coil (Dynamo ran it eagerly: {compared[0].reason})")
