"""float32 var/std/var_mean of data far from 0 (mean 1e4, spread 1e-2): Coil's one-pass
Welford keeps its running mean in float32 and is 2-4% off; eager on the CPU accumulates in
float64 (3e-8). A fix shifting the data by each row's first value (session 32, reverted in
f23aafa) made this exact but moved MobileNetV2's training gradients (109 of 159 outside the
model suite's tolerance): not understood yet."""
import torch

import coil  # noqa: F401

torch.manual_seed(0)
x = 1e4 + 1e-2 * torch.randn(4, 100_000)
ref = x.double().var(1)
eager, compiled = x.var(1), torch.compile(lambda x: x.var(1), backend="coil")(x)
print("relative error, eager", ((eager - ref) / ref).abs().max().item(),
      "coil", ((compiled - ref) / ref).abs().max().item())
