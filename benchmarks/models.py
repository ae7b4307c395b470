"""Models through `gradflow.torch.compile` vs eager torch: forward+backward time and cold build time.

A zoo of small models in plain `torch.nn` (issue 14's architectures). Per model, one worker process per
thread count (`--threads`, default 1 and 2; `torch.set_num_threads` and `OMP_NUM_THREADS` for gradflow's
OpenMP): the first starts with an empty GRADFLOW_CACHE and measures the cold build (export + lower in
`compile`, then differentiate + compile at the first forward+backward), the others reuse that cache.
Each worker checks the compiled module's outputs and parameter gradients against the eager module, then
times one forward+backward (`torch.autograd.grad` of the outputs with respect to the parameters, train
mode) of each side, interleaved, and reports the median of single calls. Both sides' outputs and
gradients are compared with eager torch in float64; a gradflow error above 10x torch's own (or 1e-4 in
float32) is flagged in the report (unless the model built in float64 agrees:
float32 rounding at a kink, shown in brackets). A model that fails (export, an unsupported op) is listed with its error.

    OMP_NUM_THREADS=1 python benchmarks/models.py                       # writes benchmarks/results/models.md/.json
    python benchmarks/models.py --only mlp,lenet --threads 1 --out /tmp/models
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
BATCH = 32


class ResBlock(torch.nn.Module):
    """Conv+BatchNorm+ReLU stem, one residual block, global average pooling, a classifier."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
                                        torch.nn.ReLU())
        self.body = torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
                                        torch.nn.ReLU(), torch.nn.Conv2d(c, c, 3, padding=1, bias=False),
                                        torch.nn.BatchNorm2d(c))
        self.head = torch.nn.Linear(c, 10)

    def forward(self, x):
        h = self.stem(x)
        h = torch.relu(h + self.body(h))
        return self.head(h.mean(dim=(2, 3)))


class EmbedLSTMCell(torch.nn.Module):
    """A frozen Embedding, an LSTMCell unrolled over the sequence, a classifier on the last state."""

    def __init__(self, vocab: int = 100, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.embed.weight.requires_grad_(False)
        self.cell = torch.nn.LSTMCell(dim, hidden)
        self.head = torch.nn.Linear(hidden, 10)
        self.hidden = hidden

    def forward(self, tokens):
        e = self.embed(tokens)
        h = c = torch.zeros(tokens.shape[0], self.hidden, dtype=e.dtype)
        for t in range(tokens.shape[1]):
            h, c = self.cell(e[:, t], (h, c))
        return self.head(h)


class EmbedLSTM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.embed.weight.requires_grad_(False)
        self.lstm = torch.nn.LSTM(32, 64, batch_first=True)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


def _mobilenet():
    def block(cin, cout, stride):
        return [torch.nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), torch.nn.BatchNorm2d(cin),
                torch.nn.ReLU6(), torch.nn.Conv2d(cin, cout, 1, bias=False), torch.nn.BatchNorm2d(cout),
                torch.nn.ReLU6()]
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU6(),
                               *block(16, 32, 2), *block(32, 32, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(32, 10))


class BasicBlock(torch.nn.Module):
    """ResNet's basic block: two 3x3 Conv+BatchNorm, a 1x1 Conv+BatchNorm shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.shortcut = torch.nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet18(torch.nn.Module):
    """ResNet-18 for 3x32x32 images (CIFAR style: a 3x3 stem, no max pool), 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(64),
                                        torch.nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = torch.nn.Sequential(*blocks)
        self.head = torch.nn.Linear(512, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def _gpt():
    """The 2-layer GPT of `examples/train_gpt.py` at the issue's sizes: width 128, 4 heads, context 64,
    vocabulary 512, dropout 0.1, tied head."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    from train_gpt import GPT

    return GPT(vocab=512, width=128, heads=4, context=64, layers=2, dropout=0.1)


class GRULanguageModel(torch.nn.Module):
    """Embedding(512, 128), a 2-layer nn.GRU(128, 128), a head to the 512 tokens at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, 128)
        self.gru = torch.nn.GRU(128, 128, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(128, 512)

    def forward(self, idx):
        return self.head(self.gru(self.embed(idx))[0])


def _tokens(shape):
    return lambda dtype: torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(3))


