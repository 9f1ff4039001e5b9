"""Host programs (:mod:`coil.sdk.programs`) as C++: one ``extern "C"`` function per program,
in the graph's translation unit after its kernels, that takes the addresses of the
program's parameters, allocates its scratch memory once for the call, calls the kernels'
functions in order and stops at the first kernel that reports an error. It returns an error
code: ``coil::OUT_OF_MEMORY`` where its scratch could not be allocated, else, in a program
with kernels that may report errors, the error flag it takes (and clears). The wrapper
runs such programs through ``CompiledModule.checked_program``, which holds the error flag's
lock, and the others directly, raising only when the code is not 0."""
from __future__ import annotations

from typing import Callable, Sequence

import coil.sdk as sdk
from coil.sdk.canonical import PLACEHOLDER, digest_name

#: ``coil::OUT_OF_MEMORY`` (coil_cpu.h): the only code a program without such kernels returns.
OUT_OF_MEMORY = 4

def host_function(program: sdk.HostProgram, functions: dict[str, str],
                  may_raise: Callable[[sdk.Kernel], bool]) -> tuple[str, str, str]:
    """The C++ definition of ``program``'s host function, its declaration and its name;
    ``functions``: each kernel's function in the unit."""
    params = [f"int64_t p{i}" for i in range(len(program.params))]
    offsets = _offsets(program.scratch)
    total = offsets[-1] if offsets else 0
    lines = [f'extern "C" int {PLACEHOLDER}({", ".join(params)}) {{']
    if total:
        lines += [f"  char* scratch = static_cast<char*>(std::aligned_alloc(64, {total}));",
                  "  if (scratch == nullptr) {",
                  "    return coil::OUT_OF_MEMORY;",
                  "  }"]
    raises = any(may_raise(launch.kernel) for launch in program.launches)
    lines.append("  do {")
    for launch in program.launches:
        args = [f"reinterpret_cast<int64_t>(scratch + {offsets[op.index]})" if op.scratch else f"p{op.index}"
                for op in launch.operands]
        lines.append(f"    {functions[launch.kernel.name]}({', '.join(args)});")
        if may_raise(launch.kernel):
            lines.append("    if (__atomic_load_n(&coil::kernel_error, __ATOMIC_RELAXED)) break;")
    lines.append("  } while (false);")
    if total:
        lines.append("  std::free(scratch);")
    lines += ["  return __atomic_exchange_n(&coil::kernel_error, 0, __ATOMIC_RELAXED);" if raises else "  return 0;",
              "}"]
    text = "\n".join(lines)
    name = digest_name("h_", text)
    decl = f"int {name}({', '.join(params)});"
    return text.replace(PLACEHOLDER, name), decl, name


def _offsets(sizes: Sequence[int]) -> list[int]:
    """Start of each region (the sizes are multiples of 64), then the end of the last."""
    out = [0]
    for n in sizes:
        out.append(out[-1] + n)
    return out


def call_line(module_var: str, program: sdk.HostProgram, raises: bool) -> str:
    """The wrapper's line: the program's function with its parameters' addresses; through the
    module's ``checked_program`` where a kernel of it may report an error (``raises``)."""
    args = [f"{p}.data_ptr()" for p in program.params]
    if raises:
        return f"{module_var}.checked_program({', '.join([f'{module_var}.{program.name}', *args])})"
    return f"if {module_var}.{program.name}({', '.join(args)}): {module_var}.raise_error({OUT_OF_MEMORY})"
