"""Coil under ``torch.distributed``: functional collectives in compiled graphs, DDP around a
Coil-compiled model, FSDP2 (``fully_shard``) with Coil-compiled blocks, and a rank whose
compile fails. Every result is compared with eager or with one process running the same
global batch.

In CI this runs on the CPU with gloo: 2 processes started by ``torch.multiprocessing`` on
127.0.0.1 (a free port, a hard timeout per job). One job runs every scenario and each test
checks what its scenario recorded. Checks that need one process only (gloo with a world of
one) are in ``tests/test_collectives.py``. For the multi-GPU run (NCCL, one GPU per rank):

    python tests/test_distributed.py --device cuda [--world N]

(or ``COIL_TEST_DEVICE=cuda pytest tests/test_distributed.py``)."""
from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

FUNCOL = torch.ops._c10d_functional
DEVICE = os.environ.get("COIL_TEST_DEVICE", "cpu")
WORLD = int(os.environ.get("COIL_TEST_WORLD", "2"))
#: Seconds a job of 2 CPU processes may take before it is killed and the test fails (a hang).
JOB_TIMEOUT = 180
TOL = {"rtol": 1e-4, "atol": 1e-5}
STEPS = 3


# ----------------------------------------------------------------------------- jobs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, scenarios: list[str], world: int, device: str, port: int, out: str) -> None:
    """One rank: join the group, run the scenarios in order, write what each recorded (or its
    error) to ``out/rank<r>.pkl``; re-raise the last error so the process fails."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
        torch.set_default_device(f"cuda:{rank}")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        torch.set_num_threads(1)  # 2 ranks share 2 cores in CI
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=JOB_TIMEOUT))
    results: dict[str, Any] = {}
    error: BaseException | None = None
    for name in scenarios:
        torch._dynamo.reset()
        t0 = time.perf_counter()
        try:
            results[name] = SCENARIOS[name](rank, world)
        except BaseException as exc:  # noqa: BLE001 - recorded for the parent, re-raised below
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            error = exc
        results[name + ":seconds"] = time.perf_counter() - t0
    with open(os.path.join(out, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(results, f)
    if error is None:
        dist.destroy_process_group()
    else:
        raise error


def run_job(scenarios: list[str], world: int = WORLD, device: str = DEVICE,
            timeout: float = JOB_TIMEOUT) -> tuple[list[dict[str, Any]], list[int | None], float]:
    """Run ``scenarios`` on ``world`` processes; every rank's records, exit codes, seconds.
    Processes still alive after ``timeout`` seconds are killed and the test fails: a hang."""
    out = tempfile.mkdtemp(prefix="coil-dist-")
    t0 = time.monotonic()
    ctx = mp.start_processes(_entry, args=(scenarios, world, device, _free_port(), out), nprocs=world,
                             join=False, start_method="spawn")
    try:
        while any(p.exitcode is None for p in ctx.processes):
            if time.monotonic() - t0 > timeout:
                pytest.fail(f"distributed job {scenarios} still running after {timeout} s: a hang")
            time.sleep(0.05)
    finally:
        for p in ctx.processes:
            if p.exitcode is None:
                p.kill()
            p.join()
    records = []
    for rank in range(world):
        path = Path(out, f"rank{rank}.pkl")
        records.append(pickle.loads(path.read_bytes()) if path.exists() else {})
    return records, [p.exitcode for p in ctx.processes], time.monotonic() - t0


def _check(records: list[dict[str, Any]], scenario: str) -> list[dict[str, Any]]:
    """Each rank's record of ``scenario``, failing the test with a rank's error if it had one."""
    out = []
    for rank, rec in enumerate(records):
        got = rec.get(scenario)
        assert got is not None, f"rank {rank} recorded nothing for {scenario}"
        assert "error" not in got, f"rank {rank}, {scenario}:\n{got['traceback']}"
        out.append(got)
    return out


def _close(actual: Any, expected: Any) -> str:
    """"ok", or why ``actual`` is not ``expected`` within float32 tolerance."""
    try:
        torch.testing.assert_close(actual, expected, **TOL)
    except AssertionError as exc:
        return str(exc)
    return "ok"


# ----------------------------------------------------------------------------- models


class MLP(nn.Module):
    def __init__(self, d_in: int = 32, hidden: int = 64, d_out: int = 8) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Residual(nn.Module):
    """An MLP block with a residual (FSDP2 shards each, Coil compiles each)."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.mlp = MLP(d, 4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


