"""Peak memory of one training step of a model-zoo model, for `benchmarks/memory_peak.py --models`.

The models are the zoo of `benchmarks/models.py` (plain `torch.nn`), at a larger batch than there so that
what a step keeps for its backward is megabytes, not kilobytes; float32, train mode. One step is the
forward and `torch.autograd.grad` of the outputs (times a fixed cotangent) with respect to the parameters.

Configurations, each run in a fresh process by `memory_peak.run_child`:
- `gradflow`: `gradflow.torch.compile(model, (x,), forwarding=...)` with `STORE_ALL`, then byte budgets of
  100/50/25/10% of what `STORE_ALL` forwards at this batch (planned for the example's sizes);
- `eager`: the model as it is (autograd stores every activation it needs);
- `checkpoint`: each direct child module's call under `torch.utils.checkpoint.checkpoint` (non-reentrant):
  what a user does who wraps every block without reading the model;
- `compile`: `torch.compile(model)` (inductor; its min-cut partitioner decides what the backward
  recomputes), at `torch._functorch.config.activation_memory_budget` 1.0 (the default), 0.5, 0.25, 0.1.

What is measured: a first step warms everything up (and, for `torch.compile`, compiles). gradflow builds
the module twice and steps the first, so that the measured one, the second's first step, initialises its
programs' state as a program's first call does (DaCe allocates its transients there), with its programs
built and its libraries loaded beforehand. The peak is the bytes the step made resident beyond what was
resident before it (`memory_peak._peak`).
"""

from __future__ import annotations

import copy

#: model -> batch for the memory measurement (the zoo's own batch is 32)
BATCH = {"mlp": 2048, "resnet_block": 128, "transformer_layer": 1024, "lenet": 512, "layernorm_gelu_mlp": 4096,
         "mobilenet_relu6": 128}
#: gradflow's byte budgets, as fractions of what STORE_ALL forwards (kernels and models alike)
FRACTIONS = (1.0, 0.5, 0.25, 0.10)
COMPILE_BUDGETS = (1.0, 0.5, 0.25, 0.10)


def _model_and_input(name: str):
    import torch

    from benchmarks.models import MODELS

    make, inputs, _ = MODELS[name]
    torch.manual_seed(0)
    model = make().float()
    example = inputs(torch.float32)
    shape = (BATCH[name],) + tuple(example.shape[1:])
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    return model, x


def _cotangent(model, x):
    import torch

    with torch.no_grad():
        shape = model(x).shape
    return torch.randn(shape, generator=torch.Generator().manual_seed(4))


def _step(module, params, x, g):
    import torch

    return torch.autograd.grad(module(x), params, g)


def store_all_bytes(name: str) -> int:
    """What `STORE_ALL` forwards for one step at the benchmark's batch (the budgets are fractions of it)."""
    import gradflow.torch as gt

    model, x = _model_and_input(name)
    compiled = gt.compile(model, (x,))
    return _forwarded(compiled, x)


def _forwarded(compiled, x) -> int:
    """Bytes the compiled module's training program forwards to its backward (its plan's total)."""
    program = compiled._program((x,))  # noqa: SLF001 - the benchmark reads the plan the module runs with
    return program.function.vjp.forwarding_plan.total_bytes({})


def _checkpoint_children(model):
    """Every direct child module's forward under `torch.utils.checkpoint` (non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    for child in model.children():
        inner = child.forward
        child.forward = lambda *a, inner=inner, **k: checkpoint(inner, *a, use_reentrant=False, **k)
    return model


def peer_step(name: str, kind: str, budget: float | None):
    """The step of one torch configuration (a call of it runs one step), built and warmed up."""
    import torch

    torch.set_num_threads(1)
    model, x = _model_and_input(name)
    g = _cotangent(model, x)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "checkpoint":
        model = _checkpoint_children(model)
    elif kind == "compile":
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = budget
        model = torch.compile(model)
    _step(model, params, x, g)
    return lambda: _step(model, params, x, g)


def gradflow_steps(name: str, policy):
    """(the measured step, forwarded bytes, the plan's policy, the gradients' squared norm) under `policy`,
    with a twin module stepped first (see the module docstring)."""
    import gradflow.torch as gt

    model, x = _model_and_input(name)
    g = _cotangent(model, x)
    twins = [gt.compile(copy.deepcopy(model), (x,), forwarding=policy) for _ in range(2)]
    params = [[p for p in t.parameters() if p.requires_grad] for t in twins]
    grads = _step(twins[0], params[0], x, g)
    norm = float(sum(float((v.double() ** 2).sum()) for v in grads))
    program = twins[1]._program((x,))  # noqa: SLF001 - built (and its libraries loaded) before the measure
    plan = program.function.vjp.forwarding_plan
    return lambda: _step(twins[1], params[1], x, g), plan.total_bytes({}), plan.policy, norm


def peer_labels() -> list[tuple[str, str, float | None]]:
    """(label, kind, activation memory budget) of each torch configuration."""
    rows = [("torch eager (stores all)", "eager", None),
            ("torch.utils.checkpoint around each child module", "checkpoint", None)]
    return rows + [(f"torch.compile, activation_memory_budget {b:g}", "compile", b) for b in COMPILE_BUDGETS]
