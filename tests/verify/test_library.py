"""Op-level reverse rules of library nodes, checked two routes (`gradflow.verify.library`).

Each case is kept whole by the default pipeline and reversed by its rule; the same program with an empty
library table is expanded into maps first. Hypothesis varies the sizes (including 1 and non-square) and
the data: the rule route must match torch.autograd (float64, rtol 1e-9) and the expansion route.
"""

from __future__ import annotations

import dace
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gradflow.verify import library
from gradflow.verify.corpus.library import CASES_BY_NAME


@pytest.mark.parametrize("name", library.names())
def test_node_kept_whole_by_default(name: str) -> None:
    library.kept_whole(name)


@pytest.mark.parametrize("name", library.names())
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_rule_matches_torch_and_expansion(name: str, data) -> None:
    sizes = {s: data.draw(st.integers(1, 5), label=s) for s in CASES_BY_NAME[name].symbols}
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    assert library.check(name, sizes, seed) < 1e-9


def test_gemm_reading_c_from_another_array_is_rejected() -> None:
    """DaCe passes one pointer for Gemm's `_c` connector, so C read from another array is ignored by its
    expansions: the rule refuses such a node rather than differentiate a term the program never computes."""
    import dace

    from gradflow import NotDifferentiableError, grad
    from gradflow.verify.corpus.library import gemm_beta_inplace

    sdfg = gemm_beta_inplace()
    sdfg.add_array("R", sdfg.arrays["C"].shape, dace.float64)
    state = next(s for s in sdfg.states() if s.label == "gemm")
    (write,) = [n for n in state.data_nodes() if state.in_degree(n) > 0]
    write.data = "R"
    next(iter(state.in_edges(write))).data.data = "R"
    total = next(s for s in sdfg.states() if s.label == "total")  # the sum reads R (the gemm stays active)
    for node in total.data_nodes():
        if node.data == "C":
            node.data = "R"
            for e in total.out_edges(node):
                for inner in total.memlet_tree(e):
                    inner.data.data = "R"
    with pytest.raises(NotDifferentiableError, match="ignore C_in"):
        grad(sdfg, wrt=["A", "C"], of="S")



_N, _K = dace.symbol("N"), dace.symbol("K")


@dace.program
def _batched_window(A: dace.float64[_N, _K + 2, _K], X: dace.float64[_K, _K], S: dace.float64[1]):
    S[0] = np.sum(A[:, 1:3, :] @ X)


def _stepped_operand() -> dace.SDFG:
    sdfg = dace.SDFG("stepped_operand")
    for name, shape in (("A", [2 * _N, _K]), ("X", [_K, _N]), ("C", [_N, _N]), ("S", [1])):
        sdfg.add_array(name, shape, dace.float64)
    state = sdfg.add_state("mm", is_start_block=True)
    mm = dace.libraries.blas.MatMul("mm")
    state.add_node(mm)
    state.add_edge(state.add_read("A"), None, mm, "_a", dace.Memlet("A[0:2*N:2, 0:K]"))
    state.add_edge(state.add_read("X"), None, mm, "_b", dace.Memlet("X[0:K, 0:N]"))
    state.add_edge(mm, "_c", state.add_write("C"), None, dace.Memlet("C[0:N, 0:N]"))
    sdfg.add_state_after(state, "total").add_mapped_tasklet(
        "t", {"i": "0:N", "j": "0:N"}, {"c": dace.Memlet("C[i, j]")}, "s = c",
        {"s": dace.Memlet("S[0]", wcr="lambda a, b: a + b")}, external_edges=True)
    return sdfg


def test_products_dace_computes_wrongly_are_rejected() -> None:
    """DaCe's product expansions ignore a subset's step and read batched operands as contiguous blocks, so
    a MatMul on `A[0:2N:2, :]` (built with the API; the frontend copies strided views first) or a batched
    product of `A[:, 1:3, :]` computes something other than the product: both are refused by name."""
    from gradflow import NotDifferentiableError, grad

    with pytest.raises(NotDifferentiableError, match="step other than 1"):
        grad(_stepped_operand(), wrt=["A"], of="S")
    with pytest.raises(NotDifferentiableError, match="not one contiguous block"):
        grad(_batched_window, wrt=["A"], of="S")
