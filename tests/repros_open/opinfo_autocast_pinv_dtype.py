"""Under CPU bfloat16 autocast, torch.linalg.pinv returns bfloat16 eagerly but float32 compiled.
Prints the dtypes and the max difference for eager, coil, aot_eager and inductor."""
import torch

torch.manual_seed(0)
a = torch.randn(5, 5)


def f(x):
    return torch.linalg.pinv(x)


with torch.autocast("cpu", dtype=torch.bfloat16):
    ref = f(a)
    print("eager", ref.dtype)
    for backend in ("coil", "aot_eager", "inductor"):
        torch._dynamo.reset()
        try:
            out = torch.compile(f, backend=backend)(a)
            print(backend, out.dtype, "max diff", (out.float() - ref.float()).abs().max().item())
        except Exception as exc:  # noqa: BLE001
            print(backend, "raised", type(exc).__name__, str(exc)[:200])
