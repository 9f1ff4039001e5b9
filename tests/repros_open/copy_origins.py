"""Not a wrong result: a kernel that writes an input in place (AOT's copy_ epilogue) does not
list the ATen op inlined into the copy in its origins, so kernel names, coil.explain and the
self-check's producer all omit it (here: aten.mul.Tensor is missing, 'k0_copy_add')."""
import torch
import coil


def f(x, acc):
    acc.mul_(x)
    return x + 2


report = coil.explain(f, torch.randn(5), torch.full((5,), 3.0))
for k in report.kernels:
    print(k.name, k.ops)
print("aten.mul.Tensor listed:", any("aten.mul.Tensor" in k.ops for k in report.kernels))
