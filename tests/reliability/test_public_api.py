"""The public edge: bad input to `grad`, `vjp`, `value_and_grad` and `gradflow.torch.function` raises a
`GradflowError` that names the argument at fault, never a TypeError from inside, never a failure in the
C++ compiler.
"""

from __future__ import annotations

import dace
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import gradflow
import gradflow.torch as gt
from gradflow.core.errors import ArgumentError, GradflowError, InvalidArgumentError
from gradflow.core.passes import Pipeline
from gradflow.runtime.compile import compile_sdfg
from tests.reliability import programs
from tests.torch.vjp_programs import square_mul

N = dace.symbol("N")


@pytest.fixture(autouse=True)
def _no_line_info():
    """DaCe inspects the Python stack for every node added (deep under pytest and hypothesis): off here,
    it only fills in source positions."""
    with dace.config.set_temporary("compiler", "lineinfo", value="none"):
        yield


@pytest.mark.parametrize("kwargs, needle", [
    (dict(wrt=None), r"wrt must be an array name or a non-empty sequence of names, got None"),
    (dict(wrt=3), r"wrt must be an array name .* got 3"),
    (dict(wrt=["X", "X"]), r"wrt names 'X' more than once"),
    (dict(wrt="X", of=1), r"of must be an array name .* got 1"),
    (dict(wrt="X", prefix=3), r"prefix must be a string, got 3"),
    (dict(wrt="X", prefix="1"), r"prefix '1' makes the gradient array name '1X', which is not a C\+\+ identifier"),
    (dict(wrt="X", forwarding="store"), r"forwarding must be a gradflow.Forwarding, got 'store'"),
])
def test_grad_options_raise_errors_naming_the_option(kwargs, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        gradflow.grad(programs.energy, **kwargs)


def test_vjp_and_value_and_grad_options_raise_errors_naming_the_option():
    with pytest.raises(InvalidArgumentError, match="forwarding must be a gradflow.Forwarding"):
        gradflow.vjp(programs.energy, wrt="X", of="S", forwarding="recompute")
    with pytest.raises(InvalidArgumentError, match="forwarding must be a gradflow.Forwarding"):
        gradflow.value_and_grad(programs.energy, wrt="X", forwarding=1)
    with pytest.raises(InvalidArgumentError, match="vjp needs of="):
        gradflow.vjp(programs.energy, wrt="X", of=None)
    with pytest.raises(InvalidArgumentError, match="loop_bounds must map loop labels"):
        gradflow.STORE_ALL.with_loop_bounds(w="many")
    with pytest.raises(InvalidArgumentError, match=r"recompute=\.\.\.\) takes array names"):
        gradflow.Forwarding(recompute=3)


# ---------------------------------------------------------------------------------------------------------
# names the generated C++ cannot carry: rejected when the program is given, not in gcc


def _with_array_named(name: str) -> dace.SDFG:
    sdfg = dace.SDFG(f"named_{abs(hash(name)) % 10**6}")
    sdfg.add_array(name, [N], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    state = sdfg.add_state("main")
    state.add_mapped_tasklet("sq", {"i": "0:N"}, {"a": dace.Memlet(f"{name}[i]")}, "s = a * a",
                             {"s": dace.Memlet("S[0]", wcr="lambda x, y: x + y")}, external_edges=True)
    return sdfg


@pytest.mark.parametrize("name", ["new", "this", "int", "auto", "__state", "NULL"])
def test_array_names_that_are_not_cpp_identifiers_are_rejected_at_grad_time(name):
    sdfg = _with_array_named(name)
    pattern = rf"array '{name}' of SDFG '\w+' is (a C\+\+ keyword|a name the generated C\+\+ code already uses)"
    with pytest.raises(InvalidArgumentError, match=pattern):
        gradflow.grad(sdfg, wrt=name, of="S")
    with pytest.raises(InvalidArgumentError, match=pattern):
        gradflow.value_and_grad(sdfg, wrt=name, of="S")
    with pytest.raises(InvalidArgumentError, match=pattern):
        gt.function(sdfg, inputs=[name], outputs=["S"])
    with pytest.raises(InvalidArgumentError, match=pattern):
        compile_sdfg(sdfg)


def test_an_array_named_like_a_function_a_tasklet_calls_is_rejected():
    sdfg = dace.SDFG("calls_exp")
    sdfg.add_array("exp", [N], dace.float64)
    sdfg.add_array("Y", [N], dace.float64)
    sdfg.add_state().add_mapped_tasklet("e", {"i": "0:N"}, {"a": dace.Memlet("exp[i]")}, "y = exp(a)",
                                       {"y": dace.Memlet("Y[i]")}, external_edges=True)
    with pytest.raises(InvalidArgumentError, match=r"array 'exp' .* is also a function that tasklet 'e' calls"):
        compile_sdfg(sdfg)


def test_a_symbol_named_like_a_keyword_is_rejected():
    auto = dace.symbol("auto")
    sdfg = dace.SDFG("kw_symbol")
    sdfg.add_array("X", [auto], dace.float64)
    sdfg.add_array("S", [1], dace.float64)
    sdfg.add_state().add_mapped_tasklet("s", {"i": "0:auto"}, {"a": dace.Memlet("X[i]")}, "s = a",
                                       {"s": dace.Memlet("S[0]", wcr="lambda x, y: x + y")}, external_edges=True)
    with pytest.raises(InvalidArgumentError, match=r"symbol 'auto' of SDFG 'kw_symbol' is a C\+\+ keyword"):
        gradflow.grad(sdfg, wrt="X", of="S")


# ---------------------------------------------------------------------------------------------------------
# gradflow.torch.function


@pytest.fixture(scope="module")
def sq():
    return gt.function(square_mul(name="api_sq"), inputs=["X", "W"], outputs=["Y"])


def test_torch_function_takes_inputs_by_name(sq):
    X, W = torch.rand(4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    assert torch.equal(sq(X=X, W=W), sq(X, W)) and torch.equal(sq(X, W=W), sq(X, W))
    with pytest.raises(ArgumentError, match=r"has no input 'Q'"):
        sq(X, W, Q=W)
    with pytest.raises(ArgumentError, match=r"input 'X' of '\w+' given both by position and by name"):
        sq(X, X=X)
    with pytest.raises(ArgumentError, match=r"missing input\(s\) W"):
        sq(X=X)
    layer = gt.Module(sq, parameters={"W": W})
    assert torch.equal(layer(X=X), layer(X))
    with pytest.raises(ArgumentError, match=r"Module has no input 'W'"):  # a parameter, not an input
        layer(X=X, W=W)


# ---------------------------------------------------------------------------------------------------------
# fuzzing the options of every entry point


def _mostly(good: list, bad: list) -> st.SearchStrategy:
    """Good values four times as likely as each bad one, so that accepted calls are exercised too."""
    return st.sampled_from(good * 4 + bad)


_WRT = _mostly(["X", ["X", "W"], ("W",)],
               [None, 3, [], ["X", 3], "nope", "S", b"X", {"X": 1}, ["X", "X"], 2.5, object()])
_OF = _mostly([None, "S"], [1, ["S"], [], "X", "nope", ("S", "X"), b"S"])
_PREFIX = _mostly(["grad_", "d_"], [None, "", "1", 3, "a b", "X"])
_PIPELINE = _mostly([None], ["x", 3, Pipeline(()), gradflow.ad_pipeline()])
_FORWARDING = _mostly([None, gradflow.STORE_ALL, gradflow.RECOMPUTE_ALL], ["store", 1, gradflow.recompute("nope")])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wrt=_WRT, of=_OF, prefix=_PREFIX, pipeline=_PIPELINE, forwarding=_FORWARDING)
def test_grad_returns_an_sdfg_or_raises_a_gradflow_error(wrt, of, prefix, pipeline, forwarding):
    try:
        out = gradflow.grad(programs.energy, wrt=wrt, of=of, prefix=prefix, pipeline=pipeline,
                            forwarding=forwarding)
    except GradflowError as exc:
        event(type(exc).__name__)
    else:
        event("accepted")
        assert isinstance(out, dace.SDFG)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wrt=_WRT, of=_OF, prefix=_PREFIX, forwarding=_FORWARDING)
def test_vjp_returns_a_result_or_raises_a_gradflow_error(wrt, of, prefix, forwarding):
    try:
        gradflow.vjp(programs.energy, wrt=wrt, of=of, prefix=prefix, forwarding=forwarding)
    except GradflowError as exc:
        event(type(exc).__name__)
    else:
        event("accepted")


@pytest.fixture(scope="module")
def sq_vjp():
    return square_mul(name="api_fuzz_sq")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(inputs=_mostly([None, ["X", "W"], ("X", "W")], [["W", "X"], "X", 3, ["X"], ["Q"], [1]]),
       outputs=_mostly([None, ["Y"]], ["Y", ["X"], 5, [], ["Y", "Y"]]),
       wrt=_mostly([None], [["X"], 3, "W"]),
       dispatcher=_mostly(["ctypes"], ["CPP", None, 3, ["cpp"]]),
       convert=_mostly([False, True], ["yes", None]),
       symbols=_mostly([None, {"N": 3}], [{"N": "3"}, [("N", 3)], {"N": True}, {3: 3}]))
def test_torch_function_returns_a_function_or_raises_a_gradflow_error(sq_vjp, inputs, outputs, wrt, dispatcher,
                                                                      convert, symbols):
    try:
        f = gt.function(sq_vjp, inputs=inputs, outputs=outputs, wrt=wrt, dispatcher=dispatcher, convert=convert,
                        symbols=symbols)
    except GradflowError as exc:
        event(type(exc).__name__)
        return
    event("accepted")
    X, W = (torch.rand(3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    args = {"X": X, "W": W}
    try:
        out = f(*(args[n] for n in f.inputs))
    except GradflowError as exc:  # e.g. symbols={'N': 3} with inputs of another size... here they agree
        event(f"call: {type(exc).__name__}")
        return
    torch.testing.assert_close(out, X * X * W)
    assert np.isfinite(torch.autograd.grad(out.sum(), [X])[0].numpy()).all()