def _seeded(make: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return make()


def _batches(shape: tuple[int, ...], n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(shape, generator=g).to(torch.get_default_device()) for _ in range(n)]


def _train(model: nn.Module, batches: list[list[torch.Tensor]], rank: int, world: int,
           sync_off: Callable[[], Any] | None = None) -> list[float]:
    """``STEPS`` SGD steps; each step's micro-batches are global batches, of which this rank
    takes its share (all of them with ``world`` 1). ``sync_off`` skips the gradient
    synchronisation of every micro-batch but the last (DDP's ``no_sync``, FSDP2's
    ``set_requires_gradient_sync``). Returns each step's loss over the global batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for micro in batches:
        total = torch.zeros(())
        for i, x in enumerate(micro):
            local = x.chunk(world)[rank]
            last = i == len(micro) - 1
            with sync_off() if sync_off is not None and not last else contextlib.nullcontext():
                loss = model(local).pow(2).mean()
                loss.backward()
            total = total + loss.detach()
        if world > 1:
            dist.all_reduce(total)
            total = total / world
        opt.step()
        opt.zero_grad()
        losses.append(total.item())
    return losses


def _reference(make: Callable[[], nn.Module],
               batches: list[list[torch.Tensor]]) -> tuple[list[float], nn.Module]:
    """One process, eager, the whole global batch: the oracle."""
    model = _seeded(make)
    return _train(model, batches, 0, 1), model


# ----------------------------------------------------------------------------- scenarios


def _graph_reports() -> tuple[list[Any], Callable[[], None]]:
    from coil import compile as coil_compile
    graphs: list[Any] = []
    coil_compile.add_observer(graphs.append)
    return graphs, lambda: coil_compile.remove_observer(graphs.append)


def scenario_funcol(rank: int, world: int) -> dict[str, Any]:
    """Compiled functions around explicit functional collectives, against eager."""
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD.group_name
    out: dict[str, Any] = {}

    def overlap(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = fc.all_reduce(x, "sum", dist.group.WORLD)  # the public spelling
        z = torch.tanh(w @ w) * 2  # needs nothing from the all-reduce
        return y + 1, z

    def gather_scatter(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = FUNCOL.wait_tensor(FUNCOL.all_gather_into_tensor(x * 2, world, group))
        r = FUNCOL.wait_tensor(FUNCOL.reduce_scatter_tensor(g.sin(), "sum", world, group))
        return g.cos(), r + 1

    def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = FUNCOL.wait_tensor(FUNCOL.all_reduce(x, "avg", group))
        loss = torch.relu(y @ w).pow(2).mean()
        loss.backward()
        return loss

    torch.manual_seed(rank)
    x, w = torch.randn(16, 16), torch.randn(64, 64)
    graphs, stop = _graph_reports()
    try:
        got = torch.compile(overlap, backend="coil")(x, w)
        out["overlap"] = _close(got, overlap(x, w))
        out["overlap_wrapper"] = graphs[-1].wrapper_source
        out["overlap_collectives"] = [f"{f.op}: {f.reason}" for f in graphs[-1].fallbacks if f.kind == "collective"]
        xs = torch.randn(8, 4)
        out["gather_scatter"] = _close(torch.compile(gather_scatter, backend="coil")(xs), gather_scatter(xs))
        w1 = torch.randn(16, 8, requires_grad=True)
        w2 = w1.detach().clone().requires_grad_()
        loss = torch.compile(step, backend="coil")(x, w1)
        out["training"] = _close((loss, w1.grad), (step(x, w2), w2.grad))
        out["kinds"] = [g.kind for g in graphs]
    finally:
        stop()
    return out


def scenario_plugin_collective(rank: int, world: int) -> dict[str, Any]:
    """A backend that supplies its own collectives (``DeviceBackend.collective``): here one
    that counts its calls and hands them to torch's."""
    import coil
    from coil import plugins
    group = dist.group.WORLD.group_name
    device_type = torch.empty(0).device.type
    original = plugins.registry().backends[device_type]
    calls: dict[str, int] = {}

    class Counting(type(original)):  # type: ignore[misc]
        def collective(self, op: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                calls[op.name()] = calls.get(op.name(), 0) + 1
                return op(*args, **kwargs)
            return call

    def fn(x: torch.Tensor) -> torch.Tensor:
        return FUNCOL.wait_tensor(FUNCOL.all_reduce(x * 3, "sum", group)) - 1

    coil.register_backend_for_device(device_type, Counting(), name="counting-collectives")
    try:
        x = torch.randn(8) + rank
        return {"result": _close(torch.compile(fn, backend="coil")(x), fn(x)), "calls": calls}
    finally:
        coil.register_backend_for_device(device_type, original, name="counting-collectives")


def _ddp(make: Callable[[], nn.Module], rank: int) -> nn.Module:
    model = _seeded(make)
    # DDP's graph splitter wants the first bucket no larger than the others (1 MB)
    return nn.parallel.DistributedDataParallel(torch.compile(model, backend="coil"), bucket_cap_mb=1)


def _ddp_model() -> nn.Module:
    # 2.1 MB of parameters: two buckets, so DDP splits the graph in two (each way)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 16))


def _compare(losses: list[float], model: nn.Module, ref_losses: list[float], ref: nn.Module,
             params: Callable[[nn.Module], dict[str, torch.Tensor]]) -> dict[str, Any]:
    got = params(model)
    want = dict(ref.named_parameters())
    return {"losses": _close(torch.tensor(losses), torch.tensor(ref_losses)),
            "params": {k: _close(v.detach(), want[k].detach()) for k, v in got.items()}}


def _ddp_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in model.named_parameters()}


def scenario_ddp(rank: int, world: int) -> dict[str, Any]:
    batches = [[x] for x in _batches((8, 256), STEPS)]
    ref_losses, ref = _reference(_ddp_model, batches)
    graphs, stop = _graph_reports()
    try:
        model = _ddp(_ddp_model, rank)
        losses = _train(model, batches, rank, world)
    finally:
        stop()
    return {**_compare(losses, model, ref_losses, ref, _ddp_params), "kinds": [g.kind for g in graphs]}


def scenario_ddp_no_sync(rank: int, world: int) -> dict[str, Any]:
    """Gradient accumulation: two micro-batches a step, the first under ``no_sync``."""
    batches = [list(_batches((8, 256), 2, seed=10 + s)) for s in range(STEPS)]
    ref_losses, ref = _reference(_ddp_model, batches)
    model = _ddp(_ddp_model, rank)
    losses = _train(model, batches, rank, world, sync_off=model.no_sync)
    return _compare(losses, model, ref_losses, ref, _ddp_params)


def _fsdp(make: Callable[[], nn.Module], blocks: Callable[[nn.Module], list[nn.Module]]) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    model = _seeded(make)
    for block in blocks(model):
        block.compile(backend="coil")
        fully_shard(block)
    fully_shard(model)
    return model


def _fsdp_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k.replace("._orig_mod", ""): v.full_tensor() for k, v in model.named_parameters()}


