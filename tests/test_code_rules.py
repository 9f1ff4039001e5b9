"""The rules of Coil's style guide ("Habits for this project") that a test can check, run in
CI like any other test.

* No Python module under ``core/``, ``sdk/``, ``plugins/``, ``bench/`` or ``tests/`` is over
  :data:`MAX_LINES` lines: a module that long holds more than one idea and is split along a
  real seam (workloads apart from the runner, helpers grouped by what they compute).
* No plugin module (:data:`PLUGIN_DIRS`) uses a private (``_``-prefixed) member of another
  object or module of ours: ``w._emit(...)`` from a strategy, ``from .codegen import
  _indices``. A module that needs one gets a public, documented method instead (the Triton
  writer's interface to its strategies, ``coil_cuda_triton.strategy.Writer``), so each
  class can change its insides without breaking its neighbours. Allowed: ``self._x``,
  ``cls._x``, ``super()._x`` (a class and its subclasses are one design), a module's own
  ``_names``, and the private members of :data:`FOREIGN_PRIVATES_OK` packages and
  :data:`PRIVATE_NAMES_OK`, each with its reason."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED_DIRS = ("core", "sdk", "plugins", "bench", "tests")
MAX_LINES = 600


def _python_modules() -> list[Path]:
    return sorted(path for folder in CHECKED_DIRS for path in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in path.parts)


def _line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def test_modules_are_at_most_600_lines():
    modules = _python_modules()
    assert modules, f"no Python modules found under {ROOT}"
    too_long = {path.relative_to(ROOT).as_posix(): n for path in modules
                if (n := _line_count(path)) > MAX_LINES}
    assert not too_long, (
        f"modules over {MAX_LINES} lines (split each along a seam, one idea per module): "
        + ", ".join(f"{name} ({n} lines)" for name, n in sorted(too_long.items(), key=lambda kv: -kv[1])))


# ----------------------------------------------------------------------------- private members

#: Folders of plugin code: Coil's reference plugins and the example plugin (not its fake
#: device, ``torch_emu``, which is a torch extension and follows torch's rules).
PLUGIN_DIRS = ("plugins", "examples/emu_chip/coil_emu_chip")

#: Packages whose private members a plugin may use, and why: what they lack in public API
#: and the pinned versions a plugin supports keep them stable.
FOREIGN_PRIVATES_OK = {
    "torch": "the raw CUDA stream for launches (torch._C._cuda_getCurrentRawStream) and "
             "torch.cuda._sleep to time the device alone have no public spelling",
    "triton": "the interpreter's patching of triton.language (interpreter._patch_lang) is "
              "how a kernel's interpreted math is swapped in and undone",
}

#: Attribute names that start with ``_`` but are public API.
PRIVATE_NAMES_OK = {
    "_replace": "namedtuple's public methods start with _ to stay clear of field names",
    "_asdict": "namedtuple's public API",
    "_fields": "namedtuple's public API",
    "_make": "namedtuple's public API",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _foreign_names(tree: ast.Module) -> set[str]:
    """Names an import binds to a module or object of a :data:`FOREIGN_PRIVATES_OK` package
    (``torch``, ``tl`` for ``triton.language``, ``_interpreter`` for
    ``triton.runtime.interpreter``), wherever the import is."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FOREIGN_PRIVATES_OK:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.split(".")[0] in FOREIGN_PRIVATES_OK:
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(node: ast.expr) -> ast.expr:
    """The innermost object of ``a.b[c](d).e``: ``a``."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _own(node: ast.expr) -> bool:
    """Whether ``node`` is the object whose privates are its own: ``self``, ``cls``,
    ``super()``."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def private_uses(path: Path) -> list[str]:
    """``path:line: expression`` for each use of another object's or module's private
    member in a module of plugin code."""
    tree = ast.parse(path.read_text(), str(path))
    foreign = _foreign_names(tree)
    where = path.relative_to(ROOT).as_posix()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr) \
                and node.attr not in PRIVATE_NAMES_OK and not _own(node.value):
            root = _root(node.value)
            if not (isinstance(root, ast.Name) and root.id in foreign):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("coil")):
            found += [(node.lineno, f"from {'.' * node.level}{node.module or ''} import {alias.name}")
                      for alias in node.names if _is_private(alias.name)]
    return [f"{where}:{line}: {text}" for line, text in sorted(found)]


def test_plugins_use_no_private_member_of_another_object():
    modules = sorted(path for folder in PLUGIN_DIRS for path in (ROOT / folder).rglob("*.py")
                     if "__pycache__" not in path.parts)
    assert modules, f"no plugin modules found under {ROOT}"
    found = [hit for path in modules for hit in private_uses(path)]
    assert not found, (
        f"plugin code uses {len(found)} private member(s) of other objects or modules (give the "
        "owner a public, documented method and call that; see tests/test_code_rules.py):\n  "
        + "\n  ".join(found))
