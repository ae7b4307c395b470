"""Data-parallel training of a `gradflow.torch.compile`d model with `DistributedDataParallel`.

Two CPU processes (gloo backend, started with `torch.multiprocessing.spawn`) each run the compiled module
on their half of every batch; DDP averages the gradients gradflow's backward produced and broadcasts the
BatchNorm buffers, exactly as for an eager module. Both processes compile the same structure; the second
finds it in the shared build cache (GRADFLOW_CACHE). At the end, rank 0 compares its parameters with one
process training the eager module on the whole batches (the same up to rounding when the model has no
BatchNorm: batch statistics are per process under DDP).

    OMP_NUM_THREADS=1 python examples/train_ddp.py
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

WORLD, BATCH, STEPS = 2, 64, 10


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 5)).double()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable task: the class is the argmax of a fixed linear map of the input."""
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(20, 5, generator=g, dtype=torch.float64)
    xs = [torch.randn(BATCH, 20, generator=g, dtype=torch.float64) for _ in range(STEPS)]
    return [(x, (x @ teacher).argmax(1)) for x in xs]


def train(model: torch.nn.Module, data, rank: int = 0, world: int = 1, log: bool = False) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    part = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    for k, (x, y) in enumerate(data):
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x[part]), y[part])
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        if log:
            ms = 1e3 * (time.perf_counter() - start)
            print(f"step {k:>2}  loss on rank {rank}'s half {loss.item():.6f}  {ms:6.2f} ms"
                  + ("  (builds the forward+backward)" if k == 0 else ""))


def worker(rank: int, rendezvous: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        import gradflow.torch as gt

        model = mlp()
        data = batches()
        start = time.perf_counter()
        ddp = torch.nn.parallel.DistributedDataParallel(gt.compile(model, (data[0][0][: BATCH // WORLD],)))
        dist.barrier()
        if rank == 0:
            print(f"rank 0: compiled and wrapped in DDP in {time.perf_counter() - start:.1f} s")
        train(ddp, data, rank, WORLD, log=rank == 0)
        if rank == 0:
            results.put({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})
    finally:
        dist.destroy_process_group()


def main() -> None:
    results = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(os.path.join(tmp, "rendezvous"), results), nprocs=WORLD)
    ddp_state = results.get()
    single = mlp()
    train(single, batches())
    diff = max(abs(torch.from_numpy(ddp_state[k]) - v.detach()).max().item() for k, v in single.state_dict().items())
    print(f"\nlargest difference between the 2-process gradflow DDP model and 1-process eager torch on the "
          f"whole batches: {diff:.1e}")


if __name__ == "__main__":
    main()
