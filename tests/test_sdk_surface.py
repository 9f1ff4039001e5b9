"""The public surface of ``coil.sdk`` against its checked-in snapshot (tests/golden/sdk_surface.json).

The surface: ``coil.sdk.__all__`` and the public names of each public module of the SDK
(its ``__all__``, else the names it defines without a leading underscore; the conformance
kit, ``coil.sdk.testing``, is a pytest plugin and not part of it). For each name: a
function's signature (parameters with kind, annotation text and whether they have a default;
the return annotation), a class's bases, dataclass fields (name, annotation text, default or
not, in order) and public methods and properties, a value's type.

A change is *breaking* (a removed name, field, method or parameter; a renamed or reordered
positional parameter or field; a parameter or field that lost its default; a new required
one; a changed kind) or *additive* (anything else: new names, new optional parameters, new
fields with defaults, changed annotations). Breaking changes need a new major
``API_VERSION`` (sdk/versions.py), additive ones a new minor, past the version recorded in
the snapshot; then regenerate it:

    .venv/bin/python tests/test_sdk_surface.py --update

which refuses when the version does not allow the change (docs/plugin-guide.md, Versioning)."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = Path(__file__).resolve().parent / "golden" / "sdk_surface.json"
UPDATE = ".venv/bin/python tests/test_sdk_surface.py --update"

#: The SDK's public modules besides the package itself (``coil.sdk.testing`` is the kit).
MODULES = ("backend", "cachestats", "cache_command", "canonical", "codegen", "codewriter", "config",
           "diskcache", "errors", "hookspecs", "host", "ir", "kernel", "knobs", "ops", "progress",
           "redisclient", "reference", "registry", "remotecache", "scaffold", "symbolic",
           "templates", "versions")


# ----------------------------------------------------------------------------- describing


def _text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _signature(fn: Any) -> dict[str, Any] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = [{"name": p.name, "kind": p.kind.name, "annotation": _text(p.annotation),
               "default": p.default is not inspect.Parameter.empty}
              for p in sig.parameters.values()]
    return {"params": params, "returns": _text(sig.return_annotation)}


def _member(cls: type, name: str) -> dict[str, Any] | None:
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, property):
        return {"kind": "property", "returns": _text(getattr(raw.fget, "__annotations__", {}).get("return", ""))}
    if isinstance(raw, (staticmethod, classmethod)):
        return {"kind": type(raw).__name__, **(_signature(raw.__func__) or {})}
    if inspect.isfunction(raw):
        return {"kind": "method", **(_signature(raw) or {})}
    if inspect.isclass(raw):
        return {"kind": "class", "qualname": raw.__qualname__}
    return None  # plain class attributes (constants, dataclass defaults) are covered elsewhere


def _class(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "class", "bases": [b.__qualname__ for b in cls.__bases__]}
    if dataclasses.is_dataclass(cls):
        out["fields"] = [{"name": f.name, "annotation": _text(f.type),
                          "default": f.default is not dataclasses.MISSING
                          or f.default_factory is not dataclasses.MISSING}
                         for f in dataclasses.fields(cls)]
    elif "__init__" in vars(cls):
        out["init"] = _signature(cls.__init__)
    members = {}
    for name in sorted(dir(cls)):
        owner = next((k for k in cls.__mro__ if name in vars(k)), object)
        if name.startswith("_") or owner is object or not owner.__module__.startswith("coil"):
            continue
        entry = _member(cls, name)
        if entry is not None:
            members[name] = entry
    out["members"] = members
    return out


def _describe(value: Any) -> dict[str, Any]:
    if inspect.isclass(value):
        return _class(value)
    if callable(value) and _signature(value) is not None:
        return {"kind": "function", **_signature(value)}
    return {"kind": "value", "type": type(value).__name__}


def _public_names(module: Any) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    return sorted(names)


def surface() -> dict[str, Any]:
    """The current surface: ``"coil.sdk.X"`` / ``"coil.sdk.module.X"`` -> description."""
    out = {}
    for module_name in ("coil.sdk",) + tuple(f"coil.sdk.{m}" for m in MODULES):
        module = importlib.import_module(module_name)
        for name in _public_names(module):
            out[f"{module_name}.{name}"] = _describe(getattr(module, name))
    return out


# ----------------------------------------------------------------------------- comparing


def _compare_params(where: str, old: list[dict], new: list[dict], breaking: list, additive: list) -> None:
    new_by_name = {p["name"]: p for p in new}
    positional = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
    old_pos = [p["name"] for p in old if p["kind"] in positional]
    new_pos = [p["name"] for p in new if p["kind"] in positional]
    if new_pos[:len(old_pos)] != old_pos:
        breaking.append(f"{where}: positional parameters were ({', '.join(old_pos)}), now "
                        f"({', '.join(new_pos)})")
    for p in old:
        q = new_by_name.get(p["name"])
        if q is None:
            if p["kind"] not in positional:  # positional removals are reported above
                breaking.append(f"{where}: parameter {p['name']!r} removed")
            continue
        if q["kind"] != p["kind"] and p["kind"] not in positional:
            breaking.append(f"{where}: parameter {p['name']!r} was {p['kind']}, now {q['kind']}")
        if p["default"] and not q["default"]:
            breaking.append(f"{where}: parameter {p['name']!r} lost its default (now required)")
        if p["annotation"] != q["annotation"]:
            additive.append(f"{where}: parameter {p['name']!r} annotation {p['annotation']!r} -> "
                            f"{q['annotation']!r}")
    old_names = {p["name"] for p in old}
    for q in new:
        if q["name"] in old_names:
            continue
        if q["default"] or q["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            additive.append(f"{where}: new optional parameter {q['name']!r} ({q['kind']})")
        else:
            breaking.append(f"{where}: new required parameter {q['name']!r}")


def _compare_signature(where: str, old: dict, new: dict, breaking: list, additive: list) -> None:
    if "params" not in old or "params" not in new:
        if old != new:
            additive.append(f"{where}: signature {old} -> {new}")
        return
    _compare_params(where, old["params"], new["params"], breaking, additive)
    if old.get("returns") != new.get("returns"):
        additive.append(f"{where}: return annotation {old.get('returns')!r} -> {new.get('returns')!r}")


def _compare_fields(where: str, old: list[dict], new: list[dict], breaking: list, additive: list) -> None:
    new_by_name = {f["name"]: f for f in new}
    old_names = [f["name"] for f in old]
    kept = [f["name"] for f in new if f["name"] in set(old_names)]
    if kept != [n for n in old_names if n in new_by_name]:
        breaking.append(f"{where}: field order was ({', '.join(old_names)}), now "
                        f"({', '.join(f['name'] for f in new)})")
    for f in old:
        g = new_by_name.get(f["name"])
        if g is None:
            breaking.append(f"{where}: field {f['name']!r} removed or renamed")
        elif f["default"] and not g["default"]:
            breaking.append(f"{where}: field {f['name']!r} lost its default")
        elif f["annotation"] != g["annotation"]:
            additive.append(f"{where}: field {f['name']!r} annotation {f['annotation']!r} -> "
                            f"{g['annotation']!r}")
    for g in new:
        if g["name"] not in old_names:
            (additive if g["default"] else breaking).append(
                f"{where}: new {'field with a default' if g['default'] else 'REQUIRED field'} {g['name']!r}")


def _compare_entry(where: str, old: dict, new: dict, breaking: list, additive: list) -> None:
    if old["kind"] != new["kind"]:
        breaking.append(f"{where}: was a {old['kind']}, now a {new['kind']}")
        return
    if old["kind"] in ("function", "method", "staticmethod", "classmethod"):
        _compare_signature(where, old, new, breaking, additive)
    elif old["kind"] == "class" and "bases" in old:
        if old["bases"] != new["bases"]:  # every class derives from object: never a loss
            (breaking if not set(old["bases"]) - {"object"} <= set(new["bases"]) else additive).append(
                f"{where}: bases {old['bases']} -> {new['bases']}")
        if "fields" in old or "fields" in new:
            _compare_fields(where, old.get("fields", []), new.get("fields", []), breaking, additive)
        if old.get("init") and new.get("init"):
            _compare_signature(f"{where}.__init__", old["init"], new["init"], breaking, additive)
        for name, member in old["members"].items():
            if name not in new["members"]:
                breaking.append(f"{where}.{name}: removed")
            else:
                _compare_entry(f"{where}.{name}", member, new["members"][name], breaking, additive)
        additive += [f"{where}.{name}: new {m['kind']}" for name, m in new["members"].items()
                     if name not in old["members"]]
    elif old != new:
        additive.append(f"{where}: {old} -> {new}")


def compare(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(breaking changes, additive changes) from surface ``old`` to ``new``."""
    breaking: list[str] = []
    additive: list[str] = []
    for name, entry in old.items():
        if name not in new:
            breaking.append(f"{name}: removed")
        else:
            _compare_entry(name, entry, new[name], breaking, additive)
    additive += [f"{name}: new {new[name]['kind']}" for name in new if name not in old]
    return breaking, additive


