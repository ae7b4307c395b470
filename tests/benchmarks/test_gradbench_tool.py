"""gradflow's GradBench tool (`benchmarks/gradbench/tool.py`), spoken to through its protocol in a child
process as GradBench's driver would, on small inputs: outputs against independent numpy/scipy references
(densities from `scipy.stats` for gmm, a plain Runge-Kutta loop for ode) and gradients against their
central differences. And the relay's comparison of outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks.gradbench.run import compare

TOOL = Path(__file__).resolve().parents[2] / "benchmarks" / "gradbench" / "tool.py"


@pytest.fixture(scope="module")
def tool():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, str(TOOL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1, env=env)
    ids = iter(range(10**6))

    def ask(**message):
        message = {"id": next(ids)} | message
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == message["id"]
        return answer

    assert ask(kind="start")["tool"] == "gradflow"
    yield ask
    proc.stdin.close()
    proc.wait(timeout=60)


def _evaluate(tool, module: str, function: str, input) -> object:
    answer = tool(kind="evaluate", module=module, function=function, input=input)
    assert answer["success"], answer.get("error")
    assert [t["name"] for t in answer["timings"]][:3] == ["prepare", "warmup", "evaluate"]
    return answer["output"]


def _central(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        grad.flat[i] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


def test_define_names_what_the_tool_lacks(tool) -> None:
    assert tool(kind="define", module="lse")["success"]
    answer = tool(kind="define", module="ba")
    assert not answer["success"] and "no programs for eval 'ba'" in answer["error"]


def test_hello_and_lse(tool) -> None:
    assert _evaluate(tool, "hello", "square", 3.0) == 9.0
    assert _evaluate(tool, "hello", "double", 3.0) == 6.0
    x = np.random.default_rng(1).uniform(-3, 3, 37)
    runs = {"min_runs": 2, "min_seconds": 0}
    assert np.isclose(_evaluate(tool, "lse", "primal", {"x": x.tolist()} | runs), np.log(np.sum(np.exp(x))),
                      rtol=1e-14)
    softmax = np.exp(x) / np.sum(np.exp(x))
    np.testing.assert_allclose(_evaluate(tool, "lse", "gradient", {"x": x.tolist()} | runs), softmax, rtol=1e-12)


def _llsq(x: np.ndarray, n: int) -> float:
    total = 0.0
    for i in range(n):
        t = -1.0 + 2.0 * i / (n - 1)
        total += (np.sign(t) - sum(x[j] * t**j for j in range(x.size))) ** 2
    return total / 2


def test_llsq(tool) -> None:
    x, n = np.random.default_rng(2).uniform(-1, 1, 6), 9
    given = {"x": x.tolist(), "n": n, "min_runs": 1, "min_seconds": 0}
    assert np.isclose(_evaluate(tool, "llsq", "primal", given), _llsq(x, n), rtol=1e-12)
    np.testing.assert_allclose(_evaluate(tool, "llsq", "gradient", given), _central(lambda v: _llsq(v, n), x),
                               rtol=1e-6)


def _ode(x: np.ndarray, steps: int) -> np.ndarray:
    def rate(y):
        return np.concatenate([x[:1], x[1:] * y[:-1]])

    y, h = np.zeros_like(x), 2.0 / steps
    for _ in range(steps):
        k1 = rate(y)
        k2 = rate(y + h / 2 * k1)
        k3 = rate(y + h / 2 * k2)
        k4 = rate(y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


def test_ode(tool) -> None:
    x, steps = np.random.default_rng(3).uniform(0, 1, 7), 5
    given = {"x": x.tolist(), "s": steps, "min_runs": 1, "min_seconds": 0}
    np.testing.assert_allclose(_evaluate(tool, "ode", "primal", given), _ode(x, steps), rtol=1e-13)

    def last(v, steps=steps):
        return _ode(v, steps)[-1]
    np.testing.assert_allclose(_evaluate(tool, "ode", "gradient", given), _central(last, x), rtol=1e-6, atol=1e-10)


def _log_posterior(d, k, x, m, gamma, alpha, mu, q, l) -> float:
    """log(prod_i sum_k phi_k N(x_i; mu_k, (Q_k^T Q_k)^-1)) + sum_k log Wishart(Q_k^T Q_k; d + m + 1, I / gamma^2),
    from scipy's densities (the eval's README definition)."""
    phi = np.exp(alpha) / np.sum(np.exp(alpha))
    rows, cols = np.tril_indices(d, -1)
    order = np.lexsort((rows, cols))  # l fills L column by column
    total = 0.0
    precisions = []
    for c in range(k):
        Q = np.diag(np.exp(q[c]))
        Q[rows[order], cols[order]] = l[c]
        precisions.append(Q.T @ Q)
    for xi in x:
        total += np.log(sum(phi[c] * stats.multivariate_normal.pdf(xi, mu[c], np.linalg.inv(precisions[c]))
                            for c in range(k)))
    for c in range(k):
        total += stats.wishart.logpdf(precisions[c], df=d + m + 1, scale=np.eye(d) / gamma**2)
    return total


def test_gmm(tool) -> None:
    rng = np.random.default_rng(4)
    d, k, n, m, gamma = 3, 2, 5, 1, 1.3
    params = {"alpha": rng.normal(size=k), "mu": rng.uniform(size=(k, d)), "q": 0.3 * rng.normal(size=(k, d)),
              "l": 0.3 * rng.normal(size=(k, d * (d - 1) // 2))}
    x = rng.normal(size=(n, d))
    given = {"d": d, "k": k, "n": n, "x": x.tolist(), "m": m, "gamma": gamma, "min_runs": 1, "min_seconds": 0} | {
        name: value.tolist() for name, value in params.items()}

    def objective(**changed):
        return _log_posterior(d, k, x, m, gamma, **(params | changed))

    assert np.isclose(_evaluate(tool, "gmm", "objective", given), objective(), rtol=1e-12)
    jacobian = _evaluate(tool, "gmm", "jacobian", given)
    assert sorted(jacobian) == ["alpha", "l", "mu", "q"]
    for name, value in params.items():
        want = _central(lambda v, name=name: objective(**{name: v}), value)
        np.testing.assert_allclose(np.array(jacobian[name]), want, rtol=1e-6, atol=1e-8, err_msg=name)


def test_relay_compares_relatively_and_at_the_output_scale() -> None:
    assert compare([1.0, 2e-3], [1.0 + 1e-12, 2e-3 * (1 + 1e-12)], 1e-8)[0]
    assert not compare([1.0, 2e-3], [1.0, 2.0000001e-3], 1e-8)[0]  # relative, not absolute below 1
    assert compare([5.0, 1e-20], [5.0, -3e-19], 1e-8)[0]  # rounding-level values far below the scale
    assert not compare({"a": [1.0]}, {"a": [1.0, 2.0]}, 1e-8)[0]
    assert not compare({"a": [1.0]}, {"b": [1.0]}, 1e-8)[0]


def _lstm(main_params, extra_params, state, sequence) -> float:
    """ADBench's LSTM objective, element by element as its C++ reference computes it."""
    def sigmoid(v):
        return 1.0 / (1.0 + np.exp(-v))

    layers, b = main_params.shape[0] // 2, sequence.shape[1]
    hidden, cell = state[0::2].copy(), state[1::2].copy()
    total = 0.0
    for t in range(sequence.shape[0] - 1):
        layer_input = sequence[t] * extra_params[0]
        for k in range(layers):
            weight, bias = main_params[2 * k], main_params[2 * k + 1]
            for j in range(b):
                forget = sigmoid(layer_input[j] * weight[j] + bias[j])
                ingate = sigmoid(hidden[k, j] * weight[b + j] + bias[b + j])
                outgate = sigmoid(layer_input[j] * weight[2 * b + j] + bias[2 * b + j])
                change = np.tanh(hidden[k, j] * weight[3 * b + j] + bias[3 * b + j])
                cell[k, j] = cell[k, j] * forget + ingate * change
                hidden[k, j] = outgate * np.tanh(cell[k, j])
            layer_input = hidden[k]
        y = layer_input * extra_params[1] + extra_params[2]
        total += np.sum(sequence[t + 1] * (y - np.log(np.sum(np.exp(y)) + 2)))
    return -total / ((sequence.shape[0] - 1) * b)


def test_lstm(tool) -> None:
    rng = np.random.default_rng(5)
    layers, chars, bits = 2, 6, 3
    arrays = {"main_params": rng.random((2 * layers, 4 * bits)), "extra_params": rng.random((3, bits)),
              "state": rng.random((2 * layers, bits)),
              "sequence": rng.integers(0, 2, (chars, bits)).astype(np.float64)}
    given = {name: value.tolist() for name, value in arrays.items()} | {"min_runs": 1, "min_seconds": 0}
    assert np.isclose(_evaluate(tool, "lstm", "objective", given), _lstm(**arrays), rtol=1e-12)
    main = _central(lambda v: _lstm(**(arrays | {"main_params": v})), arrays["main_params"])
    extra = _central(lambda v: _lstm(**(arrays | {"extra_params": v})), arrays["extra_params"])
    np.testing.assert_allclose(_evaluate(tool, "lstm", "jacobian", given),
                               np.concatenate([main.ravel(), extra.ravel()]), rtol=1e-6, atol=1e-9)
