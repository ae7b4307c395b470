"""Recurrent ops (RNN, GRU, LSTM), unrolled over their (static) sequence length while lowering.

Every time step writes states of its own (an `h` array per step, and `c` for LSTM), so the lowered program
is plain dataflow: no array is read and overwritten by the same map, no loop, and the AD engine
differentiates it exactly (the backward through time is the reverse of the unrolled chain). The price is a
few states per step, so long sequences make large programs.

The three ops share their parsing and their matrix products (`_Projections`): the input projections of
all steps as one product, the recurrent product per step; they differ only in the step's gate formulas.
Gate activations come from the elementwise table (`rules/elementwise.toml`, its `onnx` names), so any
one-argument activation it maps (Sigmoid, Tanh, Relu, ...) is lowered and differentiated like the op.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np
import sympy
from dace.libraries.blas import Gemm

from gradflow.core.elementwise import elementwise_table
from gradflow.core.wcr import SUM
from gradflow.frontend.onnx.builder import (
    Dim,
    InvalidNode,
    Lowering,
    RuleUnsupported,
    Tensor,
    dstr,
    norm_dim,
    same_extent,
)
from gradflow.frontend.onnx.rules.elementwise import printer
from gradflow.frontend.onnx.rules.linalg import library_product, on_blas
from gradflow.frontend.onnx.table import LATEST_OPSET, Node, onnx_rule

#: An activation as code: the expression applying it to the expression (a string) it is given.
Activation = Callable[[str], str]
Term = tuple[Tensor, list[str]]


@attrs.frozen
class _Recurrence:
    """What RNN, GRU and LSTM nodes share, checked: X (T, B, K) or batch first, W (D, G*H, K), R (D, G*H, H),
    B (D, 2*G*H), initial_h, the direction(s) and per direction the activations."""

    x: Tensor
    w: Tensor
    r: Tensor
    bias: Tensor | None
    h0: Tensor | None
    T: int
    B: Dim
    H: int
    K: Dim  # input features
    G: int
    layout: int
    directions: tuple[bool, ...]  # per direction: whether it runs from the last step back
    acts: tuple[tuple[Activation, ...], ...]

    def at_x(self, t: str) -> list[str]:
        return [t, "b", "k"] if self.layout == 0 else ["b", t, "k"]

    def at_state(self, d: int) -> list[str]:
        return [str(d), "b", "j"] if self.layout == 0 else ["b", str(d), "j"]

    @property
    def state_shape(self) -> tuple:
        D = len(self.directions)
        return (D, self.B, self.H) if self.layout == 0 else (self.B, D, self.H)

    def check_state(self, what: str, t: Tensor | None) -> None:
        if t is None:
            return
        if t.rank != 3:
            raise InvalidNode(f"input {what} must have shape {self.state_shape}, got {tuple(t.shape)}")
        for a, b in zip(t.shape, self.state_shape):
            same_extent(a, b, f"input {what} of shape {tuple(t.shape)} (expected {self.state_shape})")


def _activations(node: Node, defaults: tuple[str, ...], D: int, dtype) -> tuple[tuple[Activation, ...], ...]:
    """Per direction, the node's activations (attribute `activations`, else ONNX's defaults for the op), each
    from the elementwise table's formula for the ONNX op of that name."""
    if node.attr("activation_alpha") is not None or node.attr("activation_beta") is not None:
        raise RuleUnsupported("attributes activation_alpha/activation_beta (parametrised activations)")
    given = node.attr("activations")
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in given] if given is not None else list(defaults) * D
    if len(names) != len(defaults) * D:
        raise InvalidNode(f"activations {names}: expected {len(defaults)} per direction, {len(defaults) * D} in all")
    table = {op.lower(): entry for op, entry in elementwise_table().by_onnx.items()}
    code = printer(dtype)

    def activation(name: str) -> Activation:
        entry = table.get(name.lower())
        if entry is None or len(entry.args) != 1:
            raise RuleUnsupported(f"activation '{name}' (lowered: one-argument elementwise ops such as "
                                  "Sigmoid, Tanh, Relu)")
        (arg,) = [s for s in entry.expr.free_symbols if s.name == entry.args[0]] or [sympy.Symbol(entry.args[0])]
        z = sympy.Symbol("gradflow_z", real=True)
        text = code(entry.expr.subs(arg, z))
        return lambda e: "(" + text.replace("gradflow_z", f"({e})") + ")"

    n = len(defaults)
    return tuple(tuple(activation(a) for a in names[d * n:(d + 1) * n]) for d in range(D))