def _mlp_stack() -> nn.Module:
    return nn.Sequential(Residual(32), Residual(32), nn.Linear(32, 8))


def _gpt_stack() -> nn.Module:
    from coil.demo import Block
    return nn.Sequential(Block(dim=32, heads=2), nn.Linear(32, 8))


def scenario_fsdp_mlp(rank: int, world: int) -> dict[str, Any]:
    """FSDP2 over Coil-compiled MLP blocks, with gradient accumulation
    (``set_requires_gradient_sync``) on the second and third steps."""
    batches = [[x] for x in _batches((8, 32), 1)]
    batches += [list(_batches((8, 32), 2, seed=20 + s)) for s in range(STEPS - 1)]
    ref_losses, ref = _reference(_mlp_stack, batches)
    graphs, stop = _graph_reports()
    try:
        model = _fsdp(_mlp_stack, lambda m: list(m)[:2])
        losses = _train(model, batches, rank, world, sync_off=lambda: _GradSyncOff(model))
    finally:
        stop()
    return {**_compare(losses, model, ref_losses, ref, _fsdp_params), "kinds": [g.kind for g in graphs]}


class _GradSyncOff:
    """FSDP2's ``no_sync``: no reduce-scatter until it is turned back on."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model.set_requires_gradient_sync(False)

    def __exit__(self, *exc: Any) -> None:
        self.model.set_requires_gradient_sync(True)


def scenario_fsdp_gpt(rank: int, world: int) -> dict[str, Any]:
    """FSDP2 over a Coil-compiled GPT block (layer norm, causal attention, GELU MLP)."""
    batches = [[x] for x in _batches((4, 8, 32), STEPS)]
    ref_losses, ref = _reference(_gpt_stack, batches)
    graphs, stop = _graph_reports()
    try:
        model = _fsdp(_gpt_stack, lambda m: [m[0]])
        losses = _train(model, batches, rank, world)
    finally:
        stop()
    return {**_compare(losses, model, ref_losses, ref, _fsdp_params), "kinds": [g.kind for g in graphs]}


def _fail_on_rank_1(kind: str) -> Callable[[], None]:
    """Make Coil's compile of ``kind`` graphs raise on rank 1; returns the undo."""
    from coil import compile as coil_compile
    real = coil_compile._compile_graph

    def failing(gm: Any, example_inputs: Any, config: Any, graph_kind: str, *rest: Any) -> Any:
        if graph_kind == kind and dist.get_rank() == 1:
            raise RuntimeError(f"injected failure compiling a {kind} graph")
        return real(gm, example_inputs, config, graph_kind, *rest)

    coil_compile._compile_graph = failing
    return lambda: setattr(coil_compile, "_compile_graph", real)


