"""Standalone repro scripts for fuzzer failures: the program's ``make_inputs``/``program``, the
harness's source pasted in, and a call to its ``main``. A script needs only torch and an
installed Coil: ``python repro.py`` prints every compared tensor's difference and exits 1 on a
mismatch. Its last line holds the program as JSON, for ``--minimize``."""
from __future__ import annotations

import inspect
from pathlib import Path

from . import harness
from .programs import Program

MARKER = "# fuzz-program: "


def script(program: Program, title: str) -> str:
    """The text of a repro script for ``program``; ``title`` (the failure) goes in its
    docstring. The program comes first, then the harness that runs and compares it."""
    body = inspect.getsource(harness).split("\n\n\nif __name__", 1)[0]
    body = body.split('"""', 2)[2]  # drop the module docstring, keep the code
    body = body.replace("from __future__ import annotations\n", "").strip("\n")
    mode = ("forward and backward" if program.backward else "forward only") + (
        ", dynamic=True" if program.dynamic else "")
    return "\n".join([
        f'"""Coil fuzzer repro ({mode}): {title.split("; ")[0]}',
        "",
        "Found by tests/fuzz. `python this.py` runs the program eagerly and twice through",
        'torch.compile(backend="coil") and compares outputs, inputs after the call and',
        "gradients; `python this.py aot_eager` checks PyTorch's own compile stack instead.",
        '"""',
        "from __future__ import annotations",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "",
        "",
        program.to_source().rstrip(),
        "",
        "",
        "# -- the fuzzer's harness (tests/fuzz/harness.py) " + "-" * 40,
        "",
        body,
        "",
        "",
        'if __name__ == "__main__":',
        f"    sys.exit(main(program, make_inputs, backward={program.backward}, "
        f"precision=torch.{program.precision},",
        f"                  backend=(sys.argv[1:] or ['coil'])[0], dynamic={program.dynamic}))",
        "",
        f"{MARKER}{program.to_json()}",
        "",
    ])


def load_program(path: Path) -> Program:
    """The program a repro script was written for (``python -m tests.fuzz.runner --minimize``)."""
    for line in path.read_text().splitlines():
        if line.startswith(MARKER):
            return Program.from_json(line[len(MARKER):])
    raise ValueError(f"{path} has no '{MARKER.strip()}' line: was it written by tests/fuzz/repro.py?")


def save(program: Program, title: str, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script(program, title))
    return path
