"""Long fuzzing runs from the command line, that survive a kernel crashing the process.

    python -m tests.fuzz.runner --examples 2000 --seed 7 --out /tmp/fuzz-repros
    python -m tests.fuzz.runner --minimize /tmp/fuzz-repros/fuzz-mismatch-grad-s7-12.py

A supervisor runs the programs in a worker process, which writes a journal (one JSON line as
each program starts and one with its result). When the worker dies inside a check (a
generated kernel that faults takes the interpreter with it), the supervisor saves the program
in flight as a ``fuzz-crash-...`` repro script and starts a new worker, on the next seed, for
the programs left. Every failure is saved, minimised (the first few of each kind), as a
standalone script; the summary gives counts by outcome and op family, and the fallbacks and
library calls the programs reached."""
from __future__ import annotations

import argparse
import collections
import json
import logging
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ops import FAMILIES
from .programs import Program, programs
from .repro import load_program, save
from .runner import Outcome, check, minimize, pytorch_fails_too

log = logging.getLogger(__name__)

#: Hypothesis draws near-copies of a failing program; only the first few of a kind are minimised.
MINIMIZE_PER_KIND = 3
#: A worker that keeps dying is given up on after this many restarts.
MAX_RESTARTS = 20


def failure_key(outcome: Outcome) -> str:
    """A file-name-safe class name: status, phase, and the error type."""
    words = ["pytorch"] if outcome.origin.startswith("pytorch") else []
    words += [outcome.status, outcome.phase]
    if outcome.status == "error":
        words.append(outcome.detail.split(":", 1)[0])
    return re.sub(r"[^A-Za-z0-9]+", "-", "-".join(w for w in words if w)).strip("-").lower()


def record(program: Program, outcome: Outcome) -> dict[str, Any]:
    """What the summary needs to know of one checked program (a journal line)."""
    return {"status": outcome.status, "phase": outcome.phase,
            "detail": outcome.detail.split(":", 1)[0][:40],
            "families": program.families(),
            "kernels": sum(len(g.kernels) for g in outcome.graphs),
            "fallbacks": [op for g in outcome.graphs for op in g.fallback_ops],
            "library": [op for g in outcome.graphs for op in g.library_ops]}


def _counts(ops: collections.Counter) -> str:
    """``aten.sort.default`` -> ``sort``, with counts, most common first."""
    return ", ".join(f"{(k.split('.') + [k])[1] if k.startswith('aten.') else k} {v}"
                     for k, v in ops.most_common())


@dataclass
class Tally:
    statuses: collections.Counter = field(default_factory=collections.Counter)
    families: collections.Counter = field(default_factory=collections.Counter)
    fallbacks: collections.Counter = field(default_factory=collections.Counter)
    library: collections.Counter = field(default_factory=collections.Counter)
    skips: collections.Counter = field(default_factory=collections.Counter)
    kernels: int = 0
    classes: dict[str, list[str]] = field(default_factory=dict)

    def add(self, program: Program, outcome: Outcome) -> None:
        self.add_record(record(program, outcome))

    def add_record(self, rec: dict[str, Any]) -> None:
        self.statuses[rec["status"]] += 1
        if "key" in rec:
            self.classes.setdefault(rec["key"], []).append(rec["path"])
        if rec["status"] == "skip":
            self.skips[f"{rec['phase']}: {rec['detail']}"] += 1
            return
        self.families.update(rec["families"])
        self.kernels += rec["kernels"]
        self.fallbacks.update(rec["fallbacks"])
        self.library.update(rec["library"])

    def summary(self, seconds: float) -> str:
        lines = [f"programs: {sum(self.statuses.values())} in {seconds:.0f} s — "
                 + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())),
                 "steps by family (programs that ran): "
                 + ", ".join(f"{k} {v}" for k, v in self.families.most_common()),
                 "skipped (eager raised, or ill-conditioned): "
                 + ", ".join(f"{k} {v}" for k, v in self.skips.most_common(6)),
                 f"Coil kernels compiled: {self.kernels}",
                 "fallbacks reached: " + _counts(self.fallbacks),
                 "library calls reached: " + _counts(self.library)]
        for key, paths in sorted(self.classes.items()):
            lines.append(f"failure class {key}: {len(paths)} program(s), e.g. {paths[0]}")
        return "\n".join(lines)


# -- the worker -------------------------------------------------------------------------------

def _journal(path: Path, event: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(event) + "\n")


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _robust_programs(args: argparse.Namespace):
    """`programs`, but a generator crash drops the example instead of ending the run."""
    from hypothesis import reject, strategies as st

    @st.composite
    def draw_program(draw):
        try:
            return draw(programs(max_steps=args.max_steps, families=args.family_tuple,
                                 allow_dynamic=not args.static))
        except Exception:  # noqa: BLE001 - logged, and the run goes on
            log.exception("the program generator crashed; example dropped")
            reject()

    return draw_program()


