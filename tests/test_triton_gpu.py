"""The Triton plugin on a real GPU: CUDA-graph replay, unaligned inputs, the tuning cache and
split reductions. Skipped without CUDA (CI has none; the differential tests run on CUDA with
``COIL_TEST_DEVICE=cuda``)."""
from __future__ import annotations

import glob
import os

import pytest
import torch

import coil

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_reduce_overhead_replays_and_keeps_results():
    def f(x, y):
        return torch.relu(x * 2 + y).sum(-1), x - y

    fn = torch.compile(f, backend="coil", mode="reduce-overhead")
    results = []
    inputs = [(torch.randn(8, 64, device="cuda"), torch.randn(8, 64, device="cuda")) for _ in range(4)]
    for x, y in inputs:
        results.append(fn(x, y))
    for (x, y), got in zip(inputs, results):  # earlier results were not overwritten by replays
        torch.testing.assert_close(got, f(x, y))


class _Chain(torch.nn.Module):
    """Many tiny layers: the host, not the GPU, bounds a call (graph_capture=auto keeps a replay)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(24))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(32) for _ in range(24))

    def forward(self, x):
        for lin, norm in zip(self.layers, self.norms):
            x = torch.sin(norm(lin(x))) + x
        return x


def test_auto_capture_replays_host_bound_inference_with_parameters_in_place():
    from coil.report import recording
    model = _Chain().cuda().eval()
    xs = [torch.randn(16, 32, device="cuda") for _ in range(4)]
    with torch.no_grad(), recording() as rep:
        torch._dynamo.reset()
        fn = torch.compile(model, backend="coil")
        first = fn(xs[0])  # runs as compiled: the second call records and measures
        note = rep.graphs[0].capture
        assert note.replay is not None and "recorded on the second call" in str(note), str(note)
        assert rep.graphs[0].stage_seconds["first run"] > 0, rep.graphs[0].stage_seconds
        outs = [fn(x) for x in xs]
        assert "replayed" in str(note), str(note)
        torch.testing.assert_close(first, model(xs[0]), rtol=1e-4, atol=1e-4)
        for x, got in zip(xs, outs):  # earlier results were not overwritten by replays
            torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
        model.layers[3].weight.mul_(0.5)  # updated in place: the replay reads the parameter itself
        torch.testing.assert_close(fn(xs[0]), model(xs[0]), rtol=1e-4, atol=1e-4)
        model.layers[5].weight = torch.nn.Parameter(torch.randn(32, 32, device="cuda"))  # moved
        torch.testing.assert_close(fn(xs[1]), model(xs[1]), rtol=1e-4, atol=1e-4)


def _explain_twice(fn, *args):
    """``coil.explain`` over two calls: ``graph_capture=auto`` records and measures on a
    graph's second call."""
    from coil.report import recording
    with recording() as rep:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="coil")
        compiled(*args)
        rep.result = compiled(*args)
    return rep


def test_auto_capture_skips_training_and_large_kernels():
    model = _Chain().cuda()
    x = torch.randn(16, 32, device="cuda", requires_grad=True)
    rep = coil.explain(model, x)
    assert all(g.capture is None or g.capture.replay is None for g in rep.graphs)
    with torch.no_grad():  # one large kernel: the launch is not the bottleneck, the copies cost
        big = torch.randn(8192, 8192, device="cuda")
        rep = _explain_twice(lambda t: t * 2 + 1, big)
        note = str(rep.graphs[0].capture)  # GPU-bound (its launch is some 50 µs against 0.1 ms of
        assert "not used" in note, note     # GPU work: either test of graphs.py may turn it down)
        torch.testing.assert_close(rep.result, big * 2 + 1)


