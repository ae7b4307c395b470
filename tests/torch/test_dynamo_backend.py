"""`torch.compile(model, backend="gradflow")`: every graph TorchDynamo captures runs through gradflow.

The zoo of `test_compile.py` (`tests/torch/zoo.py`) trains 5 steps through the backend next to eager torch;
graph breaks, a last smaller batch, and the refusal of an in-place update of an input are checked too.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import gradflow.torch as gt
from gradflow.torch.dynamo import BackendError
from gradflow.torch.errors import DroppedOptionError
from tests.torch.agreement import assert_seeded_alike_through_the_backend
from tests.torch.zoo import NAMES, StraightThroughRelu, fresh, inputs

F64 = dict(rtol=1e-9, atol=1e-9)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # no graph of another test is reused
    yield
    torch._dynamo.reset()


def _outputs(y) -> tuple[torch.Tensor, ...]:
    return tuple(y) if isinstance(y, tuple) else (y,)


def _same_state(model, ref) -> None:
    for (n, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, **F64, msg=lambda s, n=n: f"{n}: {s}")


def test_the_backend_is_registered_by_name():
    assert "gradflow" in torch._dynamo.list_backends(exclude_tags=())


def _counting(graphs: list, runners: list | None = None):
    """gradflow's backend, appending each graph Dynamo hands it to `graphs` (and what runs it to `runners`)."""
    def backend(gm, example_inputs):
        graphs.append(gm)
        runner = gt.backend(gm, example_inputs)
        if runners is not None:
            runners.append(runner)
        return runner
    return backend


@pytest.mark.parametrize("name", NAMES)
@torch._dynamo.config.patch(allow_rnn=True)  # else Dynamo leaves a model with nn.LSTM to eager torch
def test_zoo_trains_like_eager_torch(name):
    """5 SGD steps on a linear loss (random cotangents), then the eval-mode outputs; every graph Dynamo
    captured ran through gradflow. The transformer's key bias is frozen: its exact gradient is 0, see
    `test_compile.test_zoo_training_follows_torch_trajectory`."""
    ref = fresh(name)
    model = copy.deepcopy(ref)
    graphs: list = []
    run = torch.compile(model, backend=_counting(graphs))
    frozen = [m[0].self_attn.in_proj_bias for m in (model, ref)] if name == "transformer" else []
    for p in frozen:
        p.requires_grad_(False)
    opts = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
            for m in (model, ref)]
    gen = torch.Generator().manual_seed(5)
    for step in range(5):
        xs = inputs(name, seed=100 + step)
        outs = run(*xs), ref(*xs)
        cot = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in _outputs(outs[1])]
        for out, opt in zip(outs, opts):
            opt.zero_grad()
            sum((o * g).sum() for o, g in zip(_outputs(out), cot)).backward()
            opt.step()
        _same_state(model, ref)
    model.eval()
    ref.eval()
    xs = inputs(name, seed=200)
    for a, b in zip(_outputs(run(*xs)), _outputs(ref(*xs))):
        torch.testing.assert_close(a, b, **F64)
    assert graphs, "Dynamo captured no graph: the model ran in eager torch"


class _Breaks(torch.nn.Module):
    """Two graphs: Dynamo breaks the graph at the data-dependent Python branch, which torch runs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 5), torch.nn.Linear(5, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if h.sum().item() > 0:
            h = h * 2
        return self.b(h)


def test_graph_breaks_and_a_smaller_last_batch():
    torch.manual_seed(0)
    ref = _Breaks().double()
    model = copy.deepcopy(ref)
    graphs: list = []
    runners: list = []
    run = torch.compile(model, backend=_counting(graphs, runners))
    # batch 2 recaptures (Dynamo makes the batch a symbolic size input); 3 and 5 run the graphs of batch 2
    # through one compiled module each, its one program (the size read from the tensor at each call)
    for batch in (6, 6, 2, 3, 5):
        x = torch.randn(batch, 4, dtype=torch.float64)
        y, want = run(x), ref(x)
        torch.testing.assert_close(y, want, **F64)
        y.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **F64)
    assert len(graphs) >= 2
    dynamic = [r for r in runners if r.sizes]
    assert dynamic, "Dynamo's symbolic batch size reaches the backend as a size input"
    for runner in dynamic:
        (_, compiled), = runner.compiled.values()  # its first call's shapes, one batch program for the rest
        assert sorted(key[2] == "batch" for key in compiled._gf_exports) == [False, True]


def _seeded_alike(model, ref, x, seeds: int) -> None:
    """`model` through the backend and `ref` in eager torch, seeded alike before each of `seeds` calls (so both
    draw the same dropout masks): outputs and gradients equal."""
    assert_seeded_alike_through_the_backend(model, ref, [x] * seeds, F64)


def test_dropout_draws_eager_torchs_masks():
    """Dynamo writes nn.Dropout as F.dropout; the backend draws its masks as eager torch does (same seed,
    same masks), so outputs and gradients agree with eager torch's."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                              torch.nn.Linear(8, 2)).double()
    model = copy.deepcopy(ref)
    _seeded_alike(model, ref, torch.randn(5, 4, dtype=torch.float64), seeds=3)