def _recurrence(lw: Lowering, node: Node, G: int, defaults: tuple[str, ...]) -> _Recurrence:
    """Check `node` (G gates per direction) and gather what its lowering needs."""
    if node.attr("clip") is not None:
        raise RuleUnsupported("attribute 'clip'")
    layout = int(node.attr("layout", 0)) if node.opset >= 14 else 0
    direction = node.attr("direction", "forward")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("forward", "reverse", "bidirectional"):
        raise InvalidNode(f"direction '{direction}' (forward, reverse or bidirectional)")
    D = 2 if direction == "bidirectional" else 1
    x, w, r = (lw.get(node.inputs[k]) for k in range(3))
    if x.rank != 3 or w.rank != 3 or r.rank != 3:
        raise InvalidNode(f"X, W and R must have rank 3 (got {x.rank}, {w.rank}, {r.rank})")
    H = int(node.attr("hidden_size", 0)) or w.shape[1] // G
    T, B = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    if not isinstance(T, int):
        raise RuleUnsupported("a symbolic sequence length (the recurrence is unrolled while lowering)")
    if node.input(4):  # known while lowering (a graph input specialises the program)
        lens = np.asarray(lw.value(node.input(4))).reshape(-1)
        if any(int(v) != T for v in lens):
            raise RuleUnsupported(f"sequence_lens {lens.tolist()} shorter than the sequence ({T} steps)")
    K = x.shape[2]
    for what, t, shape in (("W", w, (D, G * H, K)), ("R", r, (D, G * H, H))):
        for a, b in zip(t.shape, shape):
            same_extent(a, b, f"input {what} of shape {tuple(t.shape)} (expected {shape})")
    bias = lw.get(node.input(3)) if node.input(3) else None
    if bias is not None:
        same_extent(bias.shape[-1], 2 * G * H,
                    f"input B of shape {tuple(bias.shape)} (expected ({D}, {2 * G * H}))")
    h0 = lw.get(node.input(5)) if node.input(5) else None
    directions = (True,) if direction == "reverse" else (False, True)[:D]
    rec = _Recurrence(x, w, r, bias, h0, T, B, H, K, G, layout, directions,
                      _activations(node, defaults, D, x.dtype))
    rec.check_state("initial_h", h0)
    return rec


def _gate(k: int, H: int) -> str:
    """Index of gate k's element j in a row of all gates."""
    return f"j + {k * H}" if k else "j"


