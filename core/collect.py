"""Reference cycles a compile leaves behind, collected once the step that compiled is over.

Dynamo keeps frames of the code it traced in reference cycles (seen on the H200: with graph
breaks in Whisper's forward, tracebacks and tracer objects hold the user's frames). A frame
in such a cycle keeps its locals after it returns: the first training step's gradients, its
outputs, the activations of its eager regions. Only Python's full collection frees them, and
it runs when enough objects have been allocated: Inductor's compile allocates enough for one
to run soon after; Coil's, much smaller, often does not, and the first step's tensors then
stayed allocated through later steps (Whisper: 321 MiB above Inductor's peak).

So once a backward graph has compiled (the end of a first training step), the next call of a
compiled forward, in a later step, runs one full collection (a fraction of a second, once per
compile). Inference compiles do not ask for one: a graph can run many times in one forward
(repeated layers), so no call says that the compiling call has returned."""
from __future__ import annotations

import functools
import gc
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

_pending = False
#: Collections run so far in this process (the tests read it).
collections = 0


def after_backward_compile() -> None:
    """A backward graph has compiled: collect at the next forward call."""
    global _pending
    _pending = True


def collecting(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a compiled Dynamo graph), running the pending collection before its call."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        global _pending, collections
        if _pending:
            _pending = False
            found = gc.collect()
            collections += 1
            log.debug("coil: collected %d objects left in reference cycles by the compiles", found)
        return fn(*args, **kwargs)

    return call
