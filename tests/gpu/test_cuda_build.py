"""The CUDA code of differentiated programs compiles with `nvcc` (issue 35: without a GPU, CI checks the
code a GPU would run). `gradflow.gpu.check_cuda_builds` compiles all programs in two translation units;
these tests also check that it blames a compile error on the program that has it."""

from __future__ import annotations

import dace
import pytest

from gradflow.api import grad_graph
from gradflow.autodiff.forwarding import STORE_ALL
from gradflow.core.errors import NotDifferentiableError
from gradflow.core.graph import Graph
from gradflow.gpu import OPTIMIZE_GPU, check_cuda_builds
from gradflow.gpu.cuda_check import _blame
from gradflow.verify.corpus import dataflow, loops

#: corpus programs whose GPU code DaCe's code generator refuses, and why (docs/gpu.md). A program that
#: starts compiling, or another that stops, fails the test either way.
KNOWN_LIMITS = {
    # the checkpointed step is a nested SDFG; DaCe's GPU transformation leaves a read of `S` (moved to
    # device memory) on one of its interstate edges, which host code cannot do
    "lp_conditional_accumulate_checkpointed": "codegen",
    # `for j in range(cnt[i])`: a bound read from data keeps a growable tape, which `to_gpu` refuses
    "lp_bound_from_data": "refused",
}


def _gradient(case) -> Graph:
    forwarding = case.forwarding or STORE_ALL
    # while loops get a bound: an unbounded one keeps a growable tape, which `to_gpu` refuses (test_offload)
    forwarding = forwarding.with_loop_bounds(**{"*": 64, **dict(case.loop_bounds)})
    return grad_graph(case.program, list(case.wrt), case.of, forwarding=forwarding, optimize=OPTIMIZE_GPU)


@pytest.mark.slow
def test_the_corpus_gradients_compile_for_the_gpu(tmp_path) -> None:
    cases = [*loops.CASES, *dataflow.CASES]
    graphs, failed = {}, {}
    for case in cases:
        try:
            graphs[case.name] = _gradient(case)
        except NotDifferentiableError:
            failed[case.name] = "refused"
    verdicts = check_cuda_builds(graphs, folder=tmp_path)
    failed.update({name: v.stage for name, v in verdicts.items() if not v.ok})
    assert failed == KNOWN_LIMITS, {name: verdicts[name].error for name in failed if name in verdicts}
    assert len(verdicts) + sum(stage == "refused" for stage in failed.values()) == len(cases)


def _scaled(name: str, code: str) -> Graph:
    sdfg = dace.SDFG(name)
    sdfg.add_array("x", [16], dace.float64)
    sdfg.add_array("y", [16], dace.float64)
    state = sdfg.add_state()
    state.add_mapped_tasklet("scale", {"i": "0:16"}, {"a": dace.Memlet("x[i]")}, code,
                             {"b": dace.Memlet("y[i]")}, language=dace.Language.CPP, external_edges=True)
    return OPTIMIZE_GPU(Graph.adopt(sdfg)).unwrap()


def test_a_compile_error_is_blamed_on_its_program_and_the_others_still_build(tmp_path) -> None:
    verdicts = check_cuda_builds({"good": _scaled("good", "b = 2.0 * a;"),
                                  "bad": _scaled("bad", "b = gradflow_no_such_function(a);")}, folder=tmp_path)
    assert verdicts["good"].ok
    assert verdicts["bad"].stage == "nvcc" and "gradflow_no_such_function" in verdicts["bad"].error


def test_an_error_in_a_header_is_blamed_where_the_program_instantiated_it(tmp_path) -> None:
    source = tmp_path / "gradflow_check_device.cu"
    output = "\n".join([
        "/site/dace/runtime/include/dace/reduction.h(284): error: no instance of overloaded function "
        '"atomicMax" matches the argument list',
        "            argument types are: (long *, const long)",
        "          detected during:",
        '            instantiation of "T dace::_wcr_fixed<...>::reduce_atomic(T *, const T &)" at line 531 of '
        "/site/dace/runtime/include/dace/reduction.h",
        f'            instantiation of "void kernel(...)" at line 75 of {source}',
        f"{source}(12): error: identifier \"undefined_name\" is undefined",
    ])
    spans = [(10, 40, "first"), (41, 90, "second")]
    blamed = _blame(output, source, spans)
    assert set(blamed) == {"first", "second"}
    assert "atomicMax" in blamed["second"][0] and "undefined_name" in blamed["first"][0]


def test_the_host_compilers_errors_are_blamed_too(tmp_path) -> None:
    source = tmp_path / "gradflow_check_host.cpp"
    output = "\n".join([
        "/site/dace/runtime/include/dace/vector.h: In instantiation of 'void f(T) [with T = long int]':",
        f"{source}:57:9:   required from here",
        "/site/dace/runtime/include/dace/vector.h:12:3: error: no matching function for call to 'g(long int)'",
        f"{source}:15:7: error: 'undefined_name' was not declared in this scope",
    ])
    blamed = _blame(output, source, [(10, 40, "first"), (41, 90, "second")])
    assert "no matching function" in blamed["second"][0] and "undefined_name" in blamed["first"][0]
