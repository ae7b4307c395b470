"""Op-level reverse rules of library nodes, checked two routes (`gradflow.verify.library`).

Each case is kept whole by the default pipeline and reversed by its rule; the same program with an empty
library table is expanded into maps first. Hypothesis varies the sizes (including 1 and non-square) and
the data: the rule route must match torch.autograd (float64, rtol 1e-9) and the expansion route.
"""

from __future__ import annotations

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
    with pytest.raises(NotDifferentiableError, match="ignore C_in"):
        grad(sdfg, wrt=["A", "C"], of="S")
