"""Eager's CUDA hardsigmoid and hardswish in float64 are off by about 1e-8 relative, the size
of a float32 1/6 (an H100, torch 2.11, session 42: 2.0e-8, 2.5e-8, 9.9e-9, 1.7e-8 at x = 1, 2,
-1, 0.5). The CPU kernels, PyTorch's decompositions and Coil give the float64 value. Needs a
CUDA GPU; prints the differences from the float64 formula."""
import torch

x = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64, device="cuda")
exact = (x + 3).clamp(0, 6) / 6
print("hardsigmoid - (x+3).clamp(0,6)/6:", (torch.nn.functional.hardsigmoid(x) - exact).tolist())
print("hardswish - x*(x+3).clamp(0,6)/6:", (torch.nn.functional.hardswish(x) - x * exact).tolist())
print("the same on the CPU:", (torch.nn.functional.hardsigmoid(x.cpu()) - exact.cpu()).tolist())
