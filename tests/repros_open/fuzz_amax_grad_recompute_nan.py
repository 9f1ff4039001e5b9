"""Found by the fuzzer (tests/fuzz): amax's gradient is NaN everywhere when its input is a
transcendental Coil recomputes (float64 tanh here).

The forward kernel (COIL_DEBUG_DIR: graph0, k0_tanh_amax_eq) computes tanh(x) twice, in two
loops: inside the max reduction's `omp simd` lane loop, and again in the mask loop
`tanh(x) == amax` (`parallel for simd collapse(2)`). One of them runs glibc's vector tanh
(libmvec, declared `omp declare simd` by plugins/cpu_cpp/toolchain.py) and the other the
scalar std::tanh; they differ by 1 ulp (checked with a 10-line C program on these four
inputs: all four differ), so the mask is all False, the backward's count is 0 and
grad = g / 0 * mask * (1 - tanh^2) = NaN. float32 happened to agree here.
Likely fix: a value that an equality (or any discontinuous op) compares against a reduction of
the same value must not be recomputed in a differently vectorised loop -- stash it (as
plugins/cpu_cpp/stash.py does for softmax's exp) or compute both with the same variant;
the general form is "recomputation must be bitwise identical" (plugins/cpu_cpp codegen /
the scheduler's fusion of `eq` with a recompute of the reduction's input).
"""
import torch

x = torch.randn((2, 2), generator=torch.Generator().manual_seed(2203)).double()

def f(a):
    return torch.tanh(a).amax()

a = x.clone().requires_grad_()
ref = torch.autograd.grad(f(a), a)[0]
a2 = x.clone().requires_grad_()
got = torch.autograd.grad(torch.compile(f, backend="coil")(a2), a2)[0]
print("eager grad   ", ref.flatten().tolist())
print("compiled grad", got.flatten().tolist())
print("max diff", (ref - got).abs().nan_to_num(float("inf")).max().item())