def _one_training_step_with_failure(kind: str, rank: int) -> dict[str, Any]:
    undo = _fail_on_rank_1(kind)
    try:
        model = _ddp(MLP, rank)
        model(torch.randn(4, 32)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - what each rank saw is the result
        return {"raised": f"{type(exc).__name__}: {exc}"}
    finally:
        undo()
    return {"raised": None}


def scenario_fail_forward(rank: int, world: int) -> dict[str, Any]:
    return _one_training_step_with_failure("forward", rank)


def scenario_fail_backward(rank: int, world: int) -> dict[str, Any]:
    """The backward graph compiles lazily, inside the backward pass, where DDP's all-reduces
    wait for every rank."""
    out = _one_training_step_with_failure("backward", rank)
    if out["raised"]:
        raise RuntimeError(out["raised"])  # the job fails, as it would without the catch
    return out


SCENARIOS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "funcol": scenario_funcol, "ddp": scenario_ddp, "ddp_no_sync": scenario_ddp_no_sync,
    "fsdp_mlp": scenario_fsdp_mlp, "fsdp_gpt": scenario_fsdp_gpt,
    "plugin_collective": scenario_plugin_collective,
    "fail_forward": scenario_fail_forward, "fail_backward": scenario_fail_backward,
}
#: One job runs them all (starting processes costs seconds), the failures last: they end it.
MAIN = ["funcol", "ddp", "ddp_no_sync", "fsdp_mlp", "fsdp_gpt", "plugin_collective", "fail_forward",
        "fail_backward"]


# ----------------------------------------------------------------------------- tests

needs_devices = pytest.mark.skipif(
    DEVICE == "cuda" and torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} GPUs")


@pytest.fixture(scope="module")
def job() -> tuple[list[dict[str, Any]], list[int | None]]:
    records, codes, seconds = run_job(MAIN)
    print(f"\ndistributed job: {seconds:.1f} s; per scenario (rank 0): "
          + ", ".join(f"{k.split(':')[0]} {v:.1f}" for k, v in records[0].items() if k.endswith(":seconds")))
    return records, codes


