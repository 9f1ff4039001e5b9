"""A launcher written in C: one small Python extension, the same for every kernel, that reads
the tensors' data pointers, checks their alignment and calls ``cuLaunchKernel``.

The ctypes launcher (:mod:`.raw_launch`) spends about 2.3 us of Python and ctypes per launch
before the driver call (measured on the CPU machine against a no-op ``cuLaunchKernel``), and
a training step launches hundreds of kernels from the host: ViT-tiny's step is three times its
GPU time. This module makes that crossing one C call, ``launch(plan, grid, stream, args)``:

- ``plan`` is bytes made once per binary (:func:`plan`): the function handle, threads per
  program, shared memory, whether its pointers must be 16-byte aligned, then one type code
  per parameter (``p`` pointer, ``l`` 64-bit integer, ``i`` 32-bit integer);
- ``args`` is the launch's own tuple of tensors and integers, in signature order;
- it returns False without launching when a pointer the binary assumes aligned is not (the
  caller then launches the unaligned build), else True; a driver error raises.

Triton's two trailing scratch pointers are passed as null, as :mod:`.raw_launch` does. The
extension is built once with the host C compiler through Triton's module cache (about half
a second, started in the background when the backend warms up, see :func:`start`); where it
cannot be built (no compiler or Python headers), launches keep the ctypes path and
:func:`failure` says why."""
from __future__ import annotations

import ctypes
import logging
import struct
import threading
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

#: Parameters one launch can take (Triton's two scratch pointers come on top).
MAX_PARAMS = 128

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
static launch_fn cu_launch = NULL;
static PyObject *data_ptr_name = NULL;

#define MAX_PARAMS @MAX_PARAMS@
/* the plan's header: function handle, threads, shared bytes, aligned flag, parameter count */
typedef struct { uint64_t function; uint32_t threads, shared, aligned, n; } header_t;

static PyObject *set_driver(PyObject *self, PyObject *arg) {
    cu_launch = (launch_fn)PyLong_AsVoidPtr(arg);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *launch(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4 || !PyBytes_Check(argv[0]) || !PyTuple_Check(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "launch(plan: bytes, grid: int, stream: int, args: tuple)");
        return NULL;
    }
    if (cu_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_driver was not called");
        return NULL;
    }
    header_t h;
    const char *plan = PyBytes_AS_STRING(argv[0]);
    if ((size_t)PyBytes_GET_SIZE(argv[0]) < sizeof h) {
        PyErr_SetString(PyExc_ValueError, "plan too short");
        return NULL;
    }
    memcpy(&h, plan, sizeof h);
    const char *codes = plan + sizeof h;
    PyObject *args = argv[3];
    if (h.n > MAX_PARAMS || PyBytes_GET_SIZE(argv[0]) != (Py_ssize_t)(sizeof h + h.n)
            || PyTuple_GET_SIZE(args) != (Py_ssize_t)h.n) {
        PyErr_Format(PyExc_ValueError, "a plan for %u parameters, launched with %zd", h.n,
                     PyTuple_GET_SIZE(args));
        return NULL;
    }
    unsigned long long grid = PyLong_AsUnsignedLongLong(argv[1]);
    void *stream = PyLong_AsVoidPtr(argv[2]);
    if (PyErr_Occurred()) return NULL;
    uint64_t values[MAX_PARAMS + 2];
    void *params[MAX_PARAMS + 2];
    uint64_t misaligned = 0;
    for (uint32_t i = 0; i < h.n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        values[i] = 0;
        params[i] = &values[i];
        if (codes[i] == 'p') {
            PyObject *ptr = PyObject_CallMethodNoArgs(a, data_ptr_name);
            if (ptr == NULL) return NULL;
            values[i] = PyLong_AsUnsignedLongLong(ptr);
            Py_DECREF(ptr);
            misaligned |= values[i];
        } else if (codes[i] == 'l') {
            values[i] = (uint64_t)PyLong_AsLongLong(a);
        } else {
            int32_t v = (int32_t)PyLong_AsLong(a);
            memcpy(&values[i], &v, sizeof v);
        }
        if (PyErr_Occurred()) return NULL;
    }
    if (h.aligned && (misaligned & 15)) Py_RETURN_FALSE;
    values[h.n] = values[h.n + 1] = 0;
    params[h.n] = &values[h.n];
    params[h.n + 1] = &values[h.n + 1];
    if (grid == 0) Py_RETURN_TRUE;
    int err;
    /* the driver blocks while its launch queue is full: other threads may run meanwhile */
    Py_BEGIN_ALLOW_THREADS
    err = cu_launch((void *)(uintptr_t)h.function, (unsigned)grid, 1, 1, h.threads, 1, 1,
                    h.shared, stream, params, NULL);
    Py_END_ALLOW_THREADS
    if (err) {
        PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed with CUDA error %d", err);
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"set_driver", set_driver, METH_O, "the address of cuLaunchKernel"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(plan, grid, stream, args)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "coil_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_coil_launch(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    if (data_ptr_name == NULL) return NULL;
    return PyModule_Create(&module);
}
""".replace("@MAX_PARAMS@", str(MAX_PARAMS))

_lock = threading.Lock()
_thread: threading.Thread | None = None
_module: Any = None
_failure = ""
_driver_set = False


def _build() -> None:
    global _module, _failure
    try:
        # optional: Triton builds and caches the extension (its own launchers are built so)
        from triton.runtime.build import compile_module_from_src
        _module = compile_module_from_src(SOURCE, "coil_launch")
    except Exception as exc:  # noqa: BLE001 - any failure leaves the ctypes launcher in place
        _failure = f"{type(exc).__name__}: {exc}"
        log.warning("coil: the C launcher could not be built, kernels launch through ctypes "
                    "(about 2 us more per launch): %s", _failure)


def start() -> None:
    """Build the extension in the background (once per process)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_build, name="coil-c-launcher", daemon=True)
            _thread.start()


def built(timeout: float = 60.0) -> Any:
    """The built extension, waiting for the build (None where it cannot be built)."""
    start()
    assert _thread is not None
    _thread.join(timeout)
    return _module


def module(driver_address: Callable[[], int], timeout: float = 60.0) -> Any:
    """The extension, calling the driver function at ``driver_address()`` (None where it
    cannot be built)."""
    global _driver_set
    got = built(timeout)
    if got is not None and not _driver_set:
        with _lock:
            if not _driver_set:
                got.set_driver(driver_address())
                _driver_set = True
    return got


def failure() -> str:
    """Why the extension is not in use ("" when it is, or was not asked for)."""
    return _failure


def plan(function: int, threads: int, shared: int, aligned: bool, types: Sequence[str]) -> bytes:
    """The bytes :func:`launch` reads for one binary (``types`` as in :class:`.raw_launch.Params`)."""
    if len(types) > MAX_PARAMS:
        raise TypeError(f"{len(types)} parameters, more than the C launcher's {MAX_PARAMS}")
    codes = []
    for t in types:
        if t.startswith("*"):
            codes.append("p")
        elif t in ("i64", "i32"):
            codes.append("l" if t == "i64" else "i")
        else:
            raise TypeError(f"unsupported parameter type {t}")
    return struct.pack("<QIIII", function, threads, shared, int(aligned), len(types)) + "".join(codes).encode()


def address_of(fn: Any) -> int:
    """The address of a ctypes function (what ``set_driver`` takes)."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0