def _floats(shape):
    return lambda dtype: torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(3))


#: name -> (constructor, input maker, description)
MODELS = {
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                        torch.nn.ReLU(), torch.nn.Linear(512, 10)),
            _floats((BATCH, 256)), "Linear 256-512-512-10, ReLU"),
    "lenet": (lambda: torch.nn.Sequential(torch.nn.Conv2d(1, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                          torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                          torch.nn.Flatten(), torch.nn.Linear(256, 120), torch.nn.ReLU(),
                                          torch.nn.Linear(120, 84), torch.nn.ReLU(), torch.nn.Linear(84, 10)),
              _floats((BATCH, 1, 28, 28)), "LeNet-5 on 1x28x28"),
    "resnet_block": (ResBlock, _floats((BATCH, 3, 16, 16)), "Conv+BN+ReLU stem, residual block, 16 ch, 3x16x16"),
    "layernorm_gelu_mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128),
                                                       torch.nn.GELU(), torch.nn.Linear(128, 64),
                                                       torch.nn.LayerNorm(64), torch.nn.GELU(),
                                                       torch.nn.Linear(64, 10)),
                           _floats((BATCH, 64)), "Linear/LayerNorm/GELU 64-128-64-10"),
    "embedding_lstmcell": (EmbedLSTMCell, _tokens((BATCH, 8)), "frozen Embedding(100, 32), LSTMCell(32, 64) x 8 steps"),
    "mobilenet_relu6": (_mobilenet, _floats((BATCH, 3, 16, 16)), "depthwise-separable blocks, BatchNorm, ReLU6"),
    "transformer_layer": (lambda: torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
                          _floats((BATCH, 8, 32)), "TransformerEncoderLayer(32, 4 heads, 64), dropout 0"),
    "embedding_lstm": (EmbedLSTM, _tokens((BATCH, 8)), "frozen Embedding(100, 32), nn.LSTM(32, 64)"),
    # real sizes (issue 32)
    "resnet18": (ResNet18, _floats((64, 3, 32, 32)), "ResNet-18 (CIFAR style) on 3x32x32, batch 64"),
    "gpt2layer": (_gpt, _tokens((16, 64)), "2-layer GPT, width 128, 4 heads, context 64, vocabulary 512, "
                  "dropout 0.1, batch 16"),
    "gru_lm": (GRULanguageModel, _tokens((16, 32)), "2-layer GRU language model, 128 wide, 32 steps, batch 16"),
}
#: models that are not run unless named (`--only`): their builds take minutes
LARGE = ("resnet18", "gpt2layer", "gru_lm")


# -- worker ------------------------------------------------------------------------------------------------
def _fwd_bwd(module, params, x, g):
    out = module(x)
    return out, torch.autograd.grad(out, params, g)


