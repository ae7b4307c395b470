"""Train a small GPT through `torch.compile(model, backend="gradflow")` next to eager torch.

A 2-layer pre-norm decoder (`nn.TransformerEncoder` with a causal mask, GELU, dropout 0.1, the token
embedding tied to the output head) on random token sequences, with AdamW. Both copies start from the same
weights and are seeded alike before each step, so they draw the same dropout masks: the script prints per
step both losses, their difference and the largest parameter difference. `--compile` uses
`gradflow.torch.compile` instead of the backend.

    OMP_NUM_THREADS=1 python examples/train_gpt.py [--steps 3] [--compile] [--dtype float32]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import gradflow.torch as gt

VOCAB, WIDTH, HEADS, CONTEXT, LAYERS = 50, 32, 4, 16, 2


class GPT(torch.nn.Module):
    """A pre-norm decoder: token and position embeddings, `layers` Transformer layers under a causal mask,
    LayerNorm, and a head tied to the token embedding (also `benchmarks/models.py`'s GPT, at other sizes)."""

    def __init__(self, vocab: int = VOCAB, width: int = WIDTH, heads: int = HEADS, context: int = CONTEXT,
                 layers: int = LAYERS, dropout: float = 0.1) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        torch.nn.init.normal_(self.tokens.weight, std=0.02)
        self.positions = torch.nn.Parameter(torch.randn(context, width) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=dropout, batch_first=True,
                                                 norm_first=True, activation="gelu")
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied
        self.register_buffer("causal", torch.nn.Transformer.generate_square_subsequent_mask(context),
                             persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions
        return self.head(self.norm(self.blocks(x, mask=self.causal, is_causal=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="gradflow.torch.compile instead of the backend")
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    eager = GPT().to(dtype)
    model = copy.deepcopy(eager)
    example = torch.randint(0, VOCAB, (args.batch, CONTEXT))
    run = gt.compile(model, (example,)) if args.compile else torch.compile(model, backend="gradflow")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    data = torch.Generator().manual_seed(1)
    start = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, VOCAB, (args.batch, CONTEXT), generator=data)
        target = torch.randint(0, VOCAB, (args.batch, CONTEXT), generator=data)
        losses = []
        for fn, opt in ((run, opts[0]), (eager, opts[1])):
            torch.manual_seed(100 + step)  # the same dropout masks on both sides
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(fn(idx).reshape(-1, VOCAB), target.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        apart = max((a - b).abs().max().item() for a, b in zip(model.parameters(), eager.parameters()))
        print(f"step {step}: loss gradflow {losses[0]:.10f}  eager {losses[1]:.10f}  "
              f"difference {losses[0] - losses[1]:.1e}  parameters apart {apart:.1e}  "
              f"({time.perf_counter() - start:.0f} s, the first step builds)", flush=True)


if __name__ == "__main__":
    main()