class _Projections:
    """The matrix products of direction d: the input projections of all steps at once (x W[d]^T plus the
    biases: W's, and R's for the gates in `merged`), and per step h R[d]^T over a range of gates. On BLAS
    (Gemm nodes) where the element type and extents allow, else as contraction maps."""

    def __init__(self, lw: Lowering, label: str, s: _Recurrence, d: int, merged: frozenset[int]):
        self.lw, self.label, self.s, self.d = lw, label, s, d
        T, B, H, K, G = s.T, s.B, s.H, s.K, s.G
        self.blas = (on_blas(s.x, s.w, s.r, matrices=(norm_dim(T * B), K, G * H, B, H))
                     and (s.bias is None or on_blas(s.bias, s.x, matrices=())))
        self.rows = norm_dim(T * B)
        bsum = self._bias_sum(merged)
        g = lw.temp((self.rows, G * H), s.x.dtype, "gates")
        row = f"t * ({dstr(B)}) + b"
        if self.blas:
            xs = lw.temp((self.rows, K), s.x.dtype, "steps")
            lw.map(label, [("t", T), ("b", B), ("k", K)], {"a": (s.x, s.at_x("t"))}, "o = a",
                   {"o": (xs, [row, "k"], None)})
            wd = self._rows_of(s.w, 0, G * H, K)
            product = g if bsum is None else lw.temp((self.rows, G * H), s.x.dtype, "gates")
            library_product(lw, label, Gemm("gemm", alpha=1, beta=0, cin=False, transB=True),
                            {"_a": xs, "_b": wd}, product)
            if bsum is not None:  # added once for all steps: in a step map its adjoint would be a sum over b
                lw.map(label, [("s", self.rows), ("q", G * H)], {"a": (product, ["s", "q"]), "c": (bsum, ["q"])},
                       "o = a + c", {"o": (g, ["s", "q"], None)})
        else:
            if bsum is None:
                lw.fill(label, g, "0")
            else:
                lw.map(label, [("s", self.rows), ("q", G * H)], {"c": (bsum, ["q"])}, "o = c",
                       {"o": (g, ["s", "q"], None)})
            lw.map(label, [("t", T), ("b", B), ("q", G * H), ("k", K)],
                   {"a": (s.x, s.at_x("t")), "w": (s.w, [str(d), "q", "k"])}, "o = a * w",
                   {"o": (g, [row, "q"], SUM)})
        self.g = g
        self._r_rows: dict[tuple[int, int], Tensor] = {}

    def _bias_sum(self, merged: frozenset[int]) -> Tensor | None:
        """W's bias of every gate, plus R's for the gates in `merged` (one vector of G*H)."""
        s, lw, d = self.s, self.lw, self.d
        if s.bias is None:
            return None
        out = lw.temp((s.G * s.H,), s.x.dtype, "bias")
        GH = s.G * s.H
        for k in range(s.G):
            ins = {"wb": (s.bias, [str(d), _gate(k, s.H)])}
            code = "o = wb"
            if k in merged:
                ins["rb"] = (s.bias, [str(d), f"j + {GH + k * s.H}"])
                code = "o = wb + rb"
            lw.map(self.label, [("j", s.H)], ins, code, {"o": (out, [_gate(k, s.H)], None)})
        return out

    def _rows_of(self, m: Tensor, q0: int, nq: int, cols) -> Tensor:
        """A copy of rows q0 .. q0 + nq of matrix m[d] (the operand of a Gemm)."""
        out = self.lw.temp((nq, cols), m.dtype, "w")
        self.lw.map(self.label, [("q", nq), ("k", cols)], {"a": (m, [str(self.d), f"q + {q0}", "k"])}, "o = a",
                    {"o": (out, ["q", "k"], None)})
        return out

    def input_term(self, t: int, k: int) -> Term:
        """Gate k's input projection (with its merged biases) at step t, indexed by b, j."""
        return self.g, [f"{t} * ({dstr(self.s.B)}) + b", _gate(k, self.s.H)]

    def recurrent_bias(self, k: int) -> Term | None:
        """R's bias of gate k, indexed by j (for a gate whose R bias is not merged)."""
        s = self.s
        return None if s.bias is None else (s.bias, [str(self.d), f"j + {s.G * s.H + k * s.H}"])

    def recurrent(self, h: Tensor, q0: int, nq: int) -> Tensor:
        """h R[d, q0:q0 + nq]^T, a (B, nq) array."""
        s, lw = self.s, self.lw
        out = lw.temp((s.B, nq), s.x.dtype, "hr")
        if self.blas:
            if (q0, nq) not in self._r_rows:
                self._r_rows[q0, nq] = self._rows_of(s.r, q0, nq, s.H)
            library_product(lw, self.label, Gemm("gemm", alpha=1, beta=0, cin=False, transB=True),
                            {"_a": h, "_b": self._r_rows[q0, nq]}, out)
        else:
            lw.fill(self.label, out, "0")
            lw.map(self.label, [("b", s.B), ("q", nq), ("j", s.H)],
                   {"h": (h, ["b", "j"]), "r": (s.r, [str(self.d), f"q + {q0}", "j"])}, "o = h * r",
                   {"o": (out, ["b", "q"], SUM)})
        return out


def _initial(lw: Lowering, label: str, s: _Recurrence, given: Tensor | None, d: int) -> Tensor:
    """The state before the first step of direction d: a copy of initial_h / initial_c, or zeros."""
    out = lw.temp((s.B, s.H), s.x.dtype, "h0")
    if given is None:
        lw.fill(label, out, "0")
    else:
        lw.map(label, [("b", s.B), ("j", s.H)], {"a": (given, s.at_state(d))}, "o = a",
               {"o": (out, ["b", "j"], None)})
    return out


