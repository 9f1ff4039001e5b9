"""Host programs (:mod:`coil.sdk.programs`) as C++: one ``extern "C"`` function per program,
in the graph's translation unit after its kernels, that takes the addresses of the
program's parameters, allocates its scratch memory once for the call, calls the kernels'
functions in order and stops at the first kernel that reports an error. It returns
``coil::kernel_error``: non-zero, the wrapper's ``check_errors`` raises it, as after a lone
launch (one call across in the usual case)."""
from __future__ import annotations

from typing import Callable, Sequence

import coil.sdk as sdk
from coil.sdk.canonical import PLACEHOLDER, digest_name

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
                  "    __atomic_fetch_or(&coil::kernel_error, coil::OUT_OF_MEMORY, __ATOMIC_RELAXED);",
                  "    return coil::OUT_OF_MEMORY;",
                  "  }"]
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
    lines += ["  return __atomic_load_n(&coil::kernel_error, __ATOMIC_RELAXED);", "}"]
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


def call_line(module_var: str, program: sdk.HostProgram) -> str:
    """The wrapper's line: the program's function with its parameters' addresses, then the
    module's error check where it reports one."""
    call = f"{module_var}.{program.name}({', '.join(f'{p}.data_ptr()' for p in program.params)})"
    return f"if {call}: {module_var}.check_errors()"
