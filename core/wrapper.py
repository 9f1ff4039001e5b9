"""Wrapper codegen: the Python host function that binds sizes, allocates as the memory plan
says, launches kernels (each line written by the kernel's device backend), calls ATen for
extern nodes, and returns the outputs. Device-neutral."""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sympy
import torch

from . import collectives, ir, symbolic
from .graph import LoweredGraph
from .host_programs import PlannedProgram
from .kernel import Kernel
from .memory import MemoryPlan
from .sdk.codewriter import CodeWriter
from .symbolic import ExprPrinter

log = logging.getLogger(__name__)


def _reinterpret_fallback(t: torch.Tensor, size: Sequence[Any], stride: Sequence[Any],
                          offset: Any) -> torch.Tensor:
    return t.as_strided(size, stride, t.storage_offset() + offset)


#: ``reinterpret(t, size, stride, offset)``: a view of ``t``'s storage, ``offset`` elements
#: after ``t``'s own start; torch's C helper (no dispatch, ~1.5 us against as_strided's ~2.7).
reinterpret: Callable[..., torch.Tensor] = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_reinterpret_tensor", None) \
    or _reinterpret_fallback


_GUARDS = getattr(getattr(torch._C, "_dynamo", None), "guards", None)


@functools.lru_cache(maxsize=None)
def _accelerator_type() -> str | None:
    current = getattr(torch, "accelerator", None)
    device = current.current_accelerator() if current is not None else None
    return device.type if device is not None else None


