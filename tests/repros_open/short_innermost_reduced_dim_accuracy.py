"""The C++ plugin sums ``[40, 300000, 3]`` over dims (1, 2) 40x further from float64 than eager
(found by a hunt, session 38): the innermost reduced dim of 3 gets 2 lanes
(``plugins/cpu_cpp/reduction_loops._lanes_over_r``) and the third element of each row goes
to a lane of its own, so 900000 values run through two serial sums. The two reduced dims are
contiguous and could be one of 900000 before the lanes are chosen. Rounding only: exact on
integer-valued data, at any thread count."""
import torch

import coil  # noqa: F401

torch.manual_seed(0)
x = torch.randn(40, 300_000, 3) + 1
truth = x.double().sum((1, 2))
eager = x.sum((1, 2))
compiled = torch.compile(lambda x: x.sum((1, 2)), backend="coil")(x)
print(f"max error against float64: eager {(eager.double() - truth).abs().max().item():.3g}, "
      f"coil {(compiled.double() - truth).abs().max().item():.3g}")