def _double(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.is_floating_point() else x


def _max_rel_err(got, want) -> float:
    """Largest over the output and the gradients of max |got - want| / max |want|."""
    (out, grads), (ref, ref_grads) = got, want
    pairs = [(out, ref), *zip(grads, ref_grads)]
    return max(((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in pairs)


def worker(name: str, threads: int, dtype: torch.dtype, budget: float, inductor: bool = False,
           fixed_batch: bool = False) -> dict:
    torch.set_num_threads(threads)
    import copy

    import gradflow.torch as gt

    make, inputs, _ = MODELS[name]
    torch.manual_seed(0)
    eager = make().to(dtype)
    mine = copy.deepcopy(eager)
    x = inputs(dtype)
    params = [p for p in mine.parameters() if p.requires_grad]
    eparams = [p for p in eager.parameters() if p.requires_grad]
    rec: dict = {"model": name, "threads": threads}
    start = time.perf_counter()
    fast = gt.compile(mine, (x,), dynamic=not fixed_batch)
    rec["batch_program"] = any(key[2] == "batch" for key in fast._gf_exports)
    rec["compile_s"] = time.perf_counter() - start
    with torch.no_grad():
        g = torch.randn(eager(x).shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
    start = time.perf_counter()
    torch.manual_seed(5)  # each side checked below draws the same dropout masks
    got = _fwd_bwd(fast, params, x, g)
    rec["first_call_s"] = time.perf_counter() - start
    # both sides against eager torch in float64: gradflow may differ by rounding, as much as torch's own float32
    ref_model = copy.deepcopy(eager).double()
    torch.manual_seed(5)
    ref = _fwd_bwd(ref_model, [p for p in ref_model.parameters() if p.requires_grad], _double(x), g.double())
    rec["gradflow_err"] = _max_rel_err(got, ref)
    torch.manual_seed(5)
    rec["torch_err"] = _max_rel_err(_fwd_bwd(eager, eparams, x, g), ref)
    rec["allowed_err"] = max(10 * rec["torch_err"], 1e-4 if dtype == torch.float32 else 1e-9)
    if dtype == torch.float32 and rec["gradflow_err"] > rec["allowed_err"]:
        # the same model built in float64: if that agrees, the float32 difference comes from rounding at a
        # point where the function is not smooth (a ReLU input within float32 rounding of 0 flips its mask)
        wide = copy.deepcopy(eager).double()
        wide_fast = gt.compile(wide, (_double(x),), dynamic=not fixed_batch)
        torch.manual_seed(5)
        wide_got = _fwd_bwd(wide_fast, [p for p in wide.parameters() if p.requires_grad], _double(x), g.double())
        rec["gradflow_err_float64"] = _max_rel_err(wide_got, ref)
    sides = {"gradflow": (fast, params), "torch": (eager, eparams)}
    if inductor:
        other = copy.deepcopy(eager)
        compiled = torch.compile(other)
        oparams = [p for p in other.parameters() if p.requires_grad]
        start = time.perf_counter()
        _fwd_bwd(compiled, oparams, x, g)
        rec["inductor_cold_s"] = time.perf_counter() - start
        sides["inductor"] = (compiled, oparams)
    one = {s: min(_time(lambda m=m, p=p: _fwd_bwd(m, p, x, g)) for _ in range(3)) for s, (m, p) in sides.items()}
    reps = max(7, min(500, int(budget / max(one.values()))))
    times: dict[str, list[float]] = {s: [] for s in sides}
    for _ in range(reps):  # interleaved
        for s, (m, p) in sides.items():
            times[s].append(_time(lambda m=m, p=p: _fwd_bwd(m, p, x, g)))
    rec.update({f"{s}_ms": 1e3 * statistics.median(t) for s, t in times.items()}, repeats=reps)
    rec["ratio"] = rec["gradflow_ms"] / rec["torch_ms"]
    # which convolutions this process gave to torch (decided by timing at their first call: a per-process
    # choice, recorded so that a model's outlier run can be told apart from a route timed under load)
    from gradflow.torch.convolution import routes

    taken = routes()
    rec["conv_routes"] = {"torch": sum(r["torch"] for r in taken), "own": sum(not r["torch"] for r in taken)}
    if inductor:
        rec["inductor_ratio"] = rec["gradflow_ms"] / rec["inductor_ms"]
    return rec


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- driver ------------------------------------------------------------------------------------------------
def _run_worker(name: str, threads: int, cache: str, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), GRADFLOW_CACHE=cache)
    cmd = [sys.executable, __file__, "--worker", name, "--threads", str(threads), "--dtype", args.dtype,
           "--budget", str(args.budget)] + (["--inductor"] if args.inductor else []) + \
        (["--fixed-batch"] if args.fixed_batch else [])
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "threads": threads, "error": f"timed out after {args.timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    last = next((ln for ln in reversed(err) if not ln.startswith((" ", "\t"))), err[-1] if err else "no output")
    return {"model": name, "threads": threads, "error": last.strip()}


def _environment() -> str:
    import dace
    import numpy

    def sh(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

    commit = sh("git", "-C", str(HERE), "rev-parse", "--short", "HEAD")
    load = os.getloadavg()
    return (f"- machine: `{sh('uname', '-a')}`, {os.cpu_count()} CPUs, load average {load[0]:.1f} at the end\n"
            f"- python {platform.python_version()}, dace {dace.__version__}, torch {torch.__version__}, "
            f"numpy {numpy.__version__}; gradflow at commit {commit}\n")


def _flag(r: dict) -> str:
    """(!) for an error above the allowed one; (float64 e) when the float64 build of the model agrees."""
    if r["gradflow_err"] <= r["allowed_err"]:
        return ""
    wide = r.get("gradflow_err_float64")
    return " **(!)**" if wide is None or wide > 1e-9 else f" (float64 {wide:.0e})"


def _report(records: list[dict], args) -> str:
    lines = ["# Models through `gradflow.torch.compile` vs eager torch", "",
             f"`python benchmarks/models.py` ({args.dtype}, batch {BATCH} where the model list says no other, train "
             "mode, dropout masks drawn alike for the error check). Forward+backward: median "
             "of single calls of `torch.autograd.grad(module(x), parameters, g)`, sides interleaved; build: a cold "
             "`compile` (export + lower) plus the first forward+backward (differentiate + compile) with an empty "
             "GRADFLOW_CACHE, in the 1-thread worker. Relative errors: largest over the output and the parameter "
             "gradients of max |x - ref| / max |ref|, ref = eager torch in float64 (gradflow's may be up to 10x "
             "torch's own, or 1e-4 in float32; **(!)** marks a larger one: timed, but not computing what torch "
             "computes; a larger float32 error whose model, built in float64, agrees with torch to 1e-9 shows "
             "that error in brackets instead: float32 rounding at a point where the model is not smooth, such "
             "as a ReLU input within rounding of 0 whose mask flips). The timed calls have the example's shapes, which get a program of their own; the "
             "program for other batch sizes (the batch a symbolic dimension) is " + (
                 "off (`--fixed-batch`)" if args.fixed_batch else "exported in `compile`, except for a model "
                 "marked *, whose trace does not allow it") + ".", "", _environment(),
             "| model | threads | gradflow ms | torch ms | gradflow / torch | torch.compile ms | gradflow / "
             "torch.compile | cold build s (compile + first call) | torch.compile cold s | rel. error gradflow | "
             "rel. error torch |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    failures = []
    for r in records:
        if "error" in r:
            failures.append(r)
            continue
        build = f"{r['compile_s'] + r['first_call_s']:.1f} ({r['compile_s']:.1f} + {r['first_call_s']:.1f})" \
            if r.get("cold") else ""
        flag = _flag(r)
        inductor = (f"{r['inductor_ms']:.3f} | {r['inductor_ratio']:.2f}" if "inductor_ms" in r else " | ")
        cold = f"{r['inductor_cold_s']:.1f}" if "inductor_cold_s" in r else ""
        star = "" if args.fixed_batch or r.get("batch_program") else "*"
        lines.append(f"| {r['model']}{star} | {r['threads']} | {r['gradflow_ms']:.3f} | {r['torch_ms']:.3f} | "
                     f"{r['ratio']:.2f} | {inductor} | {build} | {cold} | {r['gradflow_err']:.1e}{flag} | "
                     f"{r['torch_err']:.1e} |")
    if failures:
        lines += ["", "## Failures", "", "| model | threads | error |", "|---|---:|---|"]
        lines += [f"| {r['model']} | {r['threads']} | {r['error'].replace('|', '/')} |" for r in failures]
    lines += ["", "Models: " + "; ".join(f"`{k}`: {v[2]}" for k, v in MODELS.items() if k in args.only) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(m for m in MODELS if m not in LARGE),
                    help=f"comma-separated model names (the large ones, {', '.join(LARGE)}, only when named)")
    ap.add_argument("--inductor", action="store_true", help="also time torch.compile (inductor) in each worker")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, one worker each")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of timed calls per side (about)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per worker")
    ap.add_argument("--out", default=str(HERE / "results" / "models"), help="path without .md/.json")
    ap.add_argument("--fixed-batch", action="store_true",
                    help="compile with dynamic=False (a program for the batch's shapes, not the symbolic batch)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, int(args.threads), getattr(torch, args.dtype), args.budget,
                                args.inductor, args.fixed_batch)))
        return
    args.only = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = sorted(set(args.only) - set(MODELS))
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    records = []
    for name in args.only:
        with tempfile.TemporaryDirectory(prefix="gradflow-models-") as cache:
            for k, threads in enumerate(int(t) for t in args.threads.split(",")):
                rec = _run_worker(name, threads, cache, args)
                rec["cold"] = k == 0
                records.append(rec)
                print(json.dumps(rec), flush=True)
                if "error" in rec:
                    break  # the other thread counts would fail the same way
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    out.with_suffix(".md").write_text(_report(records, args))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
