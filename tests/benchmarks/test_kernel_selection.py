"""`benchmarks/kernels.py --only`: kernel names and bench keys, a headline key's own commas included."""

from __future__ import annotations

from benchmarks.kernels import _keys, _select


def test_headline_keys_keep_their_commas() -> None:
    assert _keys("lp_lu, lp_softmax@N=256,M=512,nb_gemm,lp_triangular@N=120,") == {
        "lp_lu", "lp_softmax@N=256,M=512", "nb_gemm", "lp_triangular@N=120"}


def test_selection_by_name_and_by_headline_key() -> None:
    keys = [b.key for b in _select("lp_softmax@N=256,M=512,lp_jacobi_1d@N=4000,T=50,nb_gemm")]
    assert sorted(keys) == ["lp_jacobi_1d@N=4000,T=50", "lp_softmax@N=256,M=512", "nb_gemm"]
