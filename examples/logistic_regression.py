"""gradflow's main demo: train a logistic-regression classifier whose loss is a DaCe program.

1. The loss is an ordinary `@dace.program` (maps, exp/log, a reduction).
2. `gradflow.grad` builds a new SDFG that also computes d loss / d weights; the gradient is checked
   against `torch.autograd` on the same data.
3. A few steps of gradient descent run through `gradflow.value_and_grad` (compiled once, cached).
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import dace  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import gradflow  # noqa: E402

N = dace.symbol("N")  # samples
D = dace.symbol("D")  # features


@dace.program
def logistic_loss(X: dace.float64[N, D], y: dace.float64[N], w: dace.float64[D], b: dace.float64[1],
                  loss: dace.float64[1]):
    z = np.ndarray([N], dtype=np.float64)
    z[:] = 0
    for i, j in dace.map[0:N, 0:D]:
        z[i] += X[i, j] * w[j]
    p = 1.0 / (1.0 + np.exp(-(z + b[0])))
    loss[0] = -np.sum(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)) / N + 0.01 * np.sum(w * w)


def torch_loss(X, y, w, b):
    p = torch.sigmoid(X @ w + b[0])
    return -torch.sum(y * torch.log(p) + (1 - y) * torch.log(1 - p)) / X.shape[0] + 0.01 * torch.sum(w * w)


def main() -> None:
    rng = np.random.default_rng(0)
    n, d = 200, 5
    true_w = rng.standard_normal(d)
    X = rng.standard_normal((n, d))
    y = (X @ true_w + 0.3 * rng.standard_normal(n) > 0).astype(np.float64)
    w = np.zeros(d)
    b = np.zeros(1)

    t0 = time.perf_counter()
    sdfg = gradflow.grad(logistic_loss, wrt=["w", "b"], of="loss")
    print(f"differentiated '{logistic_loss.name}' in {time.perf_counter() - t0:.2f} s: "
          f"{len(list(sdfg.all_control_flow_blocks()))} blocks, gradient outputs "
          f"{sorted(n for n in sdfg.arrays if n.startswith('grad_'))}")

    step = gradflow.value_and_grad(logistic_loss, wrt=["w", "b"], of="loss")
    w0 = rng.standard_normal(d)
    value, grads = step(X=X, y=y, w=w0.copy(), b=b.copy())
    wt = torch.tensor(w0, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    ref = torch_loss(torch.tensor(X), torch.tensor(y), wt, bt)
    ref.backward()
    err_w = np.max(np.abs(grads["w"] - wt.grad.numpy()) / (np.abs(wt.grad.numpy()) + 1e-300))
    err_b = abs(grads["b"][0] - bt.grad.item()) / abs(bt.grad.item())
    print(f"check against torch.autograd: loss {value:.12f} vs {ref.item():.12f}; "
          f"max relative gradient error w {err_w:.1e}, b {err_b:.1e}")
    if not (err_w < 1e-9 and err_b < 1e-9 and abs(value - ref.item()) < 1e-9):
        raise SystemExit("gradient check FAILED")

    lr = 0.5
    for it in range(8):
        value, grads = step(X=X, y=y, w=w, b=b)
        w -= lr * grads["w"]
        b -= lr * grads["b"]
        accuracy = np.mean(((X @ w + b[0]) > 0) == (y > 0.5))
        print(f"step {it}: loss {value:.5f}  |grad w| {np.linalg.norm(grads['w']):.4f}  accuracy {accuracy:.3f}")
    print("done: the loss decreased from", f"{np.log(2):.5f}", "to", f"{value:.5f}")


if __name__ == "__main__":
    main()