def _step_map(lw: Lowering, label: str, s: _Recurrence, ins: dict[str, Term | None], code: list[str],
              outs: dict[str, Tensor]) -> None:
    """One map over (b, j) computing `code` from `ins` (absent ones left out) into the (B, H) arrays `outs`."""
    lw.map(label, [("b", s.B), ("j", s.H)], {k: v for k, v in ins.items() if v is not None}, "\n".join(code),
           {k: (v, ["b", "j"], None) for k, v in outs.items()})


def _outputs(lw: Lowering, node: Node, s: _Recurrence, n_states: int):
    """The node's outputs: Y (T, D, B, H) or batch first, then the last states Y_h (and Y_c)."""
    D = len(s.directions)
    y = lw.output(node.output(0), (s.T, D, s.B, s.H) if s.layout == 0 else (s.B, s.T, D, s.H), s.x.dtype) \
        if node.output(0) else None
    last = [lw.output(node.output(k), s.state_shape, s.x.dtype) if node.output(k) else None
            for k in range(1, 1 + n_states)]
    return y, last


def _run(lw: Lowering, node: Node, s: _Recurrence, merged: frozenset[int], initial: tuple[Tensor | None, ...],
         step) -> None:
    """Unroll the recurrence: per direction its projections, then per step `step(proj, d, t, states)`, which
    emits the step and returns the new states (h first); h goes to Y, the last states to Y_h (, Y_c)."""
    y, last = _outputs(lw, node, s, len(initial))
    label = node.label
    for d, backward in enumerate(s.directions):
        proj = _Projections(lw, label, s, d, merged)
        states = tuple(_initial(lw, label, s, given, d) for given in initial)
        for n in range(s.T):
            t = s.T - 1 - n if backward else n
            states = step(proj, d, t, states)
            if y is not None:
                lw.map(label, [("b", s.B), ("j", s.H)], {"a": (states[0], ["b", "j"])}, "o = a",
                       {"o": (y, [str(t), str(d), "b", "j"] if s.layout == 0 else ["b", str(t), str(d), "j"],
                              None)})
        for out, state in zip(last, states):
            if out is not None:
                lw.map(label, [("b", s.B), ("j", s.H)], {"a": (state, ["b", "j"])}, "o = a",
                       {"o": (out, s.at_state(d), None)})


@onnx_rule("RNN", opsets=(7, LATEST_OPSET))
def rnn(lw: Lowering, node: Node) -> None:
    """ONNX's RNN: h' = f(x W^T + h R^T + Wb + Rb) (f Tanh by default; torch's nn.RNN exports Tanh or Relu)."""
    s = _recurrence(lw, node, 1, ("Tanh",))

    def step(proj: _Projections, d: int, t: int, states):
        (h_prev,) = states
        (f,) = s.acts[d]
        hr = proj.recurrent(h_prev, 0, s.H)
        h = lw.temp((s.B, s.H), s.x.dtype, "h")
        _step_map(lw, node.label, s, {"gx": proj.input_term(t, 0), "gh": (hr, ["b", "j"])},
                  [f"ho = {f('gx + gh')}"], {"ho": h})
        return (h,)

    _run(lw, node, s, frozenset({0}), (s.h0,), step)


