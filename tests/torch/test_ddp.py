"""`gradflow.torch.compile` inside `torch.nn.parallel.DistributedDataParallel` (gloo, 2 CPU processes).

One spawn of two workers serves both tests (`_trained`): each worker trains, on its half of every batch,
a compiled module wrapped in DDP (rank 1's starting state is shifted: DDP's broadcast of rank 0's state
must reach the compiled module) and, for the BatchNorm model, the eager module wrapped in DDP, and sends
back the resulting state. The build cache is shared through GRADFLOW_CACHE, so the second worker to reach
a structure finds it compiled.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

F64 = dict(rtol=1e-9, atol=1e-9)
WORLD, BATCH, STEPS, LR = 2, 8, 3, 0.1
DEADLINE_S = 600  # both workers compile two models' programs on a cold cache


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()


def _bn_mlp() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(),
                               torch.nn.Linear(5, 3)).double()


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(STEPS, BATCH, 4, dtype=torch.float64, generator=g),
            torch.randint(0, 3, (STEPS, BATCH), generator=g))


def _train(module: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> dict:
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(module(x), y).backward()
        opt.step()
    return _state(getattr(module, "module", module))  # a DDP wrapper's own names have a 'module.' prefix


def _state(module: torch.nn.Module) -> dict:
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def _worker(rank: int, rendezvous: str, cache: str, results) -> None:
    os.environ["GRADFLOW_CACHE"] = cache
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        import gradflow.torch as gt

        half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        out = {}
        for name, make, seed in (("mlp", _mlp, 2), ("bn", _bn_mlp, 3)):
            xs, ys = _data(seed)
            model = make()
            compiled = gt.compile(model, (xs[0, half],))
            if rank == 1:  # DDP's broadcast of rank 0's state at wrapping must reach the compiled module
                with torch.no_grad():
                    for t in model.state_dict().values():
                        t.add_(1)
            fast = torch.nn.parallel.DistributedDataParallel(compiled)
            _train(fast, xs[:, half], ys[:, half])
            out[name] = _state(model)
            if name == "bn":  # the eager module in DDP: BatchNorm statistics are per process, then broadcast
                out["bn_eager"] = _train(torch.nn.parallel.DistributedDataParallel(make()), xs[:, half], ys[:, half])
        results.put((rank, out))  # SimpleQueue.put writes to the pipe before it returns
    except BaseException:  # the parent reports a worker's failure with its traceback
        results.put((rank, traceback.format_exc()))
    finally:
        dist.destroy_process_group()
    # torch 2.13's gloo can abort at interpreter shutdown ("terminate called without an active exception":
    # 5 of 25 spawns of eager DDP alone, no gradflow involved); once the results are sent, skip the shutdown.
    os._exit(0)


@functools.cache
def _trained() -> dict[int, dict]:
    """Each rank's results, taken as soon as the rank sends them.

    A worker that aborts after sending (gloo's threads at teardown, see `_worker`) has done its part: only
    a rank that exits without its results, or a run past the deadline, fails the tests.
    """
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    got: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.environ.get("GRADFLOW_CACHE") or os.path.join(tmp, "cache")
        args = (os.path.join(tmp, "rendezvous"), cache, results)
        procs = [ctx.Process(target=_worker, args=(rank, *args), daemon=True) for rank in range(WORLD)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + DEADLINE_S
        try:
            while len(got) < WORLD:
                while not results.empty():
                    rank, out = results.get()
                    if isinstance(out, str):
                        raise AssertionError(f"DDP worker {rank} failed:\n{out}")
                    got[rank] = out
                dead = [r for r, p in enumerate(procs) if r not in got and not p.is_alive()]
                if dead and results.empty():  # drained after the exit: its results never came
                    raise AssertionError(f"DDP worker(s) {dead} exited without results "
                                         f"(exit codes {[procs[r].exitcode for r in dead]})")
                if time.monotonic() > deadline:
                    raise AssertionError(f"DDP workers gave {sorted(got)} of {WORLD} results in {DEADLINE_S} s")
                time.sleep(0.05)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                    p.join()
    return got


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(torch.as_tensor(got[k]), torch.as_tensor(want[k]), **F64, msg=k)


def test_ddp_matches_one_process_on_the_combined_batch():
    xs, ys = _data(2)
    want = _train(_mlp(), xs, ys)
    trained = _trained()
    for rank in range(WORLD):
        _assert_same(trained[rank]["mlp"], want)
    assert not torch.equal(torch.as_tensor(want["0.weight"]), _mlp().state_dict()["0.weight"])  # it trained


def test_ddp_batchnorm_buffers_follow_eager_ddp():
    trained = _trained()
    for rank in range(WORLD):
        _assert_same(trained[rank]["bn"], trained[rank]["bn_eager"])
    # DDP broadcasts rank 0's buffers before each forward: both ranks end with the statistics of the last step
    assert int(trained[0]["bn"]["1.num_batches_tracked"]) == STEPS
