"""Found by the fuzzer (tests/fuzz): with dynamic=True, the gradient of a pointwise function of
a channels_last input is wrong (forward right; dynamic=False right; contiguous input right).

    def f(a0): return torch.tanh(a0 / 2.0)      # a0: channels_last, requires_grad
    torch.compile(f, backend="coil", dynamic=True)

Cause (COIL_DEBUG_DIR): the forward kernel k0_div_tanh writes the saved tanh(a0/2) (buf1)
*contiguous* -- strides (s55*s75*s76, s55*s76, s76, 1) -- but the backward kernel
k0_mul_sub_div reads that saved tensor (its arg4) with *channels_last* strides
(x1 + x3*s75 + x2*s75*s76 + ...), the layout AOTAutograd recorded for it (eager's tanh of a
channels_last tensor is channels_last). With static sizes the forward writes channels_last and
the two agree. Best guess: the layout choice for computed buffers ("eager strides when dense,
else contiguous") does not recognise symbolic channels_last strides as dense and falls back
to contiguous, and nothing checks a graph input's real strides against the strides the
kernels were generated for (the backward graph's inputs are the forward's outputs): core
lowering's buffer layout choice and core/wrapper.py's input handling.
"""
import torch

def f(a0):
    return torch.tanh(a0 / 2.0)

shape = (2, 3, 4, 5)
x = torch.randn(shape, generator=torch.Generator().manual_seed(1970)).to(memory_format=torch.channels_last)
w = torch.randn(shape, generator=torch.Generator().manual_seed(5))
a = x.clone(memory_format=torch.preserve_format).requires_grad_()
ref = torch.autograd.grad((f(a) * w).sum(), a)[0]
a2 = x.clone(memory_format=torch.preserve_format).requires_grad_()
out = torch.compile(f, backend="coil", dynamic=True)(a2)
got = torch.autograd.grad((out * w).sum(), a2)[0]
print("forward max diff", (out - f(a)).abs().max().item())
print("grad max diff   ", (ref - got).abs().max().item())
