"""``bench/cpu.py``'s memory-bandwidth reference (``bench/bandwidth.py``) and its "% of
bandwidth" column: the sysfs cache size read right, a small measurement that gives sane
numbers, and a short eager-only run whose markdown and JSON carry each bandwidth-bound row's
GB/s as a share of the measured bandwidth (or none with ``--no-bandwidth``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

import helpers

BENCH = Path(__file__).resolve().parent.parent / "bench"
SMALL = 8 << 20  # bytes per tensor in the tests' measurements: quick, not meaningful


@pytest.fixture(scope="module")
def cpu() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))  # after tests/, whose models package bench/models.py would shadow
    return helpers.load_bench("cpu")


@pytest.fixture(scope="module")
def bandwidth(cpu) -> ModuleType:
    return sys.modules["bandwidth"]


def test_cache_size_parsing(bandwidth):
    assert bandwidth.parse_cache_size("32768K\n") == 32 << 20
    assert bandwidth.parse_cache_size("96M") == 96 << 20
    assert bandwidth.parse_cache_size("1G") == 1 << 30
    assert bandwidth.parse_cache_size("4096") == 4096
    size, source = bandwidth.last_level_cache()
    assert size > 0 and source


def test_measurement_reports_read_copy_and_the_better_one(bandwidth):
    bw = bandwidth.measure(repeat=3, tensor_bytes=SMALL)
    assert bw.read_gbps > 0 and bw.copy_gbps > 0
    assert bw.reference_gbps == max(bw.read_gbps, bw.copy_gbps)
    assert bw.tensor_bytes == SMALL and bw.repeat == 3
    assert json.loads(json.dumps(bw.as_json()))["reference_kernel"] in ("read", "copy")


def test_matmul_bound_workloads_get_no_share(cpu, bandwidth):
    bw = bandwidth.Bandwidth(read_gbps=10.0, copy_gbps=20.0, tensor_bytes=SMALL, cache_bytes=SMALL,
                             cache_source="test", threads=1, repeat=1)
    for name, share in (("sum_last", 0.5), ("gpt_block", None)):
        res = cpu.Result(name, "eager", gbps=10.0)
        assert cpu.share_of_bandwidth(cpu.WorkloadInfo(cpu.WORKLOADS[name]), res, bw) == share
    assert cpu.share_of_bandwidth(cpu.WorkloadInfo(cpu.WORKLOADS["sum_last"]), res, None) is None


@pytest.mark.parametrize("measured", [True, False])
def test_run_reports_share_of_measured_bandwidth(cpu, bandwidth, monkeypatch, tmp_path, capsys, measured):
    monkeypatch.setattr(cpu, "measure_bandwidth", lambda: bandwidth.measure(repeat=3, tensor_bytes=SMALL))
    out = tmp_path / "run.json"
    cpu.main(["--backends", "eager", "--workloads", "sum_last", "--repeat", "1", "--json-out", str(out),
              *([] if measured else ["--no-bandwidth"])])
    report, data = capsys.readouterr().out, json.loads(out.read_text())
    row = data["workloads"][0]["results"]["eager"]
    assert "## Share of the memory bandwidth measured in this run" in report
    if not measured:
        assert data["bandwidth"] is None and row["pct_of_bandwidth"] is None
        assert "not measured (`--no-bandwidth`)" in report
        return
    reference = data["bandwidth"]["reference_gbps"]
    assert row["pct_of_bandwidth"] == pytest.approx(row["gbps"] / reference * 100)
    assert "| workload | ideal MiB | eager % of bandwidth |" in report
    assert f"| sum_last | 24.0 | {row['pct_of_bandwidth']:.0f} |" in report
