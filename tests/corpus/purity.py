"""Purity corpus: diverse SDFGs on which every gradflow pass must leave its input untouched.

`purity_corpus()` builds fresh SDFGs on every call (so a test may mutate-check them freely):
- programs of the dataflow and loop corpora through `to_sdfg(simplify=True)`: maps with WCR, multi-output
  tasklets, library nodes (Reduce), LoopRegions, ConditionalBlocks, a data-dependent while loop, a
  `break`, a map over a nested SDFG with loops;
- a few programs through `to_sdfg(simplify=False)`, which keeps nested SDFGs (one per map body) and one
  state per statement;
- SDFGs built with the SDFG API: a nested SDFG, a LoopRegion, a ConditionalBlock (`api_sdfgs()`), and a
  loop around an if/else and a while loop written as conditional interstate edges (`unstructured.py`).
"""

from __future__ import annotations

from typing import Callable

import dace
import numpy as np
from dace.properties import CodeBlock
from dace.sdfg.state import ConditionalBlock, ControlFlowRegion, LoopRegion

from gradflow.verify.corpus import dataflow, loops, unstructured

_SIMPLIFIED = (
    dataflow.df_elementwise_chain,
    dataflow.df_broadcast,
    dataflow.df_strided,
    dataflow.df_inplace_input,
    dataflow.df_multi_output_tasklet,
    dataflow.df_states_sequence,
    dataflow.df_softmax_wcr,
    dataflow.df_lib_sum_axis,
    dataflow.df_lib_softmax,
    dataflow.df_masked_assign,
    dataflow.df_gather,
    dataflow.df_scatter,
    loops.lp_jacobi_2d,
    loops.lp_lu,
    loops.lp_durbin,
    loops.lp_newton_sqrt,
    loops.lp_strided_step2_odd,
    loops.lp_negative_step,
    loops.lp_if_else,
    loops.lp_break_search,
    loops.lp_map_of_loops,
)

_UNSIMPLIFIED = (
    dataflow.df_nested_map,
    dataflow.df_overwrite_transient,
    loops.lp_softmax,
    loops.lp_conditional_accumulate,
)


