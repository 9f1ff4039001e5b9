"""PyTorch's decomposition of ``multilabel_margin_loss`` gives a wrong loss under every
``torch.compile`` backend (found 2026-12-06, session 30, by a hunt against eager).

``torch._decomp.decompositions.multilabel_margin_loss_forward`` is registered as the op's
Python kernel for the Autograd key (``py_impl(DispatchKey.Autograd)``), so AOTAutograd's
tracing takes it whatever decomposition table the backend passes: Coil's, Inductor's and
``aot_eager``'s graphs all hold it. For targets that end a row with -1 (the op's documented
padding) it counts classes past the terminator: 2.05 for eager's 0.85 below, 5.1 for 0.
Keeping the op whole needs it wrapped before AOTAutograd sees it (a custom op with the
ATen backward); not done. Prints eager's loss and each backend's."""
import torch
import torch.nn.functional as F

x = torch.tensor([[0.1, 0.2, 0.4, 0.8]])
for target in ([[3, 0, -1, 1]], [[-1, 0, 0, 0]]):
    t = torch.tensor(target)
    row = [f"eager {F.multilabel_margin_loss(x, t).item():.4f}"]
    for backend in ("aot_eager", "coil"):
        torch._dynamo.reset()
        got = torch.compile(lambda x, t: F.multilabel_margin_loss(x, t), backend=backend)(x, t)
        row.append(f"{backend} {got.item():.4f}")
    print(target, ", ".join(row))