def _report_failure(program: Program, outcome: Outcome, args: argparse.Namespace, n: int,
                    seen: collections.Counter) -> dict[str, Any]:
    if pytorch_fails_too(program, outcome):
        outcome.origin = "pytorch: aot_eager fails too"
    print(f"[{n}] {outcome}", flush=True)
    key = failure_key(outcome)
    kind = (key, program.dynamic, tuple(sorted(set(program.families()))),
            tuple(i.layout for i in program.inputs))
    seen[kind] += 1
    if not args.no_minimize and seen[kind] <= MINIMIZE_PER_KIND:
        program = minimize(program, outcome)
    path = save(program, str(outcome), args.out / f"fuzz-{key}-s{args.seed}-{n}.py")
    print(f"    saved {path}:\n{program!r}", flush=True)
    return {"key": key, "path": str(path)}


def work(args: argparse.Namespace, journal: Path) -> None:
    """Check ``args.examples`` programs drawn with ``args.seed``, journaling each."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    done, start = args.offset, time.time()
    seen: collections.Counter = collections.Counter()

    @hypothesis_seed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(_robust_programs(args))
    def one(program: Program) -> None:
        nonlocal done
        _journal(journal, {"event": "start", "program": program.to_json()})
        outcome = check(program)
        done += 1
        rec = record(program, outcome)
        if outcome.failed:
            rec.update(_report_failure(program, outcome, args, done, seen))
        _journal(journal, {"event": "done", **rec})
        if done % 25 == 0:
            print(f"[{done}] {time.time() - start:.0f} s", flush=True)

    one()


# -- the supervisor -----------------------------------------------------------------------------

def _worker_command(args: argparse.Namespace, journal: Path, seed: int, examples: int,
                    offset: int) -> list[str]:
    return [sys.executable, "-m", f"{__package__}.campaign", "--worker", str(journal), "--seed", str(seed),
            "--examples", str(examples), "--offset", str(offset), "--out", str(args.out),
            "--max-steps", str(args.max_steps), "--families", args.families,
            *(["--no-minimize"] if args.no_minimize else []), *(["--static"] if args.static else [])]


def supervise(args: argparse.Namespace) -> Tally:
    """Run workers until ``args.examples`` programs are checked; save crashes as repros."""
    args.out.mkdir(parents=True, exist_ok=True)
    journal = args.out / f"journal-s{args.seed}.jsonl"
    journal.unlink(missing_ok=True)
    seed, start = args.seed, time.time()
    for _ in range(MAX_RESTARTS + 1):
        done = sum(1 for e in _events(journal) if e["event"] == "done")
        if done >= args.examples:
            break
        proc = subprocess.run(_worker_command(args, journal, seed, args.examples - done, done), check=False)
        events = _events(journal)
        if events and events[-1]["event"] == "start":
            program = Program.from_json(events[-1]["program"])
            n = sum(1 for e in events if e["event"] == "done") + 1
            rc = proc.returncode
            key = f"crash-signal-{-rc}" if rc < 0 else f"crash-exit-{rc}"
            path = save(program, f"the process died (exit status {proc.returncode}) while checking it",
                        args.out / f"fuzz-{key}-s{seed}-{n}.py")
            print(f"[{n}] worker died (exit status {proc.returncode}); saved {path}:\n{program!r}", flush=True)
            _journal(journal, {"event": "done", "status": "crash", "phase": "", "detail": "",
                               "families": program.families(), "kernels": 0, "fallbacks": [],
                               "library": [], "key": key, "path": str(path)})
        elif proc.returncode == 0:
            break
        seed += 1
    tally = Tally()
    for event in _events(journal):
        if event["event"] == "done":
            tally.add_record(event)
    print(tally.summary(time.time() - start))
    return tally


def reminimize(path: Path, out: Path) -> int:
    """Check the program a repro script holds again, minimise it, and save the result."""
    program = load_program(path)
    outcome = check(program)
    print(f"{path}: {outcome}")
    if not outcome.failed:
        return 0
    if pytorch_fails_too(program, outcome):
        outcome.origin = "pytorch: aot_eager fails too"
    small = minimize(program, outcome, max_trials=200)
    saved = save(small, str(outcome), out / f"{path.stem}-min.py")
    print(f"saved {saved}:\n{small!r}")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.runner",
                                     description="Fuzz Coil with random programs against eager.")
    parser.add_argument("--examples", type=int, default=200, help="programs to run (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-repros"),
                        help="where failing programs are saved as repro scripts, and the journal")
    parser.add_argument("--max-steps", type=int, default=10, help="steps per program (default 10)")
    parser.add_argument("--families", default="",
                        help=f"comma-separated op families to draw from (default: all of {', '.join(FAMILIES)})")
    parser.add_argument("--no-minimize", action="store_true", help="save failures as drawn")
    parser.add_argument("--static", action="store_true",
                        help="no dynamic=True programs (their bugs may crowd out the others)")
    parser.add_argument("--minimize", type=Path, metavar="REPRO",
                        help="re-check and minimise the program of a saved repro script, then stop")
    parser.add_argument("--worker", type=Path, metavar="JOURNAL", help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    args.family_tuple = tuple(f for f in args.families.split(",") if f) or None
    unknown = set(args.family_tuple or ()) - set(FAMILIES)
    if unknown:
        parser.error(f"unknown op families {sorted(unknown)}; choose from {', '.join(FAMILIES)}")
    if args.minimize:
        return reminimize(args.minimize, args.out)
    if args.worker:
        work(args, args.worker)
        return 0
    tally = supervise(args)
    return 1 if any(tally.statuses[s] for s in ("mismatch", "error", "crash")) else 0


if __name__ == "__main__":
    sys.exit(main())
