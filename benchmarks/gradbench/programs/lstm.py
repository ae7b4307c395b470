"""lstm: ADBench's LSTM objective (diagonal weights, `layers` stacked cells run over a character sequence),
the mean log-likelihood of each next character's bits, negated; and its gradient with respect to the
main (per-layer weights and biases) and extra (input weight, output weight and bias) parameters.

Written as a numpy user writes it: a loop over the characters, a loop over the layers updating the state
in place. As in ADBench's references the normalizer is `log(2 + sum(exp(y)))` (Python's `sum(..., 2)`).
"""

from __future__ import annotations

import dace
import numpy as np

from . import Function, built, forward_call

L2, B, C = dace.symbol("L2"), dace.symbol("B"), dace.symbol("C")


@dace.program
def lstm(main_params: dace.float64[L2, 4 * B], extra_params: dace.float64[3, B], state: dace.float64[L2, B],
         sequence: dace.float64[C, B], loss: dace.float64[1]):
    s = np.copy(state)
    x = np.ndarray([B], dtype=np.float64)
    total = np.zeros([1], dtype=np.float64)
    for t in range(C - 1):
        x[:] = sequence[t] * extra_params[0]
        for i in range(0, L2, 2):
            w, b = main_params[i], main_params[i + 1]
            forget = 1.0 / (1.0 + np.exp(-(x * w[0:B] + b[0:B])))
            ingate = 1.0 / (1.0 + np.exp(-(s[i] * w[B:2 * B] + b[B:2 * B])))
            outgate = 1.0 / (1.0 + np.exp(-(x * w[2 * B:3 * B] + b[2 * B:3 * B])))
            change = np.tanh(s[i] * w[3 * B:4 * B] + b[3 * B:4 * B])
            s[i + 1] = s[i + 1] * forget + ingate * change
            s[i] = outgate * np.tanh(s[i + 1])
            x[:] = s[i]
        y = x * extra_params[1] + extra_params[2]
        total[0] += np.sum(sequence[t + 1] * (y - np.log(2.0 + np.sum(np.exp(y)))))
    loss[0] = -total[0] / ((C - 1) * B)


def _inputs(input) -> dict:
    return {name: np.array(input[name], dtype=np.float64) for name in ("main_params", "extra_params", "state",
                                                                        "sequence")}


def _objective(input):
    forward, _ = built(lstm, ("main_params", "extra_params"), "loss")
    arguments, loss = _inputs(input), np.zeros(1)
    return forward_call(forward, loss, **arguments, loss=loss), lambda loss: float(loss[0])


def _jacobian(input):
    _, value_and_grad = built(lstm, ("main_params", "extra_params"), "loss")
    arguments = _inputs(input)
    # the eval's order: the gradient of main_params, then of extra_params, each row after row
    return (lambda: value_and_grad(**arguments)[1]), \
        lambda g: np.concatenate([g["main_params"].ravel(), g["extra_params"].ravel()]).tolist()


FUNCTIONS = {"objective": Function(_objective), "jacobian": Function(_jacobian)}
