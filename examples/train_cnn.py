"""Train a small CNN through `gradflow.torch.compile`, next to the same model trained by eager torch.

The data is synthetic and learnable: ten fixed random 16x16 patterns (one per class), each sample a
randomly shifted, noisy copy of its class's pattern. Both models start from the same initial weights and
see the same batches; the loss is `F.cross_entropy` on the logits, computed by torch outside the compiled
module. Per step the script prints both losses, their difference and the time per step of each.

    OMP_NUM_THREADS=1 python examples/train_cnn.py                 # float64
    OMP_NUM_THREADS=1 python examples/train_cnn.py --dtype float32 --steps 50
"""

from __future__ import annotations

import argparse
import copy
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gradflow.torch as gt  # noqa: E402

CLASSES, SIDE = 10, 16


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * (SIDE // 4) ** 2, CLASSES))


class Patterns:
    """Ten class patterns; a batch is shifted (up to 2 pixels), noisy copies of random classes' patterns."""

    def __init__(self, seed: int, dtype: torch.dtype) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.dtype = dtype
        self.patterns = torch.randn(CLASSES, 1, SIDE, SIDE, generator=self.gen, dtype=dtype)

    def batch(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, CLASSES, (size,), generator=self.gen)
        shifts = torch.randint(-2, 3, (size, 2), generator=self.gen).tolist()
        x = torch.stack([torch.roll(self.patterns[c], tuple(s), dims=(1, 2)) for c, s in zip(y.tolist(), shifts)])
        return x + 0.8 * torch.randn(x.shape, generator=self.gen, dtype=self.dtype), y


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """One training step; returns (loss, seconds)."""
    start = time.perf_counter()
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    torch.manual_seed(0)
    eager = cnn().to(dtype)
    model = copy.deepcopy(eager)  # same initial weights; trained through gradflow
    data = Patterns(seed=1, dtype=dtype)
    batches = [data.batch(args.batch) for _ in range(args.steps)]

    start = time.perf_counter()
    fast = gt.compile(model, (batches[0][0],))  # export + lower now; forward+backward built at the first call
    initial = copy.deepcopy(model.state_dict())
    fast(batches[0][0]).sum().backward()  # builds the training program; then undo its effects
    model.load_state_dict(initial)  # (BatchNorm statistics and counter)
    model.zero_grad(set_to_none=True)
    print(f"built the forward+backward in {time.perf_counter() - start:.1f} s (cached by content for next time)")

    opt_fast = torch.optim.SGD(fast.parameters(), lr=args.lr, momentum=0.9)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=args.lr, momentum=0.9)
    print(f"\n{'step':>4}  {'gradflow loss':>14}  {'torch loss':>14}  {'|diff|':>9}  {'gradflow ms':>11}  "
          f"{'torch ms':>8}")
    times_fast, times_eager, worst = [], [], 0.0
    for k, (x, y) in enumerate(batches):
        loss_fast, t_fast = step(fast, opt_fast, x, y)
        loss_eager, t_eager = step(eager, opt_eager, x, y)
        times_fast.append(t_fast)
        times_eager.append(t_eager)
        worst = max(worst, abs(loss_fast - loss_eager))
        print(f"{k:>4}  {loss_fast:>14.10f}  {loss_eager:>14.10f}  {abs(loss_fast - loss_eager):>9.1e}  "
              f"{1e3 * t_fast:>11.2f}  {1e3 * t_eager:>8.2f}")

    params = max((a - b).abs().max().item() for a, b in zip(model.state_dict().values(), eager.state_dict().values()))
    med = lambda ts: sorted(ts)[len(ts) // 2]  # noqa: E731
    with torch.no_grad():
        fast.eval()
        eager.eval()
        x, y = data.batch(args.batch)
        acc = (fast(x).argmax(1) == y).float().mean().item()
    print(f"\nlargest loss difference {worst:.1e}, largest parameter/buffer difference {params:.1e} ({args.dtype})")
    print(f"median time per step: gradflow {1e3 * med(times_fast):.2f} ms, torch {1e3 * med(times_eager):.2f} ms "
          f"(gradflow / torch = {med(times_fast) / med(times_eager):.2f}, {os.environ['OMP_NUM_THREADS']} thread(s))")
    print(f"accuracy of the trained gradflow model on a fresh batch: {acc:.0%}")


if __name__ == "__main__":
    main()