@needs_devices
def test_functional_collectives_match_eager(job):
    for rec in _check(job[0], "funcol"):
        assert rec["overlap"] == "ok", rec["overlap"]
        assert rec["gather_scatter"] == "ok", rec["gather_scatter"]
        assert rec["training"] == "ok", rec["training"]
        assert {"inference", "forward", "backward"} <= set(rec["kinds"])


@needs_devices
def test_wait_lands_after_independent_compute(job):
    """The all-reduce starts first; the kernel that needs nothing from it (and the matmul
    feeding that kernel) run before the wait; the kernel that reads the result runs after."""
    rec = _check(job[0], "funcol")[0]
    lines = rec["overlap_wrapper"].splitlines()

    def at(text: str) -> int:
        hits = [i for i, line in enumerate(lines) if text in line]
        assert hits, f"{text!r} not in the wrapper:\n{rec['overlap_wrapper']}"
        return hits[0]

    start, wait = at("# start _c10d_functional.all_reduce"), at("# wait for")
    tanh, add = at("_tanh"), at("_add(")
    assert start < tanh < wait < add, rec["overlap_wrapper"]
    placed = [c for c in rec["overlap_collectives"] if "all_reduce" in c.split(":")[0]]
    assert placed and "in flight" in placed[0] and "tanh" in placed[0], rec["overlap_collectives"]


@needs_devices
def test_plugin_supplies_collectives(job):
    for rec in _check(job[0], "plugin_collective"):
        assert rec["result"] == "ok", rec["result"]
        assert rec["calls"] == {"_c10d_functional::all_reduce": 1, "_c10d_functional::wait_tensor": 1}, rec["calls"]


def _assert_trained_alike(rec: dict[str, Any]) -> None:
    assert rec["losses"] == "ok", rec["losses"]
    bad = {k: v for k, v in rec["params"].items() if v != "ok"}
    assert not bad, bad


@needs_devices
def test_ddp_matches_one_process(job):
    for rec in _check(job[0], "ddp"):
        _assert_trained_alike(rec)
        assert rec["kinds"].count("forward") >= 2, rec["kinds"]  # DDP split the graph at buckets


@needs_devices
def test_ddp_gradient_accumulation_no_sync(job):
    for rec in _check(job[0], "ddp_no_sync"):
        _assert_trained_alike(rec)


@needs_devices
def test_fsdp2_mlp_blocks_with_accumulation(job):
    for rec in _check(job[0], "fsdp_mlp"):
        _assert_trained_alike(rec)
        assert {"forward", "backward"} <= set(rec["kinds"])


@needs_devices
def test_fsdp2_gpt_block(job):
    for rec in _check(job[0], "fsdp_gpt"):
        _assert_trained_alike(rec)
        assert {"forward", "backward"} <= set(rec["kinds"])


@needs_devices
def test_failed_compile_fails_every_rank(job):
    """Rank 1 raises while compiling a forward graph (then, in the same processes, a backward
    graph, which compiles inside the backward pass where DDP's all-reduces wait for every
    rank): every rank fails, rank 0 with an error naming rank 1, and the job ends instead of
    hanging in a collective (``run_job`` fails the test on a hang)."""
    records, codes = job
    assert all(code not in (0, None) for code in codes), codes
    for kind in ("forward", "backward"):
        seen = [rec.get(f"fail_{kind}", {}) for rec in records]
        raised = [s.get("raised") or s.get("error", "") for s in seen]
        assert f"injected failure compiling a {kind} graph" in raised[1], raised
        assert "DistributedCompileError" in raised[0] and "rank 1 failed to compile" in raised[0], raised
        assert f"injected failure compiling a {kind} graph" in raised[0], raised


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--world", type=int, default=2, help="processes (one GPU each with cuda)")
    opts, rest = parser.parse_known_args()
    os.environ["COIL_TEST_DEVICE"] = opts.device
    os.environ["COIL_TEST_WORLD"] = str(opts.world)
    sys.exit(pytest.main([__file__, "-v", *rest]))
