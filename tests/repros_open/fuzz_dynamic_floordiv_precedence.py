"""Found by the fuzzer (tests/fuzz; a segfault that killed the fuzzing process): with
dynamic=True, index expressions that divide by a product print without parentheses, so C++
reads `x0 / (5*s75)` as `(x0 / 5) * s75` -- out-of-bounds reads: garbage values (silently) or
a segfault.

The fuzzer's program was `(a0 @ a2).cumprod(2)` with gradients (the cumprod backward's kernel
k6 read `arg5[... + 5*s75*s90*(x0 / 5*s75)]`). The smallest form below is forward only: a
permuted copy flattened into rows, with two symbolic dims.

COIL_DEBUG_DIR shows the forward kernel reading
`arg4[(x1 + ... + s0*s27*s53*(x0 / s27*s53))]`.

Cause: plugins/cpu_cpp/cpp.py `CppPrinter.floordiv` returns f"({a} / {b})" with `b`
unparenthesised; core/symbolic.py's `ExprPrinter.floordiv`/`mod` have the same shape
(`({a} // {b})`, `({a} % {b})`: Python and Triton parse `a // s0*s1` as `(a // s0) * s1`
too), which the Triton plugin inherits (TritonPrinter), and plugins/cuda_triton/indexing.py
`definition` writes `({expr} // {text(inner)})` and `({expr} % {text(extent)})` with
`inner`/`extent` products of ranges -- the same fault for symbolic sizes. Fix: parenthesise
the divisor whenever it is not a single atom (print it through `_factor`, or always wrap).
Static shapes fold the product into one integer, which is why only dynamic=True shows it.
Verified: patching CppPrinter.floordiv / ExprPrinter.floordiv and .mod to wrap the divisor
in parentheses makes this script and the CI fuzz test's failing program
(`F.group_norm(a0.square(), 1)` with gradients, dynamic=True: inf/NaN gradients) pass.
"""
import torch

def f(x):
    return (x.permute(0, 2, 1, 3) * 2).reshape(-1, x.shape[-1])


def g(a0):  # the CI fuzz test's minimal failing program (gradients inf/NaN)
    return torch.nn.functional.group_norm(a0.square(), 1)

x = torch.randn(4, 3, 5, 2)
ref = f(x)
torch._dynamo.reset()
out = torch.compile(f, backend="coil", dynamic=True)(x)
print("max diff", (ref - out).abs().max().item())
a = torch.randn(3, 3, 6, 2, generator=torch.Generator().manual_seed(3455)).requires_grad_()
gr = torch.autograd.grad(g(a).sum(), a)[0]
torch._dynamo.reset()
a2 = a.detach().clone().requires_grad_()
gc = torch.autograd.grad(torch.compile(g, backend="coil", dynamic=True)(a2).sum(), a2)[0]
print("group_norm grad max diff", (gr - gc).abs().nan_to_num(float("inf")).max().item())