@onnx_rule("GRU", opsets=(7, LATEST_OPSET))  # GRU-1 had `output_sequence`
def gru(lw: Lowering, node: Node) -> None:
    """ONNX's GRU (gate order z, r, h): z = f(x Wz + h Rz + b), r = f(x Wr + h Rr + b),
    n = g(x Wh + Wbh + r * (h Rh + Rbh)) with `linear_before_reset` (torch's nn.GRU), else
    n = g(x Wh + (r * h) Rh + Wbh + Rbh); h' = (1 - z) * n + z * h."""
    s = _recurrence(lw, node, 3, ("Sigmoid", "Tanh"))
    before_reset = bool(node.attr("linear_before_reset", 0))
    H = s.H

    def step(proj: _Projections, d: int, t: int, states):
        (h_prev,) = states
        f, g = s.acts[d]
        h = lw.temp((s.B, H), s.x.dtype, "h")
        ins: dict[str, Term | None] = {"hp": (h_prev, ["b", "j"])}
        for k, name in enumerate("zrh"):
            ins[f"x{name}"] = proj.input_term(t, k)
        if before_reset:
            hr = proj.recurrent(h_prev, 0, 3 * H)
            ins.update({f"h{name}": (hr, ["b", _gate(k, H)]) for k, name in enumerate("zrh")})
            ins["rbh"] = proj.recurrent_bias(2)
            reset = "hh + rbh" if ins["rbh"] is not None else "hh"
            code = [f"z = {f('xz + hz')}", f"r = {f('xr + hr')}", f"n = {g(f'xh + r * ({reset})')}"]
        else:  # the reset gate scales h before its product: r first, then (r * h) Rh^T
            hr = proj.recurrent(h_prev, 0, 2 * H)
            rh = lw.temp((s.B, H), s.x.dtype, "rh")
            _step_map(lw, node.label, s, {"xr": ins["xr"], "hr": (hr, ["b", _gate(1, H)]), "hp": ins["hp"]},
                      [f"rh = {f('xr + hr')} * hp"], {"rh": rh})
            hn = proj.recurrent(rh, 2 * H, H)
            ins = {"hp": ins["hp"], "xz": ins["xz"], "xh": ins["xh"], "hz": (hr, ["b", "j"]),
                   "hh": (hn, ["b", "j"])}
            code = [f"z = {f('xz + hz')}", f"n = {g('xh + hh')}"]
        _step_map(lw, node.label, s, ins, code + ["ho = (1 - z) * n + z * hp"], {"ho": h})
        return (h,)

    _run(lw, node, s, frozenset({0, 1}) if before_reset else frozenset({0, 1, 2}), (s.h0,), step)


@onnx_rule("LSTM", opsets=(7, LATEST_OPSET))  # LSTM-1 had `output_sequence`
def lstm(lw: Lowering, node: Node) -> None:
    """ONNX's LSTM (gate order i, o, f, c): per step gates = x W^T + h R^T + Wb + Rb,
    c' = f * c + i * g(gc), h' = o * h(c'), the gates i, o, f through f (Sigmoid); peepholes P = (p_i, p_o,
    p_f) add p * c to the gates' pre-activations. Directions forward, reverse and bidirectional; both layouts."""
    if node.attr("input_forget", 0):
        raise RuleUnsupported("input_forget=1 (coupled input and forget gates)")
    s = _recurrence(lw, node, 4, ("Sigmoid", "Tanh", "Tanh"))
    D, H = len(s.directions), s.H
    peephole = lw.get(node.input(7)) if node.input(7) else None
    if peephole is not None:
        same_extent(peephole.shape[-1], 3 * H, f"input P of shape {tuple(peephole.shape)} (expected ({D}, {3 * H}))")
    c0 = lw.get(node.input(6)) if node.input(6) else None
    s.check_state("initial_c", c0)

    def step(proj: _Projections, d: int, t: int, states):
        h_prev, c_prev = states
        f, g, act_h = s.acts[d]
        hr = proj.recurrent(h_prev, 0, 4 * H)
        h, c = lw.temp((s.B, H), s.x.dtype, "h"), lw.temp((s.B, H), s.x.dtype, "c")
        ins: dict[str, Term | None] = {"cp": (c_prev, ["b", "j"])}
        for k, name in enumerate("iofc"):
            ins[f"x{name}"] = proj.input_term(t, k)
            ins[f"h{name}"] = (hr, ["b", _gate(k, H)])
        peep = {"i": "", "o": "", "f": ""}
        if peephole is not None:  # P[d] = (p_i, p_o, p_f): the gates also see the cell state
            for k, name in enumerate("iof"):
                ins[f"p{name}"] = (peephole, [str(d), _gate(k, H)])
            peep = {"i": " + pi * cp", "f": " + pf * cp", "o": " + po * cn"}
        _step_map(lw, node.label, s, ins, [
            f"i = {f('xi + hi' + peep['i'])}", f"fg = {f('xf + hf' + peep['f'])}",
            f"cn = fg * cp + i * {g('xc + hc')}", f"o = {f('xo + ho' + peep['o'])}",
            "co = cn", f"hn = o * {act_h('cn')}"], {"co": c, "hn": h})
        return h, c

    _run(lw, node, s, frozenset(range(4)), (s.h0, c0), step)
