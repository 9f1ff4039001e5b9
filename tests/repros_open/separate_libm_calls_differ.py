"""The CPU plugin's two math libraries (vector libmvec in vectorised loops, scalar libm
elsewhere) may give different last bits, so two separate computations of one function can
compare unequal where eager's (one code path per shape) agree. Prints both results."""
import torch

x = torch.randn((2, 2), dtype=torch.float64, generator=torch.Generator().manual_seed(2203))


def f(a):
    return a.sin() == a.sin().topk(2, dim=-1).values[..., -1:]  # two sin nodes


print("eager   ", f(x).tolist())
print("compiled", torch.compile(f, backend="coil")(x).tolist())
