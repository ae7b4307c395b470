"""Recurrent ops, unrolled over their (static) sequence length while lowering.

Every time step writes states of its own (`h` and `c` arrays per step), so the lowered program is plain
dataflow: no array is read and overwritten by the same map, no loop, and the AD engine differentiates it
exactly (the backward through time is the reverse of the unrolled chain). The price is a few states per
step, so long sequences make large programs.
"""

from __future__ import annotations

import numpy as np

from dace.libraries.blas import Gemm

from gradflow.core.wcr import SUM
from gradflow.frontend.onnx.builder import (
    InvalidNode, Lowering, RuleUnsupported, Tensor, dstr, norm_dim, same_extent,
)
from gradflow.frontend.onnx.rules.linalg import library_product, on_blas
from gradflow.frontend.onnx.table import LATEST_OPSET, Node, onnx_rule


#: The gate activations this lowering implements (ONNX's defaults): f, g, h of the specification.
_DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")


def _check_lstm(node: Node) -> None:
    acts = node.attr("activations")
    if acts is not None and [a.lower() for a in acts] != [a.lower() for a in _DEFAULT_ACTIVATIONS] * (
            len(acts) // 3):
        raise RuleUnsupported(f"activations {list(acts)} (only the defaults Sigmoid, Tanh, Tanh are lowered)")
    if node.attr("clip") is not None:
        raise RuleUnsupported("attribute 'clip'")
    if node.attr("input_forget", 0):
        raise RuleUnsupported("input_forget=1 (coupled input and forget gates)")


@onnx_rule("LSTM", opsets=(7, LATEST_OPSET))  # LSTM-1 had `output_sequence`
def lstm(lw: Lowering, node: Node) -> None:
    """ONNX's LSTM (gate order i, o, f, c): per step gates = x W^T + h R^T + Wb + Rb,
    c' = f * c + i * g, h' = o * tanh(c'). Directions forward, reverse and bidirectional; both layouts."""
    _check_lstm(node)
    layout = int(node.attr("layout", 0)) if node.opset >= 14 else 0
    direction = node.attr("direction", "forward")
    x, w, r = (lw.get(node.inputs[k]) for k in range(3))
    H = int(node.attr("hidden_size", 0)) or w.shape[1] // 4
    if x.rank != 3 or w.rank != 3 or r.rank != 3:
        raise InvalidNode(f"X, W and R must have rank 3 (got {x.rank}, {w.rank}, {r.rank})")
    T, B = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    if not isinstance(T, int):
        raise RuleUnsupported("a symbolic sequence length (the recurrence is unrolled while lowering)")
    if node.input(4):  # known while lowering (a graph input specialises the program)
        lens = np.asarray(lw.value(node.input(4))).reshape(-1)
        if any(int(v) != T for v in lens):
            raise RuleUnsupported(f"sequence_lens {lens.tolist()} shorter than the sequence ({T} steps)")
    I = x.shape[2]
    D = 2 if direction == "bidirectional" else 1
    for what, t, shape in (("W", w, (D, 4 * H, I)), ("R", r, (D, 4 * H, H))):
        if t.rank != 3:
            raise InvalidNode(f"input {what} must have shape {shape}, got {tuple(t.shape)}")
        for a, b in zip(t.shape, shape):
            same_extent(a, b, f"input {what} of shape {tuple(t.shape)} (expected {shape})")
    bias = lw.get(node.input(3)) if node.input(3) else None
    if bias is not None:
        same_extent(bias.shape[-1], 8 * H, f"input B of shape {tuple(bias.shape)} (expected ({D}, {8 * H}))")
    peephole = lw.get(node.input(7)) if node.input(7) else None
    if peephole is not None:
        same_extent(peephole.shape[-1], 3 * H, f"input P of shape {tuple(peephole.shape)} (expected ({D}, {3 * H}))")
    state_shape = (D, B, H) if layout == 0 else (B, D, H)
    h0 = lw.get(node.input(5)) if node.input(5) else None
    c0 = lw.get(node.input(6)) if node.input(6) else None
    for what, t in (("initial_h", h0), ("initial_c", c0)):
        if t is not None:
            if t.rank != 3:
                raise InvalidNode(f"input {what} must have shape {state_shape}, got {tuple(t.shape)}")
            for a, b in zip(t.shape, state_shape):
                same_extent(a, b, f"input {what} of shape {tuple(t.shape)} (expected {state_shape})")

    def at_x(t: str) -> list[str]:
        return [t, "b", "k"] if layout == 0 else ["b", t, "k"]

    def at_state(d: int) -> list[str]:
        return [str(d), "b", "j"] if layout == 0 else ["b", str(d), "j"]

    y = lw.output(node.output(0), (T, D, B, H) if layout == 0 else (B, T, D, H), x.dtype) if node.output(0) else None
    yh = lw.output(node.output(1), state_shape, x.dtype) if node.output(1) else None
    yc = lw.output(node.output(2), state_shape, x.dtype) if node.output(2) else None
    label = node.label
    # the matrices multiplied: steps (T*B, I) by W[d] (4H, I), and per step h (B, H) by R[d] (4H, H); the
    # bias (D, 8H) is added by a map, so its extent D = 1 does not matter
    blas = (on_blas(x, w, r, matrices=(norm_dim(T * B), I, 4 * H, B, H))
            and (bias is None or on_blas(bias, x, matrices=())))
    for d in range(D):
        backward = direction == "reverse" or d == 1
        h_prev, c_prev = _initial(lw, label, h0, d, (B, H), x.dtype, at_state), \
            _initial(lw, label, c0, d, (B, H), x.dtype, at_state)
        if blas:
            gates = _gates_on_blas(lw, label, x, w, r, bias, d, T, B, H, I, layout)
        else:
            gates = _gates_as_maps(lw, label, x, w, r, bias, d, T, B, H, I, at_x)
        for step in range(T):
            t = T - 1 - step if backward else step
            gate_in = gates(t, h_prev)
            h, c = lw.temp((B, H), x.dtype, "h"), lw.temp((B, H), x.dtype, "c")
            ins = {"cp": (c_prev, ["b", "j"])}
            pre = []
            for k, name in enumerate("iofc"):  # gate k's pre-activation, a sum of the terms gate_in gives
                terms = []
                for n_term, (tensor, index) in enumerate(gate_in(k)):
                    ins[f"g{name}{n_term}"] = (tensor, index)
                    terms.append(f"g{name}{n_term}")
                pre.append(f"g{name} = " + " + ".join(terms))
            peep = {"i": "", "o": "", "f": ""}
            if peephole is not None:  # P[d] = (p_i, p_o, p_f): the gates also see the cell state
                for k, name in enumerate("iof"):
                    ins[f"p{name}"] = (peephole, [str(d), _gate_index(k, H)])
                peep = {"i": " + pi * cp", "f": " + pf * cp", "o": " + po * cn"}
            lw.map(label, [("b", B), ("j", H)], ins,
                   "\n".join(pre) + "\n"
                   f"i = 1 / (1 + math.exp(-(gi{peep['i']})))\nf = 1 / (1 + math.exp(-(gf{peep['f']})))\n"
                   f"cn = f * cp + i * math.tanh(gc)\no = 1 / (1 + math.exp(-(go{peep['o']})))\n"
                   "co = cn\nho = o * math.tanh(cn)",
                   {"co": (c, ["b", "j"], None), "ho": (h, ["b", "j"], None)})
            if y is not None:
                lw.map(label, [("b", B), ("j", H)], {"a": (h, ["b", "j"])}, "o = a",
                       {"o": (y, [str(t), str(d), "b", "j"] if layout == 0 else ["b", str(t), str(d), "j"], None)})
            h_prev, c_prev = h, c
        for out, last in ((yh, h_prev), (yc, c_prev)):
            if out is not None:
                lw.map(label, [("b", B), ("j", H)], {"a": (last, ["b", "j"])}, "o = a",
                       {"o": (out, at_state(d), None)})


def _gate_index(k: int, H: int) -> str:
    return f"j + {k * H}" if k else "j"


def _gates_as_maps(lw: Lowering, label: str, x: Tensor, w: Tensor, r: Tensor, bias: Tensor | None, d: int,
                   T: int, B, H: int, I, at_x):
    """Gate pre-activations as contraction maps (element types BLAS does not have): the input projections
    of every step at once, g[t, b, q] = sum_k x[t, b, k] w[d, q, k] + Wb + Rb, and per step
    g[t] += h R^T. Returns `gates(t, h_prev)`, which emits step t's recurrent term and returns, per gate
    k, the terms (tensor, index over b, j) whose sum is its pre-activation."""
    g = lw.temp((T, B, 4 * H), x.dtype, "gates")
    if bias is not None:
        lw.map(label, [("t", T), ("b", B), ("q", 4 * H)],
               {"wb": (bias, [str(d), "q"]), "rb": (bias, [str(d), f"q + {4 * H}"])}, "o = wb + rb",
               {"o": (g, ["t", "b", "q"], None)})
    else:
        lw.fill(label, g, "0")
    lw.map(label, [("t", T), ("b", B), ("q", 4 * H), ("k", I)],
           {"a": (x, at_x("t")), "w": (w, [str(d), "q", "k"])}, "o = a * w", {"o": (g, ["t", "b", "q"], SUM)})

    def gates(t: int, h_prev: Tensor):
        lw.map(label, [("b", B), ("q", 4 * H), ("j", H)],
               {"h": (h_prev, ["b", "j"]), "r": (r, [str(d), "q", "j"])}, "o = h * r",
               {"o": (g, [str(t), "b", "q"], SUM)})
        return lambda k: [(g, [str(t), "b", _gate_index(k, H)])]
    return gates


def _gates_on_blas(lw: Lowering, label: str, x: Tensor, w: Tensor, r: Tensor, bias: Tensor | None, d: int,
                   T: int, B, H: int, I, layout: int):
    """Gate pre-activations with matrix products on BLAS: the input projections of all steps as one Gemm,
    xs[(t, b), :] @ W[d]^T, and per step h @ R[d]^T (a Gemm into a step temporary); both biases added
    to the input projections once. Same contract as `_gates_as_maps`."""
    rows = norm_dim(T * B)
    xs = lw.temp((rows, I), x.dtype, "steps")
    row = f"t * ({dstr(B)}) + b"
    lw.map(label, [("t", T), ("b", B), ("k", I)], {"a": (x, ["t", "b", "k"] if layout == 0 else ["b", "t", "k"])},
           "o = a", {"o": (xs, [row, "k"], None)})
    wd, rd = lw.temp((4 * H, I), w.dtype, "w"), lw.temp((4 * H, H), r.dtype, "r")
    for src, dst, extent in ((w, wd, I), (r, rd, H)):
        lw.map(label, [("q", 4 * H), ("k", extent)], {"a": (src, [str(d), "q", "k"])}, "o = a",
               {"o": (dst, ["q", "k"], None)})
    g = lw.temp((rows, 4 * H), x.dtype, "gates")
    library_product(lw, label, Gemm("gemm", alpha=1, beta=0, cin=False, transB=True), {"_a": xs, "_b": wd}, g)
    if bias is not None:  # added once for all steps: in the step map its adjoint would be a sum over the batch
        biased = lw.temp((rows, 4 * H), x.dtype, "gates")
        lw.map(label, [("s", rows), ("q", 4 * H)],
               {"a": (g, ["s", "q"]), "wb": (bias, [str(d), "q"]), "rb": (bias, [str(d), f"q + {4 * H}"])},
               "o = a + wb + rb", {"o": (biased, ["s", "q"], None)})
        g = biased

    def gates(t: int, h_prev: Tensor):
        hr = lw.temp((B, 4 * H), x.dtype, "hr")
        library_product(lw, label, Gemm("gemm", alpha=1, beta=0, cin=False, transB=True), {"_a": h_prev, "_b": rd},
                        hr)
        return lambda k: [(g, [f"{t} * ({dstr(B)}) + b", _gate_index(k, H)]), (hr, ["b", _gate_index(k, H)])]
    return gates


def _initial(lw: Lowering, label: str, given: Tensor | None, d: int, shape, dtype: np.dtype, at_state) -> Tensor:
    """The state before the first step of direction d: a copy of initial_h / initial_c, or zeros."""
    out = lw.temp(shape, dtype, "h0")
    if given is None:
        lw.fill(label, out, "0")
    else:
        lw.map(label, [("b", shape[0]), ("j", shape[1])], {"a": (given, at_state(d))}, "o = a",
               {"o": (out, ["b", "j"], None)})
    return out
