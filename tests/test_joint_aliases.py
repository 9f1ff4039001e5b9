"""``aten.alias`` nodes are taken out of the joint graph before partitioning
(:mod:`coil.joint_aliases`), so the partitioner sees the attention output as one value: a
ViT block's forward then saves it once and the backward recomputes its transposed copy (the
projection's input), as Inductor's graph does, instead of saving both."""
from __future__ import annotations

import torch
import torch._functorch.partitioners as partitioners
import torch.nn.functional as F
from torch import fx

from coil import config, joint_aliases

B, T, HEADS, DIM = 2, 24, 2, 32


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(B, T, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, T, DIM))


def _saved_bytes(monkeypatch, drop: bool) -> tuple[int, list[torch.Tensor]]:
    """Bytes of the tensors the forward graph saves, and the gradients (checked against eager)."""
    saved: list[int] = []
    base = partitioners.min_cut_rematerialization_partition

    def spy(joint, inputs, **kwargs):
        fw, bw = base(joint, inputs, **kwargs)
        outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        saved.append(sum(v.numel() * v.element_size() for o in outputs
                         if isinstance(o, fx.Node) and isinstance(v := o.meta.get("val"), torch.Tensor)))
        return fw, bw
    monkeypatch.setattr(partitioners, "min_cut_rematerialization_partition", spy)
    if not drop:
        monkeypatch.setattr(joint_aliases, "drop_aliases", lambda gm: 0)
    torch.manual_seed(0)
    net = _Attention()
    x = torch.randn(B, T, DIM)
    torch._dynamo.reset()
    with config.override(graph_cache=False):
        torch.compile(net, backend="coil")(x).square().sum().backward()
    grads = [p.grad for p in net.parameters()]
    ref = _Attention()
    ref.load_state_dict(net.state_dict())
    ref(x).square().sum().backward()
    for got, want in zip(grads, (p.grad for p in ref.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    monkeypatch.undo()
    return saved[0], grads


def test_the_attention_output_is_saved_once(monkeypatch):
    with_aliases, _ = _saved_bytes(monkeypatch, drop=False)
    without, _ = _saved_bytes(monkeypatch, drop=True)
    assert with_aliases - without == B * T * DIM * 4, (with_aliases, without)  # the projection's input


def test_an_alias_that_is_an_output_stays():
    graph = fx.Graph()
    x = graph.placeholder("x")
    kept = graph.call_function(torch.ops.aten.alias.default, (x,))
    dropped = graph.call_function(torch.ops.aten.alias.default, (x,))
    graph.output((kept, graph.call_function(torch.ops.aten.neg.default, (dropped,))))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    assert joint_aliases.drop_aliases(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.alias.default, torch.ops.aten.neg.default]
    t = torch.randn(3)
    a, b = gm(t)
    assert torch.equal(a, t) and torch.equal(b, -t)
