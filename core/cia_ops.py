"""The dispatcher's composite-implicit (CIA) ops that PyTorch's core-ATen table decomposes,
found once per torch build and kept on disk.

``torch.export``'s table lists every CIA op it may decompose, which takes a walk over every
registered op: 0.06 s on the 2-core CPU machine and 0.21 s on the H200's host, in every
process's first compile (a warm process's first call included). Which ops those are
depends on the torch build and on what has registered a CIA kernel with the dispatcher
(custom ops included), so the list is kept under a key of torch's version and commit and
of the dispatcher's CIA registrations (one C++ call, 1 ms); a key that differs walks again.
Ops with a Python-only CIA kernel (``py_impl``) come from torch's own modules, which the
version pins."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from typing import Any

import torch

log = logging.getLogger(__name__)


def _key() -> str:
    registrations = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    text = "\n".join([torch.__version__, str(getattr(torch.version, "git_version", "")),
                      *sorted(registrations)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def walk() -> list[Any]:
    """Every CIA op the core-ATen table would decompose (before its preserved-op filter):
    ATen's, found by PyTorch's own collection, and those of every other namespace."""
    from torch._export.utils import _collect_all_valid_cia_ops_for_aten_namespace, _is_preservable_cia_op
    ops = list(_collect_all_valid_cia_ops_for_aten_namespace())  # materialises every CIA op
    for name in list(torch.ops._dir):
        namespace = getattr(torch.ops, name)
        if name == "aten" or not isinstance(namespace, torch._ops._OpNamespace):
            continue
        for packet_name in list(namespace):
            packet = getattr(namespace, packet_name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if _is_preservable_cia_op(op):
                    ops.append(op)
    return ops


def _resolve(triple: list[str]) -> Any:
    namespace, packet, overload = triple
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def cia_ops(folder: str | None) -> list[Any]:
    """:func:`walk`'s ops, read from ``folder`` when an earlier process of the same torch
    build and registrations wrote them there (``None``: always walk)."""
    path = os.path.join(folder, f"cia-{_key()}.json") if folder else None
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                return [_resolve(t) for t in json.load(f)]
        except (OSError, ValueError, TypeError, AttributeError, RuntimeError) as exc:
            log.debug("CIA op list %s unreadable (%s); walking the ops", path, exc)
    ops = walk()
    if path:
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump([[op.namespace, op._opname, op._overloadname] for op in ops], f)
            os.replace(tmp, path)  # atomic: concurrent processes never read half a file
        except OSError as exc:
            log.debug("CIA op list not written to %s: %s", folder, exc)
    return ops
