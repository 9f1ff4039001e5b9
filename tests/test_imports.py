"""Import rules for Coil's own code (``core/``, ``sdk/``, ``plugins/``), checked statically.

The module graph is built with :mod:`ast` from the files, mapped to import names through
``pyproject.toml``'s ``package-dir`` (``core/`` is ``coil``, ``sdk/`` is ``coil.sdk``...).
Edges: ``import a.b`` and ``from a import b`` give ``a.b`` when that is a module of ours,
else ``a``; the parent packages a submodule import runs implicitly are not edges (every
submodule would otherwise "cycle" through its package's ``__init__``); imports under
``if TYPE_CHECKING:`` never run and are not edges either.

The rules:

* no cycle among module-level imports (those run when the module is imported, class bodies
  included);
* a function-local import of one of our modules is a cycle or a dependency in disguise. It
  is allowed where it breaks a dependency on an optional package (the imported module needs
  one of :data:`OPTIONAL_PACKAGES`, directly or through its own module-level imports);
  every other one is listed in :data:`LOCAL_IMPORTS` with its reason (a measured cost it
  keeps off a light import). ``coil.sdk``'s lazy re-exports (its ``_LAZY`` table) count as
  function-local imports of ``coil.sdk``;
* no cycle either once function-local imports count as edges: a local import never hides a
  cycle (:func:`test_no_cycle_hides_behind_local_imports`);
* ``sdk/`` imports nothing from the core (:func:`test_sdk_imports_nothing_from_the_core`):
  the SDK is the layer beneath the compiler. What plugins need lives in the SDK (the kernel
  IR, the knobs, the plugin registry); the SDK's tools that drive the compiler (the
  conformance kit, ``coil cache export|import``) call it through ``coil.sdk.host``, which
  the compiler registers when ``coil`` is imported.

Run this file directly (``python tests/test_imports.py``) to print the graph's findings."""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent

#: Packages a Coil install may lack (pyproject's optional dependencies, and test tools).
OPTIONAL_PACKAGES = frozenset({"triton", "redis", "numpy", "pytest", "hypothesis", "expecttest",
                               "timm", "transformers", "torchvision"})

# Reasons shared by many entries of LOCAL_IMPORTS (times from `python -X importtime`, torch 2.13
# CPU: `import coil` and `import coil.sdk` take 0.06 s and import no torch; a module that imports
# torch takes ~1.2 s, coil.backend, which imports torch._dynamo, ~2.4 s).
_LAZY_PACKAGE = ("lazy public attribute: `import coil` and `import coil.sdk` import neither torch "
                 "nor torch._dynamo (the conformance kit's pytest plugin imports coil.sdk in every "
                 "pytest session); the attribute's module imports torch")
_LAZY_PLUGIN = ("the hook builds the backend or templates on demand, so loading the plugin "
                "through its entry point stays cheap")
_LAZY_HOST = ("the compiler's side of coil.sdk.host is registered by `import coil`, which imports "
              "neither torch nor torch._dynamo: each operation imports what it runs on first use")
_LAZY_CLI = ("`coil` imports every subcommand's module to build its parser (`coil doctor` too): "
             "the compiler, ~0.3 s to import on top of torch, is imported only by a replay")

