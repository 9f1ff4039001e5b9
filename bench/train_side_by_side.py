"""Training steps of one model through several backends in one process, timed in turns.

``bench/models.py`` runs each backend in its own process, which is what a user sees on a
first call; but a training step that the host bounds (ResNet-18, ViT-tiny at batch 64 on the
H200) varies by 20-50% from process to process on a shared host. Here every backend's step
runs in the same process, in rounds that rotate which backend goes first, so drift in the
host's speed falls on all of them alike; the figure is the median over the rounds.

Per backend: the first call (Dynamo and the compile), the first step's loss and gradients
against eager's (``tests/models/check.py``'s tolerances for the precision), the median and the
fastest ms per step, the step's peak memory above what was allocated before it (the other
backends' models included in that base, so only the step's own working set counts), and
with ``--top`` the GPU's busiest kernels (CUDA only).

    python3 bench/train_side_by_side.py hf_gpt2 --device cuda --backends eager,inductor,coil

A step is ``zero_grad(set_to_none=True)``, forward and loss under bf16 autocast (float32
with ``--precision fp32``), backward, and an SGD step, as in ``bench/models.py``; cuDNN's
TF32 is off, as there. ``--mode infer`` times an inference call instead: the model in
``eval()``, its forward under ``no_grad`` (and bf16 autocast unless ``--precision fp32``),
the outputs checked against eager's. On the CPU, ``--threads`` sets torch's thread count:

    python3 bench/train_side_by_side.py hf_gpt2 --device cpu --size small --precision fp32 --threads 1

A backend named ``NAME-freezing`` (``coil-freezing``, ``inductor-freezing``) is ``NAME`` with
``options={"freezing": True}``: parameters as constants in inference graphs (``--mode infer``).

    python3 bench/train_side_by_side.py tv_resnet18 --device cpu --size small --precision fp32 \
        --mode infer --backends eager,inductor-freezing,coil,coil-freezing"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from models import check, imports, zoo  # noqa: E402


def compiled(model: torch.nn.Module, backend: str) -> Any:
    """``model`` itself for ``eager``, else compiled; ``NAME-freezing`` is ``NAME`` with the
    ``freezing`` option on."""
    if backend == "eager":
        return model
    name, _, variant = backend.partition("-")
    if variant not in ("", "freezing"):
        raise SystemExit(f"unknown backend variant {backend!r} (NAME or NAME-freezing)")
    if name != "inductor" or not variant:
        return torch.compile(model, backend=name, options={"freezing": True} if variant else None)
    # Inductor reads its freezing flag outside what options= patches (torch 2.13: ResNet-18
    # ran 28 ms per call with the option, 9.5 ms with the flag set), so its compile, in the
    # first call, runs with the flag set, and without Inductor's caches, whose keys miss the
    # flag; options= still makes it a backend of its own, whose frames Dynamo compiles anew
    # (with the same backend, a model of the same class reuses the frames compiled earlier)
    fn = torch.compile(model, backend=name, options={"freezing": True})
    first = [True]

    def call(*args: Any, **kwargs: Any) -> Any:
        if not first:
            return fn(*args, **kwargs)
        first.clear()
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
        with inductor_config.patch(freezing=True, fx_graph_cache=False), \
                functorch_config.patch(enable_autograd_cache=False):
            return fn(*args, **kwargs)
    return call


def make_step(built: zoo.Built, backend: str, device: torch.device,
              bf16: bool = True) -> tuple[Callable[[], None], list]:
    """A training step on a fresh copy of the model; the list gets the first step's loss and
    gradients."""
    model = copy.deepcopy(built.model).train()
    fn = compiled(model, backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kwargs = {**built.kwargs, **built.train_kwargs}
    first: list[list[tuple[str, torch.Tensor]]] = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = built.loss_fn(fn(*built.args, **kwargs))
        loss.backward()
        if not first:
            first.append([("loss", loss.detach().clone())] + [
                (n, p.grad.clone()) for n, p in model.named_parameters() if p.grad is not None])
        opt.step()
    return step, first


def make_infer(built: zoo.Built, backend: str, device: torch.device,
               bf16: bool = True) -> tuple[Callable[[], None], list]:
    """An inference call on a fresh copy of the model in ``eval()`` under ``no_grad`` (as
    ``bench/models.py``'s ``infer`` modes call it); the list gets the first call's outputs."""
    model = copy.deepcopy(built.model).eval()
    fn = compiled(model, backend)
    first: list[list[tuple[str, torch.Tensor]]] = []

    def call() -> None:
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = fn(*built.args, **built.kwargs)
        if not first:
            first.append([(n, t.detach().clone()) for n, t in check.flatten_output(out)])
    return call, first


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=zoo.names())
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="real", choices=("small", "real"))
    parser.add_argument("--backends", default="eager,inductor,coil")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per backend per round")
    parser.add_argument("--top", type=int, default=0, help="busiest GPU kernels to list per backend")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"),
                        help="bf16 autocast (the default) or plain float32")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    parser.add_argument("--mode", default="train", choices=("train", "infer"),
                        help="a training step (the default) or an inference call in eval() "
                             "under no_grad")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = args.precision == "bf16"
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.backends.cudnn.allow_tf32 = False
    for package in ("transformers", "timm", "torchvision"):
        imports.import_optional(package)
    with torch.device(device):
        built = zoo.build(args.model, args.size)
    backends = args.backends.split(",")
    steps: dict[str, Callable[[], None]] = {}
    firsts: dict[str, list] = {}
    for b in backends:
        began = time.perf_counter()
        make = make_infer if args.mode == "infer" else make_step
        steps[b], firsts[b] = make(built, b, device, bf16)
        steps[b]()
        sync()
        print(f"{b}: first call {time.perf_counter() - began:.1f} s", flush=True)
        for _ in range(3):
            steps[b]()
    if "eager" in firsts:
        reference = firsts["eager"][0]
        for b in backends:
            if b == "eager":
                continue
            got = dict(firsts[b][0])
            tolerance = check.BF16_AUTOCAST if bf16 else check.FP32
            diffs = [check.compare(n, got.get(n), ref, tolerance) for n, ref in reference]
            wrong = [d for d in diffs if not d.ok]
            cosine = min((d.cosine for d in diffs if d.cosine == d.cosine), default=float("nan"))
            print(f"{b}: {len(diffs) - len(wrong)} of {len(diffs)} tensors within tolerance, smallest "
                  f"cosine {cosine:.4f}" + (f"; first outside: {wrong[0].describe()}" if wrong else ""))
    times: dict[str, list[float]] = {b: [] for b in backends}
    for r in range(args.rounds):
        for b in backends[r % len(backends):] + backends[:r % len(backends)]:
            sync()
            began = time.perf_counter()
            for _ in range(args.steps):
                steps[b]()
            sync()
            times[b].append(1e3 * (time.perf_counter() - began) / args.steps)
    unit = "call" if args.mode == "infer" else "step"
    print(f"| model | backend | ms per {unit} (median) | fastest round | step peak MiB |{' GPU busy ms |' if cuda else ''}")
    print(f"| --- | --- | ---: | ---: | ---: |{' ---: |' if cuda else ''}")
    for b in backends:
        peak = _peak_mib(steps[b], cuda, sync)
        busy, top = _gpu_busy(steps[b], args.top) if cuda else (None, [])
        print(f"| {args.model} | {b} | {statistics.median(times[b]):.2f} | {min(times[b]):.2f} | {peak} |"
              + (f" {busy:.2f} |" if busy is not None else ""))
        for line in top:
            print(f"    {line}")


def _peak_mib(step: Callable[[], None], cuda: bool, sync: Callable[[], Any]) -> str:
    if not cuda:
        return "-"
    sync()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _ in range(2):
        step()
    sync()
    return f"{(torch.cuda.max_memory_allocated() - base) / 2**20:.0f}"


def _gpu_busy(step: Callable[[], None], top: int, calls: int = 3) -> tuple[float, list[str]]:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0),
                    key=lambda e: -e.self_device_time_total)
    busy = sum(e.self_device_time_total for e in events) / calls / 1e3
    return busy, [f"{e.self_device_time_total / calls / 1e3:7.3f} ms {e.count // calls:4d}x  {e.key[:80]}"
                  for e in events[:top]]


if __name__ == "__main__":
    main()
