"""The plugin's size yardstick: non-blank, non-comment Python lines of ``coil_emu_chip`` (the
device emulation, ``torch_emu``, and the tests are not counted). Docstrings count as comments,
as cloc counts them; ``--with-docstrings`` counts them as code.

    python examples/emu_chip/count_lines.py [--with-docstrings]
"""
from __future__ import annotations

import argparse
import io
import tokenize
from pathlib import Path

PLUGIN = Path(__file__).with_name("coil_emu_chip")
_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENCODING, tokenize.ENDMARKER}


def code_lines(path: Path, docstrings: bool = False) -> int:
    """Lines of ``path`` that hold a token other than layout and comments."""
    lines: set[int] = set()
    previous = tokenize.NEWLINE
    for tok in tokenize.tokenize(io.BytesIO(path.read_bytes()).readline):
        is_docstring = tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT,
                                                                    tokenize.DEDENT, tokenize.ENCODING)
        if tok.type not in _LAYOUT and (docstrings or not is_docstring):
            lines.update(range(tok.start[0], tok.end[0] + 1))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    return len(lines)


def count(docstrings: bool = False) -> dict[str, int]:
    return {p.name: code_lines(p, docstrings) for p in sorted(PLUGIN.glob("*.py"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--with-docstrings", action="store_true")
    per_file = count(docstrings=parser.parse_args().with_docstrings)
    for name, n in per_file.items():
        print(f"{n:5d}  {name}")
    print(f"{sum(per_file.values()):5d}  total")


if __name__ == "__main__":
    main()
