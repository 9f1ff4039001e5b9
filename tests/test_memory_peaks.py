"""Two rules that keep a training step's memory peak at or below Inductor's, each checked on
the wrapper Coil generates and against eager.

* A graph output computed from a large buffer and a reduction's result (a norm's normalized
  input, saved for the backward) is stored once, and its later users read the store
  (``coil.graph._stored_where_returned``). Recomputing it in each later kernel kept the large
  buffer alive: DeiT-tiny's forward peaked 30 MiB above Inductor's on the H200. The same
  holds for a concatenation of tokens that reads a patch embedding's output.
* A step near the end of a chain that only adds memory (a classifier's weight gradient)
  runs when nothing else is ready (``coil.memory_order.deferrable``): MobileNetV2's backward
  computed its 1000 x 1280 float32 weight gradient first and held it through the rest."""
from __future__ import annotations

import re

import torch

from coil import compile as coil_compile
from coil import config


def _compiled_reports(fn, *args: torch.Tensor, backward: bool = False) -> tuple[object, list]:
    reports: list[coil_compile.GraphReport] = []
    coil_compile.add_observer(reports.append)
    torch._dynamo.reset()
    try:
        with config.override(graph_cache=False):
            out = torch.compile(fn, backend="coil")(*args)
            if backward:
                out.square().sum().backward()
    finally:
        coil_compile.remove_observer(reports.append)
    return out, reports


def _kernel_args(lines: list[str]) -> list[tuple[int, set[str]]]:
    """(line index, the buffers passed) of each generated kernel's launch."""
    found = []
    for i, line in enumerate(lines):
        if re.match(r"\s*mod_\w+\.k\d+", line):
            found.append((i, set(re.findall(r"\b((?:arg|buf)\d+)\.data_ptr\(\)", line))))
    return found


def _centered_and_after(x, w):
    s = x - x.mean(-1, keepdim=True)
    h = torch.softmax(s, -1) @ w
    return s, h + s


def _biased_and_after(x, b, w):
    s = x * 3 + b  # a graph input's broadcast: stays inlined
    h = torch.softmax(s, -1) @ w
    return s, h + s


def _after_the_matmul(fn, *args: torch.Tensor) -> list[set[str]]:
    """Buffers each kernel after ``fn``'s matmul reads, checking ``fn`` against eager."""
    out, reports = _compiled_reports(fn, *args)
    for got, want in zip(out, fn(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    lines = reports[0].wrapper_source.splitlines()
    call = next(i for i, line in enumerate(lines) if re.match(r"\s*buf\d+ = c\d+\(buf\d+, arg\d\)", line))
    after = [reads for i, reads in _kernel_args(lines) if i > call]
    assert after, "\n".join(lines)
    return after


def test_a_stored_where_returned_value_is_read_back_after_a_library_call():
    torch.manual_seed(0)
    after = _after_the_matmul(_centered_and_after, torch.randn(64, 48), torch.randn(48, 48))
    # the kernel after the matmul reads the stored value, not the input it centres
    assert all("arg0" not in reads for reads in after), after


def _tokens_and_after(x, w0, cls, pos, w):
    p = x @ w0  # a library call's output, smaller than the tokens (a patch embedding)
    t = torch.cat([cls.expand(x.shape[0], -1, -1), p], 1) + pos
    h = torch.softmax(t, -1) @ w
    return t, h + t


def test_a_returned_token_concatenation_is_read_back_after_a_library_call():
    torch.manual_seed(0)
    args = (torch.randn(8, 16, 32), torch.randn(32, 32), torch.randn(1, 1, 32), torch.randn(1, 17, 32),
            torch.randn(32, 32))
    out, reports = _compiled_reports(_tokens_and_after, *args)
    for got, want in zip(out, _tokens_and_after(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    lines = reports[0].wrapper_source.splitlines()
    calls = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"\s*(buf\d+) = c\d+\(", line))]
    assert len(calls) >= 2, "\n".join(lines)
    embedded, last = calls[0][1], calls[-1][0]
    after = [reads for i, reads in _kernel_args(lines) if i > last]
    # the kernel after the second matmul reads the stored tokens, not the embedding again
    assert after and all(embedded not in reads for reads in after), "\n".join(lines)


def test_a_returned_value_with_a_broadcast_input_stays_inlined():
    torch.manual_seed(0)
    after = _after_the_matmul(_biased_and_after, torch.randn(64, 48), torch.randn(48), torch.randn(48, 48))
    assert any("arg0" in reads for reads in after), after


class _Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.head = torch.nn.Linear(64, 256), torch.nn.Linear(256, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc1(x)).mean(1))