def verdict(snapshot: dict[str, Any], current: dict[str, Any], version: str) -> tuple[bool, str]:
    """(may the snapshot be regenerated at ``version``, what changed and what to do)."""
    from coil.sdk.versions import parse
    old_version = snapshot["api_version"]
    breaking, additive = compare(snapshot["surface"], current)
    if not breaking and not additive:
        return True, ""
    listing = "".join(f"\n  BREAKING  {c}" for c in breaking) + "".join(f"\n  added     {c}" for c in additive)
    head = f"coil.sdk's surface changed since the snapshot (recorded at API {old_version}, now {version}):{listing}\n"
    old, now = parse(old_version), parse(version)
    if breaking and now[0] <= old[0]:
        return False, head + (
            f"These break plugins: keep the old names and signatures working (a new optional "
            f"keyword parameter, a field with a default), or add a new major release to "
            f"HISTORY in sdk/versions.py ({old[0] + 1}.0.0) with each change marked "
            f"breaking=True; then run `{UPDATE}`")
    if now[:2] <= old[:2]:
        return False, head + (
            f"Add a release to HISTORY in sdk/versions.py ({old[0]}.{old[1] + 1}.0, or the next "
            f"one not yet taken) saying what was added, update the table in "
            f"docs/plugin-guide.md (Versioning), then run `{UPDATE}`")
    return True, head + f"API {version} allows these changes: run `{UPDATE}` and commit the snapshot"


