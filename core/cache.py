"""Portable cache artifacts: what one process compiled, as bytes another process (on another
machine of the same kind) loads so that every compile of those graphs is a hit.

``save_artifacts()`` bundles the graph-cache entries this process stored or hit
(:mod:`coil.graph_cache`: wrappers and the backends' exported modules, shared libraries
included) and every other disk-cache entry it read or wrote (kernel libraries, autotune
results). ``load_artifacts(data)`` writes them into the local cache, entry by entry: a graph
whose versions, Coil source or device target (``DeviceBackend.target_key``) differ from
this installation's is refused, and so are the other entries when the bundle's versions
differ, each with the reason, in the returned :class:`LoadSummary`. An entry already in the
local cache is kept (graph entries gain the bundle's size variants).

``export_cache()`` bundles the whole local cache instead (``coil cache export FILE``).
Bundles hold code that runs (wrapper source, shared libraries): load only trusted ones."""
from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from typing import Any

from . import config, graph_cache, graph_key, plugins
from .sdk import diskcache
from .sdk.diskcache import DiskCache

log = logging.getLogger(__name__)

#: The form of a bundle; raise it when it changes.
FORMAT = "coil-artifacts-1"


@dataclass
class LoadSummary:
    """What :func:`load_artifacts` did: graph entries and other entries written, entries
    already present, and each refused entry with the reason."""

    graphs: int = 0
    files: int = 0
    present: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.graphs} graph(s) and {self.files} other entr(y/ies) loaded, "
                 f"{self.present} already present, {len(self.refused)} refused"]
        lines += [f"  refused {what}: {why}" for what, why in self.refused]
        return "\n".join(lines)


def _environment() -> dict[str, str]:
    return {**graph_key.versions(), "coil source": graph_key.source_digest(plugins.registry())}


def _bundle(refs: list[tuple[str, str, str, bool]]) -> bytes:
    """Bytes of the entries ``refs`` ((namespace folder, key, suffix, fanout)) that still exist."""
    graphs, files = [], []
    for folder, key, suffix, fanout in refs:
        payload = DiskCache(folder, fanout=fanout).read(key, suffix, count=False)
        if payload is None:
            continue  # evicted since
        namespace = folder.rstrip("/").rsplit("/", 1)[-1]
        if namespace == graph_cache.NAMESPACE and suffix == graph_cache.SUFFIX:
            graphs.append((key, payload))
        else:
            files.append((namespace, key, suffix, fanout, payload))
    return pickle.dumps({"format": FORMAT, "environment": _environment(), "graphs": graphs, "files": files},
                        protocol=pickle.HIGHEST_PROTOCOL)


def save_artifacts() -> bytes:
    """Everything this process compiled or loaded from the caches, as one bundle."""
    refs = [(folder, key, suffix, fanout) for (folder, key, suffix), fanout in diskcache.used.items()]
    return _bundle(refs)


def export_cache() -> bytes:
    """The whole local cache (every managed namespace's entries) as one bundle."""
    root = config.current().cache_dir
    return _bundle([(str(e.path.parent.parent if e.fanout else e.path.parent), e.key, e.suffix, e.fanout)
                    for e in diskcache.entries(root)])


def _differences(theirs: dict[str, str], ours: dict[str, str]) -> str:
    diff = [f"{name}: {theirs.get(name)!r} in the artifacts, {ours.get(name)!r} here"
            for name in sorted(set(theirs) | set(ours)) if theirs.get(name) != ours.get(name)]
    return "; ".join(diff)


def load_artifacts(data: bytes) -> LoadSummary:
    """Write a bundle from :func:`save_artifacts` into the local cache, refusing entries made
    for other versions or hardware (the summary says which and why)."""
    bundle = pickle.loads(data)
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise ValueError(f"not a Coil artifact bundle of format {FORMAT!r}")
    summary = LoadSummary()
    reg = plugins.registry()
    graphs = DiskCache.in_namespace(graph_cache.NAMESPACE, fanout=True, layer="graph")
    for key, payload in bundle["graphs"]:
        _load_graph(graphs, key, payload, reg, summary)
    mismatch = _differences(bundle["environment"], _environment())
    for namespace, key, suffix, fanout, payload in bundle["files"]:
        if mismatch:
            summary.refused.append((f"{namespace}/{key}{suffix}", mismatch))
            continue
        store = DiskCache.in_namespace(namespace, fanout=fanout)
        if store.lookup(key, suffix, remote=False, count=False) is not None:
            summary.present += 1
        else:
            store.write(key, suffix, payload)
            summary.files += 1
    log.info("coil: %s", summary)
    return summary


def _load_graph(store: DiskCache, key: str, payload: bytes, reg: Any, summary: LoadSummary) -> None:
    variants = pickle.loads(payload)
    theirs = variants[0]["environment"]
    devices = [name.removesuffix(" backend") for name in theirs if name.endswith(" backend")]
    mismatch = _differences(theirs, graph_key.environment(reg, devices))
    if mismatch:
        summary.refused.append((f"graph {key[:16]} ({variants[0]['kind']})", mismatch))
        return
    local = store.read(key, graph_cache.SUFFIX, remote=False, count=False)
    if local is not None:
        ours = pickle.loads(local)
        new = [v for v in variants if all(v["guards"] != o["guards"] for o in ours)]
        if not new:
            summary.present += 1
            return
        variants = (ours + new)[:graph_cache.MAX_VARIANTS]
    store.write(key, graph_cache.SUFFIX, pickle.dumps(variants, protocol=pickle.HIGHEST_PROTOCOL))
    summary.graphs += 1


__all__ = ["save_artifacts", "load_artifacts", "export_cache", "LoadSummary"]
