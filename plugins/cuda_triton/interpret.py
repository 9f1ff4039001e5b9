"""Running one Triton kernel under Triton's interpreter while every other kernel compiles for
the GPU: :func:`jit`, :class:`InterpretedKernel`, the :func:`interpreting` scope, and
:class:`Helper`, the kind of JIT function the math helpers are (:mod:`.mathlib`).

Interpreting one kernel (verified on triton 3.6.0): ``triton.jit`` reads ``TRITON_INTERPRET``
only when it decorates, so setting the variable around the decorator, or building
``triton.runtime.interpreter.InterpretedFunction(fn)``, gives one interpreted kernel; but that
kernel fails ("Cannot call @triton.jit'd outside of the scope of a kernel") at its first call
of another JIT function: a helper, or ``tl.sum``, ``tl.max``, ``tl.sigmoid``, which Triton
builds at import. And interpreted calls of those functions patch ``tl.core`` without undoing
it, after which ``triton.compile`` of any kernel calling ``tl.sum`` fails in the same
process. (With the variable set before triton is imported, everything is interpreted and no
kernel using ``tl.sum`` compiles at all.) So :func:`jit` (``interpret=True``) returns an
:class:`InterpretedKernel` whose launches run inside :func:`interpreting`: it patches ``tl``
and ``tl.core`` as the interpreter would, routes every JITFunction call to an interpreted
copy, and restores all of it afterwards, leaving other kernels and ahead-of-time compiles
untouched. Helpers are real JITFunctions whatever the variable says, and run interpreted
when an interpreted kernel calls them, so they serve both ways of interpreting. Launches
are not thread-safe.

Triton's interpreter module is imported on the first interpreted call, not with this one: a
GPU process never needs it, and on the H200 host (no ``.pyc`` files for Triton) importing it
took 0.25 s of every warm first call."""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Callable, Iterator

import numpy as np
import triton.language as tl
from triton.runtime.jit import JITFunction


def _interpreter() -> Any:
    from triton.runtime import interpreter
    return interpreter


def interpreted_types() -> tuple[type, ...]:
    """The classes an interpreted kernel may be: none before the interpreter was imported."""
    module = sys.modules.get("triton.runtime.interpreter")
    return (module.InterpretedFunction,) if module is not None else ()


class Helper(JITFunction):
    """A real JITFunction whatever ``TRITON_INTERPRET`` says (so GPU kernels always compile
    with it) that, when an interpreted kernel calls it, runs interpreted instead of raising."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _interpreter().InterpretedFunction(self.fn)(*args, **kwargs)


def _lang_probe() -> None:
    """Never called; a copy whose globals hold ``tl`` and ``tl.core`` steers the patcher."""


_LANG_PROBE = types.FunctionType(_lang_probe.__code__, {"tl": tl, "core": tl.core})


def _call_interpreted(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
    return _interpreter().InterpretedFunction(self.fn)(*args, **kwargs)


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """Scope for interpreted launches: JIT functions called inside run interpreted, and every
    patch of ``triton.language`` made inside is undone on exit. Kernels interpreted through
    ``TRITON_INTERPRET=1`` can be launched inside it too, to keep ``tl.core`` clean."""
    # Patch both language modules first, so that whatever nested interpreted calls patch
    # (and never restore) is recorded here and undone below.
    interpreter = _interpreter()
    scope = interpreter._patch_lang(_LANG_PROBE)
    jit_call = JITFunction.__call__
    JITFunction.__call__ = _call_interpreted
    create_dot = interpreter.InterpreterBuilder.create_dot
    interpreter.InterpreterBuilder.create_dot = _widening_dot(create_dot)
    try:
        with np.errstate(all="ignore"):  # IEEE results, as on the GPU, without numpy's warnings
            yield
    finally:
        JITFunction.__call__ = jit_call
        interpreter.InterpreterBuilder.create_dot = create_dot
        scope.restore()


def _widening_dot(create_dot: Callable[..., Any]) -> Callable[..., Any]:
    """The interpreter's ``tl.dot`` with bfloat16 tiles widened to float32 first: it
    multiplies them as their uint16 bit patterns (triton-lang/triton#11584). Widening is
    exact, as the GPU's MMA units are on bfloat16 products."""
    def widen(x: Any) -> Any:
        if x.dtype != tl.bfloat16:
            return x
        bits = x.data.astype(np.uint32) << 16
        return _interpreter().TensorHandle(bits.view(np.float32), tl.float32)

    def dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        return create_dot(self, widen(a), widen(b), d, *args)
    return dot


class InterpretedKernel:
    """A kernel that Triton's interpreter runs whatever ``TRITON_INTERPRET`` says; launched
    like a JITFunction, ``kernel[grid](*args, **constexprs)``, with CPU tensors."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._interpreted = _interpreter().InterpretedFunction(fn)

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            with interpreting():
                self._interpreted[grid](*args, **kwargs)
        return launch


def jit(fn: Callable[..., Any], *, interpret: bool) -> JITFunction | InterpretedKernel:
    """``fn`` (a plain function or an already decorated one) as a real JITFunction, or as an
    :class:`InterpretedKernel` when ``interpret``; no other kernel is affected."""
    if not interpret and isinstance(fn, JITFunction):
        return fn
    raw = getattr(fn, "fn", fn)
    return InterpretedKernel(raw) if interpret else JITFunction(raw)