def _load() -> dict[str, Any]:
    return json.loads(SNAPSHOT.read_text())


def _current() -> tuple[dict[str, Any], str]:
    from coil.sdk import versions
    return json.loads(json.dumps(surface())), versions.API_VERSION


# ----------------------------------------------------------------------------- the tests


def test_surface_matches_the_snapshot():
    current, version = _current()
    assert SNAPSHOT.exists(), f"no snapshot of coil.sdk's surface; run `{UPDATE}`"
    _, message = verdict(_load(), current, version)
    assert not message, message


def _fake(surface_: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(surface_))
    out.update(changes)
    return out


def test_the_rules_classify_changes():
    """The comparison on hand-made surfaces: what needs a major, what a minor bump."""
    fn = {"kind": "function", "returns": "None", "params": [
        {"name": "a", "kind": "POSITIONAL_OR_KEYWORD", "annotation": "int", "default": False}]}
    cls = {"kind": "class", "bases": ["object"], "members": {},
           "fields": [{"name": "x", "annotation": "int", "default": False}]}
    base = {"api_version": "0.5.0", "surface": {"coil.sdk.f": fn, "coil.sdk.C": cls}}
    opt = dict(fn, params=fn["params"] + [{"name": "b", "kind": "KEYWORD_ONLY", "annotation": "int", "default": True}])
    req = dict(fn, params=fn["params"] + [{"name": "b", "kind": "KEYWORD_ONLY", "annotation": "int", "default": False}])
    renamed = dict(fn, params=[dict(fn["params"][0], name="z")])
    new_field = dict(cls, fields=cls["fields"] + [{"name": "y", "annotation": "int", "default": True}])
    renamed_field = dict(cls, fields=[dict(cls["fields"][0], name="w")])
    cases = [  # (surface, version, may regenerate, a word of the message)
        (_fake(base["surface"]), "0.5.0", True, ""),
        (_fake(base["surface"], **{"coil.sdk.g": fn}), "0.5.1", False, "added"),
        (_fake(base["surface"], **{"coil.sdk.g": fn}), "0.6.0", True, "allows"),
        (_fake(base["surface"], **{"coil.sdk.f": opt}), "0.5.0", False, "new optional parameter 'b'"),
        (_fake(base["surface"], **{"coil.sdk.f": opt}), "0.6.0", True, "new optional parameter 'b'"),
        (_fake(base["surface"], **{"coil.sdk.f": req}), "0.6.0", False, "new required parameter 'b'"),
        (_fake(base["surface"], **{"coil.sdk.f": req}), "1.0.0", True, "BREAKING"),
        (_fake(base["surface"], **{"coil.sdk.f": renamed}), "0.9.0", False, "positional parameters"),
        (_fake(base["surface"], **{"coil.sdk.C": new_field}), "0.6.0", True, "field with a default"),
        (_fake(base["surface"], **{"coil.sdk.C": renamed_field}), "0.6.0", False, "field 'x' removed or renamed"),
        (_fake(base["surface"], **{"coil.sdk.C": dict(cls, bases=["Generic"])}), "0.6.0", True, "bases"),
        ({"coil.sdk.f": fn}, "0.6.0", False, "coil.sdk.C: removed"),
    ]
    for current, version, may, word in cases:
        ok, message = verdict(base, current, version)
        assert ok == may and word in message, (version, word, message)


def test_the_surface_sees_what_plugins_use():
    current, _ = _current()
    assert "coil.sdk.DeviceBackend" in current and "coil.sdk.versions.compatibility" in current
    backend = current["coil.sdk.DeviceBackend"]["members"]
    assert backend["compile"]["kind"] == "method" and "capture" in backend
    assert any(f["name"] == "reduction_strategies" for f in current["coil.sdk.Capabilities"]["fields"])


def main(argv: list[str]) -> int:
    if argv != ["--update"]:
        print(__doc__)
        return 2
    current, version = _current()
    if SNAPSHOT.exists():
        ok, message = verdict(_load(), current, version)
        if not ok:
            print(message, file=sys.stderr)
            print("snapshot NOT updated", file=sys.stderr)
            return 1
        print(message or "surface unchanged")
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(json.dumps({"api_version": version, "surface": current}, indent=1,
                                   sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT.relative_to(ROOT)} at coil.sdk API {version} ({len(current)} names)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
