# Silent wrong output: a compiled module that (1) updates spectral_norm's power-iteration
# buffers and (2) calls nn.Embedding(max_norm=...) (renormalises its weight in place),
# returns for a third, unrelated output a tensor of the wrong shape/values.
import os; os.environ.setdefault("COIL_GRAPH_CACHE", "0")
import copy, torch, torch.nn as nn
from torch.nn.utils import parametrizations as P
import coil  # noqa
torch.manual_seed(0)

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.sn = P.spectral_norm(nn.Linear(5, 3))      # train mode: updates buffer _u (3,), _v (5,)
        self.emb = nn.Embedding(7, 5, max_norm=1.0)       # renormalises rows of its weight in place
        self.emb2 = nn.Embedding(7, 5)

    def forward(self, v):
        ids = torch.tensor([0, 3, 3, 6])
        a = self.sn(v)
        b = self.emb(ids)
        return self.emb2(ids)

m = M()
x = torch.randn(2, 5)
want = copy.deepcopy(m)(x)
for be in ["coil", "inductor", "aot_eager", "eager"]:
    for grad in [True, False]:
        torch._dynamo.reset()
        mc = copy.deepcopy(m)
        with torch.set_grad_enabled(grad):
            try:
                got = torch.compile(mc, backend=be)(x)
            except Exception as ex:
                print(f"{be:10s} grad={grad}: CRASH {type(ex).__name__}: {str(ex)[:200]}"); continue
        if got.shape != want.shape:
            print(f"{be:10s} grad={grad}: WRONG shape {tuple(got.shape)} (eager {tuple(want.shape)}); value {got.detach()}")
        else:
            print(f"{be:10s} grad={grad}: shape ok, max|diff| = {(got - want).abs().max().item():.3e}")
print("sn._u:", dict(mc.sn.parametrizations.weight[0].named_buffers())["_u"])
