"""C++ spellings shared by the kernel writers: index expressions, ``for`` headers and OpenMP
``if`` clauses."""
from __future__ import annotations

import sympy
import torch

from coil.sdk.codegen import IndexPrinter, IndexSpelling

#: Below this many points a loop nest runs on one thread (a parallel region costs microseconds).
PARALLEL_THRESHOLD = 16384

#: Index expressions are non-negative ``int64_t``: C++'s ``/`` is floor division for them.
PRINTER = IndexPrinter(IndexSpelling(floordiv="({0} / {1})", minimum="std::min<int64_t>({0}, {1})",
                                     maximum="std::max<int64_t>({0}, {1})", wide_integer="INT64_C({0})"))


def idx(e: sympy.Expr) -> str:
    return PRINTER.print(sympy.sympify(e))


def for_header(var: str, size: sympy.Expr | str, start: str = "0", step: int | str = 1) -> str:
    end = size if isinstance(size, str) else idx(size)
    inc = f"{var}++" if step == 1 else f"{var} += {step}"
    return f"for (int64_t {var} = {start}; {var} < {end}; {inc}) {{"


def parallel_if(points: sympy.Expr) -> str:
    """An OpenMP ``if`` clause that keeps small loop nests on one thread."""
    return f"if(parallel: {idx(points)} > {PARALLEL_THRESHOLD})"


def parallel_for(points: sympy.Expr, collapse: int = 1, simd: bool = False) -> str:
    """The OpenMP pragma before a loop nest of ``points`` whose outer ``collapse`` loops the
    threads share (``simd``: one loop, shared and vectorised). Empty, or just ``omp simd``,
    where the nest stays on one thread whatever the sizes: a parallel region that its ``if``
    keeps inactive still costs a runtime call per launch, moves the nest into an outlined
    function, and a nest collapsed down to its innermost loop is no longer vectorised (zeroing
    a 256x64 gradient that way took longer than the scatter after it)."""
    if on_one_thread(points):
        return "#pragma omp simd" if simd else ""
    if simd:
        return f"#pragma omp parallel for simd {parallel_if(points)}"
    return f"#pragma omp parallel for collapse({collapse}) {parallel_if(points)}"


def on_one_thread(points: sympy.Expr) -> bool:
    """Whether a loop nest of ``points`` runs on one thread whatever the sizes: the count is
    known and at most ``PARALLEL_THRESHOLD``, or torch runs one thread as the kernel is
    written (:func:`serial`)."""
    return serial() or bool(points.is_number and int(points) <= PARALLEL_THRESHOLD)


def serial() -> bool:
    """Whether kernels are written for one thread: ``torch.get_num_threads()`` is 1 as they
    are generated. Their loops then have no OpenMP regions, which cost about 1 us per launch
    even on one thread (a 2x16x32x32 channels-last batch norm + hardswish: 7.0 us with its
    region, 6.0 without, one thread). A kernel written so stays on one thread if the count
    is raised later, as Inductor's keep the count they were compiled for; the count is part
    of the plugin's :meth:`~coil_cpu_cpp.backend.CppBackend.target_key`, so a graph cached
    under one count is not loaded under the other."""
    return torch.get_num_threads() == 1