#: (importer, imported) -> why a function-local import of one of our modules is there. None
#: may close an import cycle. Every entry must still exist in the code (remove it when it goes).
LOCAL_IMPORTS: dict[tuple[str, str], str] = {
    ("coil", "coil.backend"):
        _LAZY_PACKAGE,
    ("coil", "coil.report"):
        _LAZY_PACKAGE,
    ("coil.host", "coil.backend"):
        _LAZY_HOST,
    ("coil.host", "coil.cache"):
        _LAZY_HOST,
    ("coil.host", "coil.report"):
        _LAZY_HOST,
    ("coil.repro", "coil.compile"):
        _LAZY_CLI,
    ("coil.sdk", "coil.sdk.errors"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.ir"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.kernel"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.programs"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.ops"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.backend"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.codewriter"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.diskcache"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.hookspecs"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.registry"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.reference"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.templates"):
        _LAZY_PACKAGE,
    ("coil.sdk", "coil.sdk.symbolic"):
        _LAZY_PACKAGE,
    ("coil.sdk.testing.plugin", "coil.sdk.testing.kit"):
        ("the kit's pytest plugin loads in every pytest session (the pytest11 entry point): "
         "torch and the kit are imported only once a test asks for a kit"),
    ("coil_cuda_triton", "coil_cuda_triton.backend"):
        _LAZY_PLUGIN,
    ("coil_template_gemm", "coil_template_gemm.cpp_gemm"):
        _LAZY_PLUGIN,
    ("coil_template_gemm", "coil_template_gemm.triton_gemm"):
        _LAZY_PLUGIN,
}


# ----------------------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    local: bool  # inside a function body (or coil.sdk's lazy table)


def _packages() -> dict[str, Path]:
    """Import name -> folder, for each package of ours (pyproject's ``package-dir``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    dirs = setuptools["package-dir"]
    out = {}
    for name in setuptools["packages"]:
        top = max((p for p in dirs if name == p or name.startswith(p + ".")), key=len)
        out[name] = ROOT / dirs[top] / Path(*name[len(top):].split(".")[1:])
    return out


@cache
def modules() -> dict[str, Path]:
    """Import name -> file, for every module of ours."""
    out = {}
    for package, folder in _packages().items():
        out[package] = folder / "__init__.py"
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                out[f"{package}.{path.stem}"] = path
    return out


def _ours(name: str) -> str | None:
    """The module of ours that ``name`` (a module, or a module's attribute) is, or None."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _targets(importer: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Fully qualified names an import statement imports (a submodule where it is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    module = node.module or ""
    if node.level:
        is_package = modules()[importer].name == "__init__.py"
        parts = importer.split(".")[:len(importer.split(".")) - node.level + is_package]
        module = ".".join(parts + ([module] if module else []))
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in modules() else module
            for a in node.names]


def _walk(node: ast.AST, local: bool = False):
    """(import statement, inside a function?) for every import that may run."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, local
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for stmt in child.orelse:
                yield from _walk(ast.Module(body=[stmt], type_ignores=[]), local)
        else:
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _walk(child, local or inner)


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    """A module's ``_LAZY = {name: module}`` table (``coil.sdk``'s lazy re-exports)."""
    for stmt in tree.body:
        target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
            stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "_LAZY" and stmt.value is not None:
            return ast.literal_eval(stmt.value)
    return {}


@cache
def imports() -> tuple[Import, ...]:
    """Every import of every module of ours (external ones too, under their own names)."""
    out = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node, local in _walk(tree):
            out += [Import(name, target, node.lineno, local) for target in _targets(name, node)]
        out += [Import(name, f"{module}.{attr}", 0, True)
                for attr, module in _lazy_table(tree).items()]
    return tuple(out)


def _internal(imp: Import) -> Import | None:
    """``imp`` with its target as a module of ours, or None for an external import."""
    target = _ours(imp.imported)
    return None if target is None else Import(imp.importer, target, imp.line, imp.local)


def _graph(edges) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for importer, imported in edges:
        if importer != imported:
            graph[importer].add(imported)
    return graph


def module_level_graph() -> dict[str, set[str]]:
    return _graph((i.importer, i.imported) for i in map(_internal, imports())
                  if i is not None and not i.local)


def local_imports() -> dict[tuple[str, str], list[int]]:
    """(importer, imported module of ours) -> lines, for function-local imports."""
    out: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i in map(_internal, imports()):
        if i is not None and i.local and i.importer != i.imported:
            out[i.importer, i.imported].append(i.line)
    return out


@cache
def optional_needs(module: str) -> frozenset[str]:
    """The optional packages ``module`` imports at module level, itself or through modules of
    ours it imports at module level."""
    graph, direct = module_level_graph(), defaultdict(set)
    for i in imports():
        if not i.local:
            direct[i.importer].add(i.imported.split(".")[0])
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return frozenset(set().union(*(direct[m] for m in seen)) & OPTIONAL_PACKAGES)


def breaks_optional(importer: str, imported: str) -> str:
    """The optional packages a local import keeps ``importer`` from needing ('' if none)."""
    return ", ".join(sorted(optional_needs(imported) - optional_needs(importer)))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for succ in sorted(graph.get(node, ())):
            if state.get(succ) == 1:
                return path[path.index(succ):] + [succ]
            if succ not in state and (found := visit(succ)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _where(importer: str, imported: str, lines: list[int]) -> str:
    path = modules()[importer].relative_to(ROOT)
    at = ", ".join(f"{path}:{n}" if n else f"{path} (_LAZY)" for n in sorted(set(lines)))
    return f"{importer} -> {imported} ({at})"


# ----------------------------------------------------------------------------- the tests


def test_the_graph_sees_every_package():
    names = set(modules())
    for expected in ("coil", "coil.compile", "coil.lowering.views", "coil.sdk", "coil.sdk.versions",
                     "coil.sdk.testing.kit", "coil_cpu_cpp.codegen", "coil_cuda_triton.codegen",
                     "coil_template_gemm"):
        assert expected in names, f"{expected} missing from the import graph: {sorted(names)}"
    assert ("coil.compile", "coil.kernel") in {(i.importer, _ours(i.imported)) for i in imports()}


def test_no_cycle_among_module_level_imports():
    cycle = find_cycle(module_level_graph())
    assert cycle is None, (
        "module-level import cycle: " + " -> ".join(cycle) + ". Break it: move what both "
        "modules need into a third module that imports neither (a function-local import "
        "only hides the cycle, and this file refuses those)")


def test_function_local_imports_are_justified():
    unjustified = [_where(a, b, lines) for (a, b), lines in sorted(local_imports().items())
                   if (a, b) not in LOCAL_IMPORTS and not breaks_optional(a, b)]
    assert not unjustified, (
        f"{len(unjustified)} function-local import(s) of Coil's own modules that break no "
        f"dependency on an optional package ({', '.join(sorted(OPTIONAL_PACKAGES))}):\n  "
        + "\n  ".join(unjustified) + "\nMove each to the top of its module; if that makes an "
        "import cycle, split the shared part into a module both can import. An import that "
        "must stay local goes into LOCAL_IMPORTS in tests/test_imports.py with its reason")


def test_no_cycle_hides_behind_local_imports():
    edges = [(i.importer, i.imported) for i in map(_internal, imports()) if i is not None]
    cycle = find_cycle(_graph(edges))
    assert cycle is None, (
        "import cycle through function-local imports: " + " -> ".join(cycle) + ". Break it: "
        "move what both sides need into a module both can import")


def test_local_import_exceptions_are_current():
    found = local_imports()
    stale = [f"{a} -> {b}" for a, b in LOCAL_IMPORTS if (a, b) not in found]
    assert not stale, ("LOCAL_IMPORTS lists imports the code no longer makes (good): remove "
                       "them from tests/test_imports.py: " + ", ".join(stale))
    needless = [f"{a} -> {b} (keeps {a} from needing {breaks_optional(a, b)})"
                for a, b in LOCAL_IMPORTS if breaks_optional(a, b)]
    assert not needless, ("LOCAL_IMPORTS lists imports already allowed because the module "
                          "needs an optional package; remove them: " + ", ".join(needless))


def sdk_imports_of_the_core() -> list[str]:
    """Where a module of ``coil.sdk`` imports a module of the core (``coil`` outside
    ``coil.sdk``), at module level, in a function, or through the lazy re-exports."""
    hits: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i in map(_internal, imports()):
        in_sdk = i is not None and (i.importer == "coil.sdk" or i.importer.startswith("coil.sdk."))
        core = i is not None and (i.imported == "coil" or i.imported.startswith("coil.")) \
            and not (i.imported == "coil.sdk" or i.imported.startswith("coil.sdk."))
        if in_sdk and core:
            hits[i.importer, i.imported].append(i.line)
    return [_where(a, b, lines) for (a, b), lines in sorted(hits.items())]


def test_sdk_imports_nothing_from_the_core():
    found = sdk_imports_of_the_core()
    assert not found, (f"coil.sdk imports the core in {len(found)} place(s); the SDK is the "
                       "layer beneath the core:\n  " + "\n  ".join(found))


if __name__ == "__main__":
    print("module-level cycle:", find_cycle(module_level_graph()))
    print("function-local imports of our modules:")
    for (a, b), lines in sorted(local_imports().items()):
        reason = LOCAL_IMPORTS.get((a, b)) or (
            f"breaks a dependency on {breaks_optional(a, b)}" if breaks_optional(a, b) else "UNLISTED")
        print(f"  {_where(a, b, lines)}: {reason}")
    print("coil.sdk -> core:")
    for line in sdk_imports_of_the_core():
        print("  " + line)