def api_nested_sdfg() -> dace.SDFG:
    """X -> nested SDFG (a map computing b = sin(a) * a) -> T -> map with WCR into S."""
    inner = dace.SDFG("api_nested_inner")
    inner.add_array("a", [dace.symbol("N")], dace.float64)
    inner.add_array("b", [dace.symbol("N")], dace.float64)
    st = inner.add_state("body")
    st.add_mapped_tasklet(
        "sin_times", {"i": "0:N"}, {"x": dace.Memlet("a[i]")}, "y = sin(x) * x", {"y": dace.Memlet("b[i]")},
        external_edges=True,
    )

    sdfg = dace.SDFG("api_nested_sdfg")
    sdfg.add_array("X", [dace.symbol("N")], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    sdfg.add_transient("T", [dace.symbol("N")], dace.float64)
    state = sdfg.add_state("main")
    x = state.add_read("X")
    t = state.add_access("T")
    node = state.add_nested_sdfg(inner, {"a": None}, {"b": None}, symbol_mapping={"N": "N"})  # types inferred
    state.add_edge(x, None, node, "a", dace.Memlet("X[0:N]"))
    state.add_edge(node, "b", t, None, dace.Memlet("T[0:N]"))
    node.integrate_into_parent()
    s = state.add_write("S")
    state.add_mapped_tasklet(
        "reduce", {"i": "0:N"}, {"v": dace.Memlet("T[i]")}, "o = v * v",
        {"o": dace.Memlet("S[0]", wcr="lambda p, q: p + q")}, external_edges=True, input_nodes={"T": t},
        output_nodes={"S": s},
    )
    sdfg.validate()
    return sdfg


def api_loop_region() -> dace.SDFG:
    """S = 0; for i in [0, N): S = S * 0.5 + tanh(X[i]) -- a LoopRegion built by hand."""
    sdfg = dace.SDFG("api_loop_region")
    sdfg.add_array("X", [dace.symbol("N")], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    init = sdfg.add_state("init", is_start_block=True)
    init.add_mapped_tasklet("zero", {"k": "0:1"}, {}, "o = 0.0", {"o": dace.Memlet("S[0]")},
                            external_edges=True)
    loop = LoopRegion("loop", condition_expr="i < N", loop_var="i", initialize_expr="i = 0",
                      update_expr="i = i + 1", sdfg=sdfg)
    sdfg.add_node(loop)
    sdfg.add_edge(init, loop, dace.InterstateEdge())
    body = loop.add_state("body", is_start_block=True)
    x = body.add_read("X")
    s_in = body.add_read("S")
    s_out = body.add_write("S")
    f = dace.float64
    tasklet = body.add_tasklet("step", {"s": f, "x": f}, {"o": f}, "o = s * 0.5 + tanh(x)")
    body.add_edge(x, None, tasklet, "x", dace.Memlet("X[i]"))
    body.add_edge(s_in, None, tasklet, "s", dace.Memlet("S[0]"))
    body.add_edge(tasklet, "o", s_out, None, dace.Memlet("S[0]"))
    sdfg.validate()
    return sdfg


def api_conditional_block() -> dace.SDFG:
    """if X[0] > 0: Y = exp(X) else: Y = X * X; then S = sum(Y) by WCR -- a ConditionalBlock by hand."""
    sdfg = dace.SDFG("api_conditional_block")
    sdfg.add_array("X", [dace.symbol("N")], dace.float64)
    sdfg.add_array("Y", [dace.symbol("N")], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    cond = ConditionalBlock("branch", sdfg=sdfg)
    sdfg.add_node(cond, is_start_block=True)
    for label, expr, code in (("then", "X[0] > 0", "y = exp(x)"), ("else", None, "y = x * x")):
        region = ControlFlowRegion(label, sdfg=sdfg, parent=cond)
        st = region.add_state(label + "_state", is_start_block=True)
        st.add_mapped_tasklet(label + "_map", {"i": "0:N"}, {"x": dace.Memlet("X[i]")}, code,
                              {"y": dace.Memlet("Y[i]")}, external_edges=True)
        cond.add_branch(CodeBlock(expr) if expr is not None else None, region)
    after = sdfg.add_state("reduce")
    sdfg.add_edge(cond, after, dace.InterstateEdge())
    after.add_mapped_tasklet("sum", {"i": "0:N"}, {"y": dace.Memlet("Y[i]")}, "o = y",
                             {"o": dace.Memlet("S[0]", wcr="lambda p, q: p + q")}, external_edges=True)
    sdfg.validate()
    return sdfg


def api_sdfgs() -> list[dace.SDFG]:
    return [api_nested_sdfg(), api_loop_region(), api_conditional_block()]


def api_references() -> dict[str, tuple[dace.SDFG, Callable[[np.ndarray], float]]]:
    """The API-built SDFGs with numpy references: name -> (sdfg, fn(X) -> value of S[0] from S = 0)."""
    def cond_ref(X):
        Y = np.exp(X) if X[0] > 0 else X * X
        return Y.sum()

    def loop_ref(X):
        s = 0.0
        for x in X:
            s = s * 0.5 + np.tanh(x)
        return s

    return {
        "api_nested_sdfg": (api_nested_sdfg(), lambda X: ((np.sin(X) * X) ** 2).sum()),
        "api_loop_region": (api_loop_region(), loop_ref),
        "api_conditional_block": (api_conditional_block(), cond_ref),
    }


def purity_corpus() -> list[dace.SDFG]:
    """Fresh, diverse SDFGs (25 of them) for checking that passes never mutate their input."""
    sdfgs = [p.to_sdfg(simplify=True) for p in _SIMPLIFIED]
    sdfgs += [p.to_sdfg(simplify=False) for p in _UNSIMPLIFIED]
    sdfgs += api_sdfgs()
    sdfgs += [unstructured.lp_api_loop_branch(), unstructured.lp_api_while_accumulate()]  # conditional edges
    return sdfgs