def test_two_instances_of_one_model_train_their_own_parameters():
    """Dynamo serves both instances with one graph (parameters are its inputs): each must get a program
    holding its own parameters, not the first instance's."""
    torch.manual_seed(0)
    refs = [torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).double() for _ in range(2)]
    models = [copy.deepcopy(r) for r in refs]
    runs = [torch.compile(m, backend="gradflow") for m in models]
    x = torch.randn(5, 4, dtype=torch.float64)
    for run, model, ref in zip(runs, models, refs):
        y, want = run(x), ref(x)
        torch.testing.assert_close(y, want, **F64)
        y.sum().backward()
        want.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **F64)
        _same_state(model, ref)


@pytest.mark.parametrize("update", ["method", "item", "inplace_relu"])
def test_in_place_updates_of_inputs_are_refused(update):
    def bump(x, y):
        if update == "method":
            x.mul_(2.0)
        elif update == "item":
            x[0] = 1.0
        else:
            torch.nn.functional.relu(x, inplace=True)
        return x * y

    run = torch.compile(bump, backend="gradflow")
    with pytest.raises(BackendError, match="updates its input"):
        run(torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))


class _SelfAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(8, 2, dropout=0.2, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


def test_attention_dropout_draws_eager_torchs_masks():
    """Dynamo writes nn.MultiheadAttention as F.multi_head_attention_forward; its dropout on the attention
    weights gets eager torch's masks through the backend too."""
    torch.manual_seed(0)
    ref = _SelfAttention().double()
    model = copy.deepcopy(ref)
    _seeded_alike(model, ref, torch.randn(2, 5, 8, dtype=torch.float64), seeds=2)


class _Bag(torch.nn.Module):
    def __init__(self, **option) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 4, **option)

    def forward(self, ids):
        return self.table(ids).sum(1)


@pytest.mark.parametrize("option", [dict(padding_idx=0), dict(scale_grad_by_freq=True)],
                         ids=["padding", "by_frequency"])
def test_a_trained_embedding_with_an_option_the_export_drops_trains_as_torch_does(option):
    torch.manual_seed(0)
    ids = torch.tensor([[0, 3, 3], [5, 0, 9]])
    ref = _Bag(**option).double()
    graphs: list = []
    run = torch.compile(copy.deepcopy(ref), backend=_counting(graphs))
    y, want = run(ids), ref(ids)
    torch.testing.assert_close(y, want, **F64)
    y.square().sum().backward()
    want.square().sum().backward()
    torch.testing.assert_close(run._orig_mod.table.weight.grad, ref.table.weight.grad, **F64)
    assert len(graphs) == 1
    if "padding_idx" in option:
        assert not ref.table.weight.grad[0].any()


def test_an_embedding_with_max_norm_is_refused_naming_the_users_table():
    # the captured graph holds the table as an input named l_self_modules_table_parameters_weight_; the error
    # names it as the user's module does
    torch.manual_seed(0)
    ids = torch.tensor([[0, 3, 3], [5, 0, 9]])
    run = torch.compile(_Bag(max_norm=0.5).double(), backend="gradflow")
    with pytest.raises(DroppedOptionError, match=r"torch\.compile captured looks up table\.weight with max_norm=0\.5"):
        run(ids)


def test_a_detach_in_a_trained_graph_trains_as_torch_does():
    # Dynamo's graph calls detach (a method and torch.detach); each is exported as gradflow's StopGradient
    def scaled(w, x):
        h = x @ w
        return h * h.detach().sum(-1, keepdim=True) + torch.detach(torch.tanh(h)) ** 2

    graphs: list = []
    run = torch.compile(scaled, backend=_counting(graphs))
    torch.manual_seed(0)
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    wr = w.detach().clone().requires_grad_()
    x = torch.randn(3, 4, dtype=torch.float64)
    y, want = run(w, x), scaled(wr, x)
    torch.testing.assert_close(y, want, **F64)
    g = torch.randn(3, 4, dtype=torch.float64)
    y.backward(g)
    want.backward(g)
    torch.testing.assert_close(w.grad, wr.grad, **F64)
    assert len(graphs) == 1


def test_an_autograd_function_in_a_trained_graph_is_refused():
    run = torch.compile(lambda w, x: StraightThroughRelu.apply(x @ w) * 2.0, backend="gradflow")
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(DroppedOptionError, match="captured applies an autograd.Function with its own backward"):
        run(w, torch.randn(3, 4, dtype=torch.float64))


def test_a_gradient_hook_in_a_trained_graph_is_refused():
    # Dynamo writes h.register_hook(fn) as its register_hook operator; gradflow's backward would skip it
    def hooked(w, x):
        h = x @ w
        h.register_hook(lambda g: g * 3.0)
        return torch.tanh(h)

    run = torch.compile(hooked, backend="gradflow")
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(DroppedOptionError, match="captured registers a gradient hook on a tensor in its forward"):
        run(w, torch.randn(3, 4, dtype=torch.float64))


def test_values_computed_under_no_grad_in_a_captured_graph_carry_no_gradient():
    def partly(w, v, x):
        with torch.no_grad():
            t = torch.tanh(x @ v)
        return (x @ w) * t

    graphs: list = []
    run = torch.compile(partly, backend=_counting(graphs))
    torch.manual_seed(0)
    w, v = (torch.randn(4, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    x = torch.randn(3, 4, dtype=torch.float64)
    run(w, v, x).square().sum().backward()
    gw = w.grad.clone()
    w.grad = None
    partly(w, v, x).square().sum().backward()
    torch.testing.assert_close(gw, w.grad, **F64)
    assert (v.grad is None or not v.grad.any()) and graphs  # torch: None; gradflow: zeros
