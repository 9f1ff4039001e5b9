"""bf16 ``index_add``: eager's CPU kernel adds in float32 on some shapes and rounds each add on
others; Coil (which decomposes it to ``index_put(accumulate=True)``) rounds each add always
(found by a hunt, session 38). ``scatter_add`` and ``scatter_reduce("sum")`` add in float32 in
both; ``index_put(accumulate=True)`` rounds each add in both."""
import torch

import coil  # noqa: F401

torch.manual_seed(0)
n = 5000
idx = torch.randint(0, 4, (n,))
for shape, dim, src_shape in [((4,), 0, (n,)), ((4, 3), 0, (n, 3)), ((3, 4), 1, (3, n)), ((2, 4, 2), 1, (2, n, 2))]:
    base = torch.zeros(shape, dtype=torch.bfloat16)
    src = torch.full(src_shape, 0.5, dtype=torch.bfloat16)
    fn = lambda b, s: b.index_add(dim, idx, s)  # noqa: E731
    torch._dynamo.reset()
    eager, got = fn(base, src), torch.compile(fn, backend="coil")(base, src)
    print(shape, "dim", dim, "eager", eager.flatten()[:2].tolist(), "coil", got.flatten()[:2].tolist(),
          "equal" if torch.equal(eager, got) else "DIFFER")