def test_a_weight_gradient_that_only_adds_memory_runs_last():
    torch.manual_seed(0)
    net, ref = _Classifier(), _Classifier()
    ref.load_state_dict(net.state_dict())
    x = torch.randn(8, 128, 64)
    _, reports = _compiled_reports(net, x, backward=True)
    ref(x).square().sum().backward()
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)

    backward = next(r for r in reports if r.kind == "backward")
    lines = backward.wrapper_source.splitlines()
    # the head's weight gradient, 1000 x 256 float32 (the largest buffer of the backward),
    # comes after the activation gradient of the first layer (1024 x 256) has died
    head_grad = next(i for i, line in enumerate(lines)
                     if re.match(r"\s*buf\d+ = c\d+\(reinterpret\(arg\d+, \(1000, 8\)", line))
    activation = next(m.group(1) for line in lines
                      if (m := re.match(r"\s*(buf\d+) = new_\d+\(\(1024, 256\)", line)))
    freed = next(i for i, line in enumerate(lines) if line.strip() == f"del {activation}")
    assert freed < head_grad, "\n".join(lines)
    # one of the two 1 MiB blocks at a time, plus the small ones
    assert backward.peak_bytes < 1.5 * 2**20, backward.peak_bytes


class _Rms(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


class _FirstLayer(torch.nn.Module):
    """An embedding, one residual block and a head, as a decoder's first layer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.n1, self.n2 = torch.nn.Embedding(1000, 64), _Rms(64), _Rms(64)
        self.proj, self.head = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 1000, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        return self.head(self.n2(x + self.proj(self.n1(x))))


def test_the_first_residual_sum_is_recomputed_not_saved_in_float32():
    """With ``aten.embedding`` decomposed into an ``aten.index`` of the whole table, the
    partitioner saved the first residual sum (float32) where Inductor saves the projection's
    bf16 output and recomputes the sum (the Qwen2-like: 14 MiB at batch 16)."""
    torch.manual_seed(0)
    net = _FirstLayer()
    ids = torch.randint(0, 1000, (2, 32))
    fn = torch.compile(net, backend="coil")
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []
    torch._dynamo.reset()
    with config.override(graph_cache=False), torch.autocast("cpu", dtype=torch.bfloat16):
        fn(ids)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((tuple(t.shape), t.dtype)) or t,
                                                      lambda t: t):
            out = fn(ids)
        with torch.no_grad():
            torch.testing.assert_close(out, net(ids), rtol=2e-2, atol=2e-2)
    # the embedding's output only (the first norm's backward reads it)
    assert saved.count(((2, 32, 64), torch.float32)) == 1, saved


class _LookupNorm(torch.nn.Module):
    """An embedding read by a norm and a head, as T5's encoder begins. Its table has fewer
    than four rows per looked-up token (T5-small: 32128 rows, 8192 tokens at batch 16): the
    partitioner recomputes no op whose output is under a quarter of its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm = torch.nn.Embedding(100, 64), _Rms(64)
        self.head = torch.nn.Linear(64, 100, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(ids)))


def _saved_shapes(fn, *args: torch.Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((tuple(t.shape), t.dtype)) or t,
                                                  lambda t: t):
        out = fn(*args)
    out.float().square().mean().backward()
    return saved


def test_an_embedding_lookup_is_recomputed_from_the_ids_when_that_saves_more():
    """Kept whole, ``aten.embedding`` is never recomputed by the partitioner, so the norm's
    backward read a saved float32 copy of the lookup (T5-small: 16 and 8 MiB at batch 16 on the
    H200, its peak 24 MiB higher). Partitioned as an index gather too, the smaller saved set
    wins: the lookup is gathered again from the table and the ids, and the gradients agree."""
    torch.manual_seed(0)
    net = _LookupNorm()
    ids = torch.randint(0, 100, (2, 32))
    torch._dynamo.reset()
    with config.override(graph_cache=False), torch.autocast("cpu", dtype=torch.bfloat16):
        saved = _saved_shapes(torch.compile(net, backend="coil"), ids)
        grads = [p.grad.clone() for p in net.parameters()]
        net.zero_grad()
        _saved_shapes(net, ids)
    for got, want in zip(grads, [p.grad for p in net.parameters()]):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-4)
    # the table is kept (a parameter, alive anyway), the float32 lookup is not
    assert ((100, 64), torch.float32) in saved and ((2, 32, 64), torch.float32) not in saved, saved


def test_lookups_as_index_only_where_the_partitioner_could_recompute_them():
    """The second partition is made only for a lookup whose output is at least a quarter of
    its table's and ids' bytes (the partitioner never recomputes a smaller one); the copy
    gathers the same rows and leaves the traced graph as it was."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from coil.embedding_partition import as_index

    def lookup(w, i):
        return torch.ops.aten.embedding(w, i) * 2

    small_table, many_ids = torch.randn(10, 64), torch.randint(0, 10, (2, 32))
    traced = make_fx(lookup)(small_table, many_ids)
    copy = as_index(traced)
    assert copy is not None
    targets = [n.target for n in copy.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.index.Tensor in targets and torch.ops.aten.embedding.default not in targets
    assert torch.ops.aten.embedding.default in [n.target for n in traced.graph.nodes]
    torch.testing.assert_close(copy(small_table, many_ids), lookup(small_table, many_ids), rtol=0, atol=0)
    big_table, few_ids = torch.randn(1000, 64), torch.randint(0, 1000, (2, 4))
    assert as_index(make_fx(lookup)(big_table, few_ids)) is None
