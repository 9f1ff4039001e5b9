"""``coil conformance NAME``: run the conformance kit in-process (``pytest.main``) against the
device ``NAME`` and print a scorecard: per tier, how many tests passed, failed, were skipped
(with the capability that is missing) or were expected failures, and an overall verdict. The
exit status is 0 when nothing failed, 1 when a test failed, pytest's own status when pytest
could not run the kit (a usage error, say)."""
from __future__ import annotations

import argparse
import collections
import dataclasses
import shlex
import time
from typing import Any

from coil.sdk import registry

from .tiers import TIERS, parse_tiers

HELP = "run the conformance kit against a device and print a scorecard"
#: The kit's pytest11 plugin name (``-p`` loads it even with plugin autoloading off).
PLUGIN_NAME = "coil_conformance"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("device", metavar="NAME", help="device type under test")
    parser.add_argument("--backend", metavar="MODULE:FACTORY",
                        help="serve NAME with FACTORY() for the run (coil.register_backend_for_device)")
    parser.add_argument("--tiers", metavar="T1,T2",
                        help=f"tiers to run (default: all but opinfo); known: {', '.join(TIERS)}")
    parser.add_argument("--opinfo", action="store_true", help="add the opinfo tier")
    parser.add_argument("--opinfo-ops", metavar="OPS", help="OpInfo names for the opinfo tier, or 'all'")
    parser.add_argument("--opinfo-samples", metavar="N", type=int, help="samples per OpInfo (default 2)")
    parser.add_argument("--expected-failures", metavar="FILE", help="the plugin's expected opinfo failures")
    parser.add_argument("--update-expected-failures", action="store_true",
                        help="rewrite --expected-failures from this run")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per test")
    parser.add_argument("--pytest-args", default="", metavar="ARGS",
                        help="more pytest arguments, one string: --pytest-args='-x -k softmax'")


def pytest_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--pyargs", "coil.sdk.testing", "-p", PLUGIN_NAME, "-p", "no:cacheprovider",
            f"--coil-device={args.device}", "-v" if args.verbose else "-q", "--tb=short"]
    for flag, value in (("--coil-backend", args.backend), ("--coil-tiers", args.tiers),
                        ("--coil-opinfo-ops", args.opinfo_ops),
                        ("--coil-expected-failures", args.expected_failures)):
        if value:
            argv.append(f"{flag}={value}")
    if args.opinfo_samples is not None:
        argv.append(f"--coil-opinfo-samples={args.opinfo_samples}")
    if args.opinfo:
        argv.append("--coil-opinfo")
    if args.update_expected_failures:
        argv.append("--coil-update-expected-failures")
    return argv + shlex.split(args.pytest_args)


@dataclasses.dataclass
class TierScore:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    xpassed: int = 0
    skip_reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def ran(self) -> int:
        return self.passed + self.failed + self.xfailed + self.xpassed

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAIL"
        if self.ran:
            return "PASS"
        return "SKIPPED" if self.skipped else "NOT RUN"


class ScoreCollector:
    """A pytest plugin: the final outcome of every kit test, by tier."""

    def __init__(self) -> None:
        self.outcomes: dict[str, tuple[str, str, str]] = {}  # nodeid -> (tier, outcome, reason)
        self.backend_name = ""

    def pytest_sessionstart(self, session: Any) -> None:
        from .plugin import options_of
        backend = registry.registry().backends.get(options_of(session.config).device_type)
        if backend is not None:
            self.backend_name = getattr(backend, "name", "") or type(backend).__name__

    def pytest_runtest_logreport(self, report: Any) -> None:
        tier = dict(report.user_properties).get("coil_tier")
        if tier is None:
            return
        outcome = _outcome(report)
        if outcome is None:
            return
        if report.when == "teardown" and report.nodeid in self.outcomes and outcome[0] != "failed":
            return
        self.outcomes[report.nodeid] = (tier, *outcome)

    def scores(self, tiers: tuple[str, ...]) -> dict[str, TierScore]:
        table = {tier: TierScore() for tier in tiers}
        for tier, outcome, reason in self.outcomes.values():
            score = table.setdefault(tier, TierScore())
            setattr(score, outcome, getattr(score, outcome) + 1)
            if outcome == "skipped":
                score.skip_reasons[reason.removeprefix(f"tier {tier}: ")] += 1
        return table


def _outcome(report: Any) -> tuple[str, str] | None:
    """(outcome, reason) of one phase's report; None for a passing setup or teardown."""
    if hasattr(report, "wasxfail"):
        return ("xpassed", "") if report.passed else ("xfailed", report.wasxfail)
    if report.failed:
        return "failed", ""
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        return "skipped", reason.removeprefix("Skipped: ")
    return ("passed", "") if report.when == "call" else None


def format_scorecard(scores: dict[str, TierScore], device: str, backend: str, seconds: float) -> str:
    lines = [f"Coil conformance scorecard: device {device!r}, backend {backend or '(none)'}", "",
             f"  {'tier':<16}{'passed':>7}{'failed':>7}{'skipped':>8}{'xfail':>6}  verdict"]
    for tier, s in scores.items():
        note = ""
        if s.skip_reasons:
            reason, _ = s.skip_reasons.most_common(1)[0]
            note = f": {reason}" if s.verdict == "SKIPPED" else f" ({s.skipped} skipped: {reason}...)"
        lines.append(f"  {tier:<16}{s.passed:>7}{s.failed:>7}{s.skipped:>8}{s.xfailed:>6}  {s.verdict}{note}")
    failed = [t for t, s in scores.items() if s.verdict == "FAIL"]
    skipped = [t for t, s in scores.items() if s.verdict == "SKIPPED"]
    passed = [t for t, s in scores.items() if s.verdict == "PASS"]
    if failed:
        verdict = f"NOT CONFORMANT: {', '.join(failed)} failed"
    elif passed:
        verdict = f"CONFORMANT: {len(passed)} tier(s) passed"
    else:
        verdict = "NO VERDICT: no tier ran"
    if skipped:
        verdict += f"; skipped (capabilities): {', '.join(skipped)}"
    return "\n".join(lines + ["", f"overall: {verdict} ({seconds:.1f} s)"])


def run(args: argparse.Namespace) -> int:
    import pytest  # optional: only the `coil conformance` run needs it

    try:
        tiers = parse_tiers(args.tiers, opinfo=args.opinfo)
    except ValueError as exc:
        print(f"coil conformance: {exc}")
        return 2
    collector = ScoreCollector()
    start = time.perf_counter()
    status = int(pytest.main(pytest_argv(args), plugins=[collector]))
    scores = collector.scores(tiers)
    print()
    print(format_scorecard(scores, args.device, collector.backend_name, time.perf_counter() - start))
    if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        print(f"coil conformance: pytest could not run the kit (exit status {status})")
        return status
    return 1 if any(s.verdict == "FAIL" for s in scores.values()) else 0
