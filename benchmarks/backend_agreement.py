"""The real-size models of `benchmarks/models.py` trained through `torch.compile(model, backend="gradflow")`
next to eager torch: do losses and parameters stay equal? (issue 32's acceptance: 1e-10 in float64.)

Per model: a float64 copy trained 5 SGD steps (momentum 0.9) through the backend and one in eager torch,
seeded alike before each step (the same dropout masks), on random batches whose size changes (the last
smaller, as an epoch's last batch); reports the largest loss difference and the largest parameter
difference after the last step, relative to the largest parameter, and the seconds taken (the first step
builds). Too slow for the test suite (each model builds for a minute or more).

    OMP_NUM_THREADS=1 python benchmarks/backend_agreement.py [--only resnet18,gpt2layer,gru_lm] [--batch 4]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import models  # noqa: E402  (benchmarks/models.py: the model definitions)


def train(name: str, batch: int, steps: int = 5) -> dict:
    import gradflow.torch  # noqa: F401  (registers the backend)

    make, inputs, _ = models.MODELS[name]
    torch.manual_seed(0)
    eager = make().double()
    mine = copy.deepcopy(eager)
    run = torch.compile(mine, backend="gradflow")
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (mine, eager)]
    example = inputs(torch.float64)
    sizes = [batch] * (steps - 1) + [max(1, batch // 2)]
    gen = torch.Generator().manual_seed(1)
    worst_loss, start = 0.0, time.perf_counter()
    for step, size in enumerate(sizes):
        x = (torch.randint(0, int(example.max()) + 1, (size, *example.shape[1:]), generator=gen)
             if not example.is_floating_point() else
             torch.randn((size, *example.shape[1:]), generator=gen, dtype=torch.float64))
        losses = []
        for fn, opt in ((run, opts[0]), (eager, opts[1])):
            torch.manual_seed(100 + step)
            opt.zero_grad()
            loss = fn(x).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        worst_loss = max(worst_loss, abs(losses[0] - losses[1]) / max(abs(losses[1]), 1e-300))
    scale = max(p.abs().max().item() for p in eager.parameters())
    apart = max((a - b).abs().max().item() for a, b in zip(mine.parameters(), eager.parameters())) / scale
    return {"model": name, "batches": sizes, "loss_rel": worst_loss, "param_rel": apart,
            "seconds": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="resnet18,gpt2layer,gru_lm")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    torch._dynamo.config.allow_rnn = True  # else Dynamo leaves nn.GRU to eager torch
    print("| model | batches | largest loss difference (relative) | parameters apart after 5 steps (relative "
          "to the largest) | seconds |\n|---|---|---:|---:|---:|")
    for name in args.only.split(","):
        r = train(name.strip(), args.batch)
        print(f"| {r['model']} | {', '.join(map(str, r['batches']))} | {r['loss_rel']:.1e} | {r['param_rel']:.1e} | "
              f"{r['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
