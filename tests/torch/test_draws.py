"""Random numbers a model's forward draws (`gradflow.torch.draws`): redrawn from torch's generator at every
call, in the forward's order among the dropout masks, so a seeded run computes what eager torch computes.

One model structure (a VAE-style reparameterisation with every served kind of draw and a Dropout between
them) is compiled once directly and once through the Dynamo backend; the refusals fail in the trace,
before anything is built.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import gradflow.torch as gt
from gradflow.torch.errors import ExportError
from tests.torch.agreement import assert_seeded_alike_through_the_backend

F64 = dict(rtol=1e-9, atol=1e-9)


class _Reparameterised(torch.nn.Module):
    """A Gaussian latent drawn with `randn_like`, scaled by an in-place `normal_` draw with its own mean and
    std, a Dropout between the draws, and uniform noise sized from the batch (`rand`) and like a value."""

    def __init__(self) -> None:
        super().__init__()
        self.mu = torch.nn.Linear(4, 3)
        self.log_var = torch.nn.Linear(4, 3)
        self.drop = torch.nn.Dropout(0.3)
        self.out = torch.nn.Linear(3, 2)

    def forward(self, x):
        mu, std = self.mu(x), torch.exp(0.5 * self.log_var(x))
        z = mu + torch.randn_like(mu) * std
        scale = torch.empty_like(std).normal_(0.5, 2.0)
        noise = torch.rand(x.shape[0], 3, dtype=x.dtype)
        return self.out(self.drop(z) * scale + noise * torch.rand_like(z))


def _pair():
    torch.manual_seed(0)
    ref = _Reparameterised().double()
    return copy.deepcopy(ref), ref


def _step(m, opt, x, seed):
    torch.manual_seed(seed)
    opt.zero_grad()
    y = m(x)
    y.square().sum().backward()
    opt.step()
    return y.detach()


def test_a_forward_that_draws_trains_as_eager_torch_does_at_every_batch_size(capfd):
    """Seeded alike, every draw and the dropout mask are eager torch's: 5 SGD steps at batches of 5, 2, 7,
    5, 3 follow torch's trajectory, served by the example's program and the one batch program. The
    exports print nothing (torch's exporter warned of gradflow's unused opset domain on every model)."""
    model, ref = _pair()
    compiled = gt.compile(model, (torch.randn(5, 4, dtype=torch.float64),))
    assert "Warning" not in capfd.readouterr().err
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (compiled, ref)]
    gen = torch.Generator().manual_seed(1)
    for step, rows in enumerate((5, 2, 7, 5, 3)):
        x = torch.randn(rows, 4, dtype=torch.float64, generator=gen)
        got, want = (_step(m, opt, x, seed=10 + step) for m, opt in zip((compiled, ref), opts))
        assert torch.isfinite(want).all()
        torch.testing.assert_close(got, want, **F64)
        for (n, a), b in zip(compiled.state_dict().items(), ref.state_dict().values()):
            torch.testing.assert_close(a, b, **F64, msg=lambda s, n=n: f"{n}: {s}")
    assert sorted(str(key[2]) for key in compiled._gf_exports) == ["((5, 4),)", "batch"]
    x = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    torch.manual_seed(3)
    first = compiled(x)
    assert not torch.equal(first, compiled(x))  # new draws at every call
    torch.manual_seed(3)
    assert torch.equal(compiled(x), first)  # the same seed, the same draws
    with torch.no_grad():  # the forward-only program draws them too
        torch.manual_seed(3)
        torch.testing.assert_close(compiled(x), first, rtol=0, atol=0)


def test_the_dynamo_backend_draws_as_eager_torch_does():
    torch._dynamo.reset()
    try:
        model, ref = _pair()
        inputs = [torch.randn(rows, 4, dtype=torch.float64) for rows in (5, 5, 3)]
        assert_seeded_alike_through_the_backend(model, ref, inputs, F64)
    finally:
        torch._dynamo.reset()


class _Draws(torch.nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        if self.how == "randint":
            return h * torch.randint(0, 2, h.shape, dtype=h.dtype)
        if self.how == "bernoulli":
            return h * torch.bernoulli(torch.sigmoid(h))
        if self.how == "generator":
            return h + torch.randn(h.shape, dtype=h.dtype, generator=torch.Generator().manual_seed(0))
        if self.how == "tensor_mean":
            return torch.normal(h, torch.ones_like(h))
        if self.how == "view":
            h = h.clone()
            h[:, :2].normal_()
            return h
        raise AssertionError(self.how)


@pytest.mark.parametrize("how, why", [
    ("randint", r"torch.randint at .*test_draws.py:\d+ draws random numbers gradflow cannot replay"),
    ("bernoulli", r"torch.bernoulli at .*test_draws.py:\d+ draws random numbers"),
    ("generator", "draws from a generator of the model's own"),
    ("tensor_mean", "with a tensor mean or std"),
    ("view", r"Tensor.normal_ at .*test_draws.py:\d+ draws in place into a view"),
])
def test_draws_no_program_can_replay_are_refused_where_they_are_made(how, why):
    torch.manual_seed(0)
    net = _Draws(how).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    state = copy.deepcopy(net.state_dict())
    rng = torch.random.get_rng_state()
    with pytest.raises(ExportError, match=why):
        gt.compile(net, (x,))
    for (n, a), b in zip(net.state_dict().items(), state.values()):
        assert torch.equal(a, b), n
    assert torch.equal(torch.random.get_rng_state(), rng)