def _empty_on(device: torch.device, size: Sequence[Any], stride: Sequence[Any],
              dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def allocator(device: torch.device) -> Callable[[Sequence[Any], Sequence[Any], torch.dtype], torch.Tensor]:
    """``new(size, stride, dtype)``: uninitialised memory on ``device``, for one call of a
    wrapper. Where torch has an allocation helper for the device's type
    (``_empty_strided_<type>``: no dispatch, ~1.2 us against ``empty_strided``'s ~2.7; a
    training step of ResNet-18 allocates some 170 buffers), that helper, which allocates on
    the type's *current* device: so a device with an index takes it only while that index is
    current (the wrapper asks once per call, after the backends' prologues)."""
    fast = getattr(_GUARDS, f"_empty_strided_{device.type}", None)
    if fast is not None and device.index is not None:
        if _accelerator_type() != device.type or torch.accelerator.current_device_index() != device.index:
            fast = None
    return fast if fast is not None else functools.partial(_empty_on, device)


def restride(t: torch.Tensor, size: Sequence[Any], stride: Sequence[Any]) -> torch.Tensor:
    """``t`` copied into the layout the generated code expects. A layout with a stride of 0
    (an expanded tensor, such as BERT's position ids saved for the embedding's backward)
    holds one copy of the repeated values: the first slice of ``t`` along those dims, which
    the graph's metadata says is repeated."""
    repeated = [d for d, (n, s) in enumerate(zip(size, stride)) if s == 0 and n != 1]
    if repeated:
        first = t[tuple(slice(0, 1) if d in repeated else slice(None) for d in range(t.dim()))]
        compact = [1 if d in repeated else n for d, n in enumerate(size)]
        return restride(first, compact, stride).expand(size)
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


#: ExprPrinter's own spellings are Python's.
PY = ExprPrinter()


def py(e: Any) -> str:
    """``e`` (an int, a sympy expression, torch's size functions included, or a comparison of
    sizes: a runtime check's condition) as Python."""
    e = sympy.sympify(e)
    if isinstance(e, sympy.logic.boolalg.BooleanAtom):
        return str(bool(e))
    if isinstance(e, sympy.core.relational.Relational):
        return f"({py(e.lhs)} {e.rel_op} {py(e.rhs)})"
    return PY.print(e if e.is_Atom else symbolic.from_torch(e))


@dataclass
class Wrapper:
    source: str
    namespace: dict[str, Any]

    def build(self) -> Callable[[list[Any]], Any]:
        code = compile(self.source, "<coil-wrapper>", "exec")
        exec(code, self.namespace)
        return self.namespace["call"]


class WrapperWriter:
    def __init__(self, graph: LoweredGraph, steps: Sequence[object], plan: MemoryPlan,
                 launchers: dict[str, tuple[Any, str]], *, check_layouts: bool = True,
                 check_inputs: bool = False, profile_kernels: bool = False,
                 programs: Sequence[PlannedProgram] = (), modules: dict[str, Any] | None = None) -> None:
        """``launchers``: kernel name -> (device backend, namespace var of its compiled module);
        ``check_layouts``: check the strides of ATen results (``Config.check_extern_layouts``);
        ``check_inputs``: check the strides of the graph's inputs too (backward graphs, whose
        inputs are the forward's outputs and saved values, with no guard from Dynamo);
        ``profile_kernels``: each kernel launch inside a ``torch.profiler`` range named
        ``coil:<kernel>`` (``Config.profile_kernels``); ``programs``: runs of launches the
        backends may run as one host function each (:mod:`coil.host_programs`), whose
        compiled modules ``modules`` holds by namespace var."""
        self.profile_kernels = profile_kernels
        self.check_layouts = check_layouts
        self.check_inputs = check_inputs
        self.graph = graph
        self.steps = steps
        self.plan = plan
        self.launchers = launchers
        self.programs = {p.start: p for p in programs}
        #: The programs written as one call each: "<program>: <kernel>, <kernel>...".
        self.written_programs: list[str] = []
        self.modules = modules or {}
        # math: sizes derived from float ones print as ``math.trunc(...)`` (torch's printer)
        self.ns: dict[str, Any] = {"torch": torch, "math": math, "empty_strided": torch.empty_strided,
                                   "reinterpret": reinterpret, "allocator": allocator}
        self.allocators: dict[torch.device, str] = {}  # device -> this call's allocator's name
        if profile_kernels:
            self.ns["record_function"] = torch.profiler.record_function
        self.w = CodeWriter()
        self.bound: set[str] = set()

    def const(self, value: Any) -> str:
        if isinstance(value, bool) or value is None:
            return repr(value)
        if isinstance(value, int) or isinstance(value, str):
            return repr(value)
        if isinstance(value, float) and value == value and abs(value) != float("inf"):
            return repr(value)
        if isinstance(value, torch.SymInt):
            return py(value.node.expr)
        if isinstance(value, sympy.Basic):
            return py(value)
        name = f"c{len(self.ns)}"
        self.ns[name] = value
        return name

    def storage(self, name: str) -> str:
        buf = self.graph.buffers.get(name)
        return buf.storage if buf is not None and buf.storage else name

    def view(self, name: str, layout: ir.Layout) -> str:
        name = self.storage(name)
        own = self.graph.buffers[name].layout
        if (layout.size, layout.stride, layout.offset) == (own.size, own.stride, own.offset):
            return name
        size = ", ".join(py(s) for s in layout.size)
        stride = ", ".join(py(s) for s in layout.stride)
        # the offset counts from the buffer's own start (buffers Coil allocates start at their
        # storage's; inputs and ATen results may not)
        return (f"reinterpret({name}, ({size}{',' if len(layout.size) == 1 else ''}), "
                f"({stride}{',' if len(layout.stride) == 1 else ''}), {py(layout.offset)})")

    def arg(self, value: Any) -> str:
        if isinstance(value, ir.BufferRef):
            return self.view(value.name, value.layout)
        if isinstance(value, list):
            return "[" + ", ".join(self.arg(v) for v in value) + "]"
        if isinstance(value, tuple):
            return "(" + ", ".join(self.arg(v) for v in value) + ("," if len(value) == 1 else "") + ")"
        return self.const(value)

    def write(self) -> Wrapper:
        self.ns.update(self.graph.constants)
        with self.w.block("def call(args):"):
            self._bind_inputs()
            self._prologues()
            self._allocators()
            skip_to = 0
            for i, step in enumerate(self.steps):
                if i < skip_to:
                    continue
                if i in self.programs and self._program(self.programs[i]):
                    skip_to = self.programs[i].stop
                    continue
                for alloc in self.plan.allocs[i]:
                    self._alloc(alloc)
                if isinstance(step, Kernel):
                    backend, module_var = self.launchers[step.name]
                    if self.profile_kernels:
                        with self.w.block(f"with record_function({'coil:' + step.name!r}):"):
                            self.w.line(backend.call_line(module_var, step, step.args))
                    else:
                        self.w.line(backend.call_line(module_var, step, step.args))
                else:
                    self._extern(step, set(self.plan.frees[i]))  # type: ignore[arg-type]
                for name in self.plan.frees[i]:
                    self.w.line(f"del {name}")
            outs = [self._output(o) for o in self.graph.outputs]
            self.w.line(f"return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
        return Wrapper(self.w.text(), self.ns)

    def _program(self, planned: PlannedProgram) -> bool:
        """Steps ``planned.start`` to ``planned.stop`` as one call of their host program, with
        the allocations of the buffers that are not its scratch before it and their frees after
        it; False where the backend built no such program (the steps then go one by one)."""
        first = planned.program.launches[0].kernel
        backend, module_var = self.launchers[first.name]
        line = backend.host_call_line(module_var, self.modules.get(module_var), planned.program)
        if line is None:
            return False
        steps = range(planned.start, planned.stop)
        for i in steps:
            for alloc in self.plan.allocs[i]:
                if alloc.name not in planned.scratch_names:
                    self._alloc(alloc)
        kernels = ", ".join(launch.kernel.name for launch in planned.program.launches)
        self.w.line(f"{line}  # {kernels}")
        self.written_programs.append(f"{planned.program.name}: {kernels}")
        for i in steps:
            for name in self.plan.frees[i]:
                if name not in planned.scratch_names:
                    self.w.line(f"del {name}")
        return True

    def _bind_inputs(self) -> None:
        names = [inp.name or f"sym{inp.position}" for inp in self.graph.inputs]
        if names:
            self.w.line(f"{', '.join(names)}{',' if len(names) == 1 else ''} = args")
        self.w.line("args.clear()")
        for symbol, (pos, kind, dim) in sorted(self.graph.symbol_sources.items(), key=lambda kv: kv[0].name):
            src = names[pos]
            expr = src if kind == "value" else f"{src}.{'size' if kind == 'size' else 'stride'}({dim})"
            self.w.line(f"{symbol.name} = {expr}")
            self.bound.add(symbol.name)
        self._derived_sizes()
        if self.check_inputs:
            written = {n.mutates for n in self.graph.nodes if getattr(n, "mutates", None)}
            written |= {a for n in self.graph.nodes for a in getattr(n, "aliases", ())}
            for inp in self.graph.inputs:
                if inp.name and inp.name not in written:
                    self._check_layout(inp.name, self.graph.buffers[inp.name].layout)

    def _derived_sizes(self) -> None:
        """Sizes Coil names by a symbol because its own functions cannot spell them
        (``symbolic.from_torch``), computed here with Python's integer semantics."""
        from torch.utils._sympy.printers import PythonPrinter
        definitions = symbolic.derived_definitions()
        if not definitions:
            return
        used: set[sympy.Symbol] = set()
        for buf in self.graph.buffers.values():
            for e in (*buf.layout.size, *buf.layout.stride, buf.layout.offset):
                used |= sympy.sympify(e).free_symbols
        for step in self.steps:
            used |= set(getattr(step, "size_args", ()))
            if isinstance(step, ir.ExternNode):  # an ATen call's size arguments (``narrow(x, 1, n // 2, 1)``)
                for a in ir._flatten([*step.args, *step.kwargs.values()]):
                    if isinstance(a, ir.BufferRef):  # a view passed (its offset, sizes, strides)
                        view = (*a.layout.size, *a.layout.stride, a.layout.offset)
                        used |= set().union(*(sympy.sympify(e).free_symbols for e in view))
                        continue
                    e = a.node.expr if isinstance(a, torch.SymInt) else a
                    if isinstance(e, sympy.Basic):
                        used |= (e if e.is_Atom else symbolic.from_torch(e)).free_symbols
        for out in self.graph.outputs:
            if out.expr is not None:
                used |= sympy.sympify(out.expr).free_symbols
            if out.layout is not None:  # a view returned (``x[n % 4]``: its offset)
                for e in (*out.layout.size, *out.layout.stride, out.layout.offset):
                    used |= sympy.sympify(e).free_symbols
        for sym in sorted(used & set(definitions), key=lambda s: s.name):
            expr = definitions[sym]
            if all(s.name in self.bound for s in expr.free_symbols):
                self.w.line(f"{sym.name} = {PythonPrinter().doprint(expr)}")
                self.bound.add(sym.name)

    def _prologues(self) -> None:
        """Each backend's once-per-call lines (a stream, a device), per device it launches on."""
        seen: set[tuple[str, str]] = set()
        for step in self.steps:
            if not isinstance(step, Kernel):
                continue
            backend, module_var = self.launchers[step.name]
            node = step.first_node
            device = node.device
            if (module_var, str(device)) in seen:
                continue
            seen.add((module_var, str(device)))
            for line in backend.prologue(module_var, device):
                self.w.line(line)

    def _allocators(self) -> None:
        """One allocator per device the plan allocates on, chosen once per call."""
        for allocs in self.plan.allocs:
            for alloc in allocs:
                device = alloc.layout.device
                if alloc.reuse or device in self.allocators:
                    continue
                name = self.allocators[device] = f"new_{len(self.allocators)}"
                self.w.line(f"{name} = allocator({self.const(device)})")

    def _alloc(self, alloc: Any) -> None:
        lay = alloc.layout
        size = ", ".join(py(s) for s in lay.size)
        stride = ", ".join(py(s) for s in lay.stride)
        comma = "," if len(lay.size) == 1 else ""
        if alloc.reuse:
            # the donor's name is deleted after this step (MemoryPlan.frees): one name per block
            how = "in place over" if alloc.inplace else "reuses"
            self.w.line(f"{alloc.name} = reinterpret({alloc.reuse}, ({size}{comma}), ({stride}{comma}), 0)"
                        f"  # {how} {alloc.reuse}")
            return
        self.w.line(f"{alloc.name} = {self.allocators[lay.device]}(({size}{comma}), ({stride}{comma}), "
                    f"{self.const(lay.dtype)})")

    def _extern(self, node: ir.ExternNode, dead: set[str]) -> None:
        """An ATen call; ``dead``: its outputs nothing reads (freed at once)."""
        # an OpOverload's bound C++ callable: what its Python __call__ calls, minus ~4 us
        op = self.const(getattr(node.op, "_op", node.op))
        args = [self.arg(a) for a in node.args] + [f"{k}={self.arg(v)}" for k, v in node.kwargs.items()]
        call = f"{op}({', '.join(args)})" + collectives.comment(node)
        if len(node.output_names) == 1 and node.output_paths[0] == ():
            self.w.line(f"{node.output_names[0]} = {call}")
        else:
            self.w.line(f"r_{node.name} = {call}")
            for name, path in zip(node.output_names, node.output_paths):
                self.w.line(f"{name} = r_{node.name}{''.join(f'[{p}]' for p in path)}")
            # the result's tuple would hold every output to the end of the call, each one's
            # memory too after its name is deleted (a convolution's input gradient, written
            # over by the next kernels in place: EfficientNet-B0's backward kept eleven of
            # them, 64 MiB, through its peak)
            self.w.line(f"del r_{node.name}")
        for name, layout in zip(node.output_names, node.output_layouts):
            if layout is None:  # a scalar result: the symbol it defines (``item()``)
                self.bound.add(name)
            for dim, n in enumerate(layout.size if layout else ()):
                if isinstance(n, sympy.Symbol) and n.name not in self.bound:
                    self.w.line(f"{n.name} = {name}.size({dim})")
                    self.bound.add(n.name)
            in_flight = isinstance(node, collectives.CollectiveNode)  # checked after its wait
            if self.check_layouts and layout is not None and name not in dead and not in_flight:
                self._check_layout(name, layout)

    def _check_layout(self, name: str, layout: ir.Layout) -> None:
        """Everything after an ATen call was generated for the strides eager's meta function
        predicted; an op may return others (its inputs' layout, a kernel's own choice). One
        comparison per call; on a mismatch the result is copied into the predicted layout."""
        dims = [d for d, n in enumerate(layout.size) if n != 1]
        if any(n == 0 for n in layout.size) or not dims:
            return
        symbols = set().union(*(sympy.sympify(layout.stride[d]).free_symbols for d in dims))
        if any(sym.name not in self.bound for sym in symbols):
            return  # strides from sizes only known inside the op: nothing to compare with
        try:
            [py(e) for e in (*layout.size, *layout.stride)]
        except NotImplementedError as exc:  # a size expression (torch FloorDiv, Max) the printer cannot spell
            log.debug("no stride check for %s: %s", name, exc)
            return
        stride = "(" + ", ".join(py(layout.stride[d]) for d in dims) + ("," if len(dims) == 1 else "") + ")"
        if len(dims) == len(layout.size):
            got = f"{name}.stride()"
        else:
            got = "(" + ", ".join(f"{name}.stride({d})" for d in dims) + ("," if len(dims) == 1 else "") + ")"
        size = ", ".join(py(n) for n in layout.size) + ("," if len(layout.size) == 1 else "")
        full = ", ".join(py(st) for st in layout.stride) + ("," if len(layout.stride) == 1 else "")
        self.ns["restride"] = restride
        self.w.line(f"if {got} != {stride}: {name} = restride({name}, ({size}), ({full}))")

    def _output(self, out: Any) -> str:
        if out.name is not None:
            return self.view(out.name, out.layout)
        if out.expr is not None:
            return py(out.expr)
        return self.const(out.constant)