def test_auto_capture_counts_the_copies_of_inputs_passed_as_arguments():
    # A decode-like product with its weight an argument, not a parameter: a replay copies the
    # 112 MiB weight into the recording on every call (about 56 µs on the H200 against a 33 µs
    # product), so its measurement, which pays the copies as a real call does, turns it down.
    def f(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))

    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) * 4096 ** -0.5
    b = torch.randn(14336, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        rep = _explain_twice(f, x, w, b)
    note = str(rep.graphs[0].capture)
    assert "not used" in note, note
    torch.testing.assert_close(rep.result, f(x, w, b), rtol=2e-2, atol=2e-2)


def test_replays_from_several_threads_and_streams_keep_their_own_inputs():
    import threading
    model = _Chain().cuda().eval()
    fn = torch.compile(model, backend="coil", mode="reduce-overhead")
    xs = [torch.randn(16, 32, device="cuda") for _ in range(8)]
    got: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        with torch.no_grad(), torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(5):
                got[i] = fn(xs[i])
            torch.cuda.current_stream().synchronize()

    with torch.no_grad():
        fn(xs[0])  # records
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with torch.no_grad():
        for i, x in enumerate(xs):
            torch.testing.assert_close(got[i], model(x), rtol=1e-4, atol=1e-4)


def test_capture_with_dropout_draws_new_numbers_each_replay():
    x = torch.ones(64, 64, device="cuda")
    fn = torch.compile(lambda t: torch.nn.functional.dropout(t, 0.5) + 1, backend="coil",
                       mode="reduce-overhead")
    with torch.no_grad():
        outs = [fn(x) for _ in range(4)]
    assert not torch.equal(outs[2], outs[3])
    assert all(set(o.unique().tolist()) <= {1.0, 3.0} for o in outs)


def test_unaligned_view_inputs():
    base = torch.randn(4097, device="cuda")
    x = base[1:]  # data pointer 4 bytes past an aligned one
    fn = torch.compile(lambda t: t * 3 + 1, backend="coil")
    torch.testing.assert_close(fn(x), x * 3 + 1)
    torch.testing.assert_close(fn(base[:4096]), base[:4096] * 3 + 1)


def test_tuning_winner_is_cached_on_disk(tmp_path):
    with coil.config.override(cache_dir=str(tmp_path)):
        x = torch.randn(4096, 1000, device="cuda")
        r = coil.explain(lambda t: torch.softmax(t, -1), x)
        torch.testing.assert_close(r.result, torch.softmax(x, -1))
    assert glob.glob(os.path.join(str(tmp_path), "triton-autotune", "*.json"))


def test_split_column_reduction_and_long_rows():
    x = torch.randn(16384, 256, device="cuda")
    r = coil.explain(lambda t: t.sum(0), x)
    assert "_combine" in r.kernels[0].source
    torch.testing.assert_close(r.result, x.sum(0), atol=1e-3, rtol=1e-4)
    logits, target = torch.randn(64, 40000, device="cuda"), torch.randint(0, 40000, (64,), device="cuda")
    torch._dynamo.reset()
    r = coil.explain(lambda a, t: torch.nn.functional.cross_entropy(a, t), logits, target)
    torch.testing.assert_close(r.result, torch.nn.functional.cross_entropy(logits, target))


def test_index_out_of_range_stops_with_a_device_assert():
    """As eager's CUDA kernels and Inductor's: an out-of-range index read from memory stops the
    kernel instead of reading memory it does not index. The assert leaves the CUDA context
    unusable, so it runs in a process of its own."""
    import subprocess
    import sys
    code = (
        "import torch, torch.nn.functional as F, coil\n"
        "w = torch.randn(10, 4, device='cuda')\n"
        "fn = torch.compile(lambda w, i: F.embedding(i, w) * 2, backend='coil')\n"
        "good = torch.tensor([1, 9, 0], device='cuda')\n"
        "torch.testing.assert_close(fn(w, good), F.embedding(good, w) * 2)\n"
        "print('in range ok', flush=True)\n"
        "fn(w, torch.tensor([1, 12, 3], device='cuda'))\n"
        "torch.cuda.synchronize()\n"
        "print('NOT STOPPED', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "in range ok" in done.stdout, done.stderr[-2000:]
    assert done.returncode != 0 and "NOT STOPPED" not in done.stdout, done.stdout
    assert "device-side assert" in done.stderr or "index out of bounds" in done.stderr, done.stderr[-2000:]


def test_cpu_scalars_cpu_indices_and_cpu_constants_reach_cuda_kernels_as_in_eager():
    """Eager lets a CUDA op read a 0-dim CPU tensor and CPU index tensors; Coil's kernels read
    them through a host pointer (an illegal address, session 31) until ``coil.foreign_operands``."""
    x = torch.randn(64, device="cuda")
    s, i = torch.tensor(2.5), torch.tensor([3, 1, 60])
    cases = [(lambda x, s: x * s + 1, (x, s)), (lambda x, s: x <= s, (x, s)), (lambda x, s: s - x, (x, s)),
             (lambda x, i: x[i] * 2, (x, i)),
             (lambda x: x.to(torch.bfloat16) <= torch.tensor(3.3), (x,))]
    for mode in (None, "reduce-overhead"):
        for f, args in cases:
            torch._dynamo.reset()
            fn = torch.compile(f, backend="coil", mode=mode)
            for _ in range(3):  # a replay reads the constant too
                got = fn(*args)
            torch.testing.assert_close(got, f(*args))
            assert got.device.type == "cuda"
