"""Compile-time blow-up (not a wrong result): chained channel shuffles (ShuffleNetV2's
view -> transpose -> view) make coil.symbolic.simplify_index take seconds to minutes; the
ShuffleNetV2 x0.5 inference graph spends 145 s of 150 in the scheduler (54 kernels) on a
loaded 2-core machine. Prints the compile time per number of chained shuffles."""
import time, torch
import torch.nn.functional as F

def shuffle(x, groups=2):
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)

W = torch.randn(24, 24, 1, 1)

def make(k):
    def f(x):  # ShuffleNetV2's stride-1 unit, k times: split, conv one half, concat, shuffle
        for _ in range(k):
            x1, x2 = x.chunk(2, dim=1)
            x = shuffle(torch.cat((x1, F.relu(F.conv2d(x2, W))), dim=1))
        return x
    return f

x = torch.randn(2, 48, 8, 8)
for k in (2, 4, 6, 8, 10):
    torch._dynamo.reset()
    f = make(k)
    t = time.perf_counter()
    out = torch.compile(f, backend="coil")(x)
    dt = time.perf_counter() - t
    print(f"{k} shuffles: compile+run {dt:6.2f} s, max abs diff {(out - f(x)).abs().max().item():.1e}", flush=True)
