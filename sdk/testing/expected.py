"""A plugin's expected-failures file for the opinfo tier: one OpInfo full name a line, with
an optional ``# reason``; blank lines and ``#`` lines are comments. An expected failure that
fails is reported as xfailed, one that passes as XPASS (listed at the end of the run), a
failure not in the file fails the run. ``--coil-update-expected-failures`` rewrites the file
from the run's results (entries for ops the run did not test are kept)."""
from __future__ import annotations

from pathlib import Path

HEADER = """\
# Coil conformance kit: OpInfo ops expected to fail on device {device!r}.
# One OpInfo full name a line, then '# reason'. Regenerate with
#   pytest --pyargs coil.sdk.testing --coil-device={device} --coil-tiers=opinfo \\
#       --coil-expected-failures=FILE --coil-update-expected-failures
"""


def read(path: str | Path) -> dict[str, str]:
    """Op name -> reason (empty when none given); a missing file is an empty one."""
    path = Path(path)
    if not path.exists():
        return {}
    entries: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition("#")
        entries[name.strip()] = reason.strip()
    return entries


def updated(old: dict[str, str], failing: dict[str, str], tested: set[str]) -> dict[str, str]:
    """The new contents: ops tested now are in it exactly when they failed (with the new
    reason); entries for ops not tested in this run stay as they were."""
    kept = {op: reason for op, reason in old.items() if op not in tested}
    return dict(sorted({**kept, **failing}.items()))


def write(path: str | Path, entries: dict[str, str], device: str) -> None:
    lines = [HEADER.format(device=device)]
    for op, reason in sorted(entries.items()):
        reason = " ".join(reason.split())
        lines.append(f"{op}  # {reason}\n" if reason else f"{op}\n")
    Path(path).write_text("".join(lines))
