"""Every registered pass has a before/after test: on an input that has what the pass removes or adds, the
output has the promised property and the input does not (so the check is not vacuous). A newly registered
pass without an entry here fails `test_every_registered_pass_has_a_contract`. Purity is test_purity.py."""

from __future__ import annotations

import re
from typing import Callable

import dace
import numpy as np
import pytest
from dace.sdfg import nodes as nd
from dace.sdfg.state import BreakBlock

from gradflow.analysis.ops import decompose
from gradflow.autodiff.normalize import NORMALIZE, CollapseMaps, ExpandLibraryNodes, SplitOperations
from gradflow.autodiff.passes import Reverse, SplitVJP
from gradflow.autodiff.tangent.passes import Tangent
from gradflow.core.graph import Graph
from gradflow.core.names import MADE
from gradflow.core.passes import Pipeline, registered_passes
from gradflow.core.rule_table import RuleTable
from gradflow.optimize.dead_stores import _dead_writes
from gradflow.transforms.count_arguments import count_arguments
from gradflow.verify.corpus import dataflow, loops, unstructured


def _breaks(g: Graph) -> int:
    return sum(isinstance(b, BreakBlock) for b in g.sdfg.all_control_flow_blocks())


def _branching(g: Graph) -> int:
    from gradflow.transforms.lifting import branching_blocks

    return len(branching_blocks(g.sdfg))


def _views(g: Graph) -> int:
    return sum(isinstance(g.sdfg.arrays[n.data], dace.data.View) for s in g.sdfg.states() for n in s.data_nodes())


def _libraries(g: Graph) -> int:
    return sum(isinstance(n, nd.LibraryNode) for n, _ in g.sdfg.all_nodes_recursive())


def _nested_maps(g: Graph) -> int:
    return sum(isinstance(n, nd.MapEntry) and s.entry_node(n) is not None for s in g.sdfg.states() for n in s.nodes())


def _multi_op_states(g: Graph) -> int:
    return sum(len(decompose(s)) > 1 for s in g.sdfg.states())


def _loop_sized(g: Graph) -> int:
    from gradflow.transforms.shapes import loop_sized

    return len(loop_sized(g.sdfg))


def _small_parallel_maps(g: Graph) -> int:
    return sum(isinstance(n, nd.MapEntry) and n.map.schedule == dace.ScheduleType.Default and s.entry_node(n) is None
               and n.map.range.num_elements() == 1 for s in g.sdfg.states() for n in s.nodes())


def _unowned_sums(g: Graph) -> int:
    from gradflow.optimize.nest_reductions import owners

    return sum(isinstance(n, nd.MapEntry) and s.entry_node(n) is None and n.map.schedule == dace.ScheduleType.Default
               and owners(s, n) is not None for s in g.sdfg.states() for n in s.nodes())


def _maps(g: Graph) -> int:
    return sum(isinstance(n, nd.MapEntry) for n, _ in g.sdfg.all_nodes_recursive())


def _conflicting_scatters(g: Graph) -> int:
    from gradflow.optimize.scatter import _candidates

    return sum(len(_candidates(s)) for sdfg in g.sdfg.all_sdfgs_recursive() for s in sdfg.states())


def _zeroed_products(g: Graph) -> int:
    from gradflow.optimize.overwrite_zeroed_products import _candidates

    return sum(len(_candidates(sdfg)) for sdfg in g.sdfg.all_sdfgs_recursive())


def _sibling_sums(g: Graph) -> int:
    from gradflow.optimize.sibling_sums import _pairs

    return sum(len(_pairs(sdfg)) for sdfg in g.sdfg.all_sdfgs_recursive())


def _time_step_before_in_place() -> Graph:
    """A 1-D Euler step (`y[:] = y + 0.1 * k`) optimized by every pass but `write_in_place`: a map writes the
    temporary `y_slice`, which a copy moves into y."""
    from gradflow.optimize import OPTIMIZE, optimized
    from tests.optimize.test_in_place import euler

    return optimized(Graph.of(euler), OPTIMIZE.without("write_in_place"))


def _reduction_before_fusion() -> Graph:
    """The kmeans cost of `tests/optimize/test_reduce_fusion.py` optimized by every pass but `reduce_in_maps`:
    maps write temporaries that only `Reduce` nodes read (the row sums, the minimum over the distances)."""
    from gradflow.optimize import OPTIMIZE, optimized
    from tests.optimize.test_reduce_fusion import nearest

    return optimized(Graph.of(nearest), OPTIMIZE.without("reduce_in_maps"))


def _fusable_reductions(g: Graph) -> int:
    from gradflow.optimize.reduce_fusion import ReduceInMaps

    return sum(len(list(ReduceInMaps().matches(sdfg))) for sdfg in g.sdfg.all_sdfgs_recursive())


def _temporaries_copied_back(g: Graph) -> int:
    from gradflow.optimize.in_place import WriteInPlace

    return sum(len(list(WriteInPlace().matches(sdfg))) for sdfg in g.sdfg.all_sdfgs_recursive())


def _column_loop_before_interchange() -> Graph:
    """A matrix of powers built a column at a time, optimized up to `move_loops_into_maps`."""
    from tests.optimize.test_loop_interchange import before_interchange, powers

    return before_interchange(powers)


def _interchangeable_loops(g: Graph) -> int:
    from tests.optimize.test_loop_interchange import _interchangeable

    return _interchangeable(g)


def _gradient_before_join() -> Graph:
    """A gradient whose forward loop has a map's temporary copied into the array in a state of its own."""
    from tests.optimize.test_copy_states import before_join

    return before_join()


def _runge_kutta_before_loop_sums() -> Graph:
    """The Runge-Kutta loop of `tests/optimize/test_loop_sums.py` differentiated and optimized up to
    `overwrite_loop_sums`: its reversed loop adds into each stage's gradient first and resets it after."""
    from gradflow.api import grad_graph
    from gradflow.optimize import OPTIMIZE
    from tests.optimize.test_loop_sums import runge_kutta

    upto = [s.name for s in OPTIMIZE.steps].index("overwrite_loop_sums")
    return grad_graph(runge_kutta, "x", "S", None, optimize=Pipeline(OPTIMIZE.steps[:upto]))


def _runge_kutta_before_tiling() -> Graph:
    """A Runge-Kutta loop whose stages read each other one element to the left, optimized up to
    `tile_element_chains` (`tests/optimize/test_tiled_chains.py`)."""
    from tests.optimize.test_tiled_chains import UPTO, runge_kutta

    return UPTO(Graph.of(runge_kutta)).unwrap()


def _rk4_before_gathering() -> Graph:
    """A four-stage Runge-Kutta gradient whose loop bodies interleave maps with tape pushes and pops, optimized
    up to `gather_element_maps` (`tests/optimize/test_gathered_maps.py`)."""
    from gradflow.api import grad_graph
    from tests.optimize.test_gathered_maps import UPTO, rk4

    return grad_graph(rk4, "x", "last", None, optimize=UPTO)


def _scattered_map_runs(g: Graph) -> int:
    from gradflow.optimize.gathered_maps import plans

    return len(plans(g.sdfg))


def _untiled_chains(g: Graph) -> int:
    from gradflow.optimize.tiled_chains import TileElementChains

    return len(list(TileElementChains().matches(g.sdfg)))


def _loop_sums(g: Graph) -> int:
    from gradflow.optimize.loop_sums import _plans

    return len(list(_plans(g.sdfg)))


def _gradient_before_elementwise_join() -> Graph:
    """A gradient whose reverse sweep has an element-wise map reading a same-range map of the state before."""
    from tests.optimize.test_element_states import before_join

    return before_join()


def _elementwise_pairs(g: Graph) -> int:
    from tests.optimize.test_element_states import joinable_pairs

    return joinable_pairs(g)


def _divided_program() -> Graph:
    """A map reading `x[(12*i + 4*j + k) // 4, (12*i + 4*j + k) % 4]`: divisions its ranges decide."""
    from tests.optimize.test_index_arithmetic import regroup

    return Graph.of(regroup.to_sdfg())


def _divided_indices(g: Graph) -> int:
    from tests.optimize.test_index_arithmetic import divided_indices

    return divided_indices(g)


def _gpu_kernels(g: Graph) -> int:
    from gradflow.gpu.offload import gpu_maps

    return gpu_maps(g.sdfg)


def _joinable_pairs(g: Graph) -> int:
    from tests.optimize.test_copy_states import joinable_pairs

    return joinable_pairs(g)


def _two_outer_products() -> Graph:
    """nb_atax's gradient with its first writes overwriting and its dead clears gone: grad_A gets one
    map's write and a later map's sum."""
    from gradflow.optimize.dead_stores import DropDeadStores
    from gradflow.optimize.overwrite_zeroed_products import OverwriteZeroedProducts
    from tests.corpus import npbench

    graph = Reverse(("A",), ("S",))(_normalized(npbench.nb_atax)).unwrap()
    return DropDeadStores()(OverwriteZeroedProducts()(graph).unwrap()).unwrap()


def _product_alphas(g: Graph) -> list:
    from dace.libraries.blas import MatMul

    return sorted(n.alpha for n, _ in g.sdfg.all_nodes_recursive() if isinstance(n, MatMul))


def _broadcasts(g: Graph) -> int:
    from gradflow.optimize.broadcasts import _candidates

    return sum(len(list(_candidates(sdfg))) for sdfg in g.sdfg.all_sdfgs_recursive())


def _sum_gradient() -> Graph:
    """nb_go_fast's gradient, its first writes overwriting and its dead clears gone (as `OPTIMIZE` has them
    before `forward_broadcasts`): the reverse of its final `np.sum` spreads the sum's gradient over a
    matrix that the next reverse map reads."""
    from gradflow.optimize.dead_stores import DropDeadStores
    from gradflow.optimize.overwrite_zeroed_products import OverwriteZeroedProducts
    from tests.corpus import npbench

    graph = Reverse(("a",), ("S",))(_normalized(npbench.nb_go_fast)).unwrap()
    return DropDeadStores()(OverwriteZeroedProducts()(graph).unwrap()).unwrap()


def _row_products(g: Graph) -> int:
    from gradflow.transforms.row_products import _candidates

    return sum(len(_candidates(sdfg)) for sdfg in g.sdfg.all_sdfgs_recursive())


def _loop_reductions(g: Graph) -> int:
    from gradflow.transforms.loop_reductions import _candidates

    return sum(len(_candidates(sdfg)) for sdfg in g.sdfg.all_sdfgs_recursive())


def _scalar_sums(g: Graph) -> int:
    from gradflow.optimize.scalar_sums import _candidates

    return sum(len(_candidates(sdfg)) for sdfg in g.sdfg.all_sdfgs_recursive())


def _optimized_but_scalar_sums() -> Graph:
    """lp_softmax's gradient through every other step of `OPTIMIZE`: its sequential per-row maps sum into
    the gradients of the row's maximum and sum."""
    from gradflow.api import grad_graph
    from gradflow.optimize import OPTIMIZE

    return grad_graph(loops.lp_softmax, wrt="X", of="S", optimize=OPTIMIZE.without("register_scalar_sums"))


def _unmarked_simd_sums(g: Graph) -> int:
    from gradflow.optimize.simd_sums import _candidates

    return sum(len(_candidates(sdfg)) for sdfg in g.sdfg.all_sdfgs_recursive())


def _optimized_but_simd_sums() -> Graph:
    """lp_softmax's gradient through every other step of `OPTIMIZE`: its per-row loops sum into register
    accumulators."""
    from gradflow.api import grad_graph
    from gradflow.optimize import OPTIMIZE

    return grad_graph(loops.lp_softmax, wrt="X", of="S", optimize=OPTIMIZE.without("simd_register_sums"))


def _row_walked_columns(g: Graph) -> int:
    from gradflow.optimize.layouts import _candidates

    return len(_candidates(g.sdfg))


def _gram_schmidt_gradient() -> Graph:
    """nb_gramschmidt's gradient through every other step of `OPTIMIZE`: its backward walks the columns of
    the working copy of A and of Q's gradient."""
    from gradflow.api import grad_graph
    from gradflow.optimize import OPTIMIZE
    from tests.corpus import npbench

    case = npbench.CASES_BY_NAME["nb_gramschmidt"]
    return grad_graph(case.to_sdfg(), wrt=list(case.wrt), of=case.of,
                      optimize=OPTIMIZE.without("transient_layouts"))


def _shareable_ranges(g: Graph) -> int:
    from gradflow.optimize.shared_buffers import sharing

    return len(sharing(g.sdfg))


def _states_sequence_gradient(*skipped: str) -> Graph:
    """df_states_sequence's gradient through `OPTIMIZE` without the `skipped` steps: a chain of states, each
    writing a temporary or a gradient buffer that the next ones read, and the reverse zero-fills every
    gradient buffer in one state at the start of the backward."""
    from gradflow.api import grad_graph
    from gradflow.optimize import OPTIMIZE

    pipeline = OPTIMIZE
    for name in skipped:
        pipeline = pipeline.without(name)
    return grad_graph(dataflow.df_states_sequence, wrt="X", of="S", optimize=pipeline)


def _distant_fills(g: Graph) -> int:
    from gradflow.optimize.sunk_fills import moves

    return len(moves(g.sdfg))


def _scope_tapes(g: Graph) -> int:
    from gradflow.optimize.persistent_tapes import _candidates

    return len(_candidates(g.sdfg))


def _scope_temporaries(g: Graph) -> int:
    from gradflow.optimize.persistent_transients import candidates

    return len(candidates(g.sdfg))


def _optimized_with_tapes() -> Graph:
    """lp_softmax's gradient through `OPTIMIZE` (which leaves tapes alone): its loop pushes rows and scalars."""
    from gradflow.api import grad_graph

    return grad_graph(loops.lp_softmax, wrt="X", of="S")


def _npbench_unviewed(name: str) -> Callable[[], Graph]:
    def build() -> Graph:
        from gradflow.transforms.views import RemoveViews
        from tests.corpus import npbench

        return RemoveViews()(Graph.of(getattr(npbench, name).to_sdfg())).unwrap()

    return build


def _default_reductions(g: Graph) -> int:
    from gradflow.optimize.reductions import _candidates

    return len(_candidates(g.sdfg))


def _data_symbols(g: Graph) -> int:
    """Symbols assigned from array elements on interstate edges (`idx_index = idx[i]`), in all SDFGs."""
    return sum(any(name in str(value) for name in sdfg.arrays) and "[" in str(value)
               for sdfg in g.sdfg.all_sdfgs_recursive() for e in sdfg.all_interstate_edges()
               for value in e.data.assignments.values())


P = dace.symbol("P")


@dace.program
def _halved_where_large(r: dace.float64[P, 2], out: dace.float64[P]):
    for j in dace.map[0:P]:
        rx = r[j, 0]  # DaCe makes `rx` a symbol assigned on an interstate edge: the condition reads it
        if rx * rx > 1.0:
            out[j] = rx / 2.0
        else:
            out[j] = r[j, 1]


def _data_symbol_reads(g: Graph) -> int:
    """Tasklets reading a floating-point symbol computed from data by name (not through a connector)."""
    from gradflow.analysis.symbols import data_symbols

    found = 0
    for sdfg in g.sdfg.all_sdfgs_recursive():
        carriers = set(data_symbols(sdfg, frozenset(sdfg.arrays)))
        for state in sdfg.states():
            for node in state.nodes():
                if isinstance(node, nd.Tasklet):
                    names = set(re.findall(r"\w+", node.code.as_string))
                    found += len((names & carriers) - set(node.in_connectors))
    return found


def _conditional_writes(g: Graph) -> int:
    from gradflow.transforms.conditional_writes import _sites

    return sum(len(_sites(sdfg)) for sdfg in g.sdfg.all_sdfgs_recursive())


def _loops(g: Graph) -> int:
    from dace.sdfg.state import LoopRegion

    return sum(isinstance(b, LoopRegion) for b in g.sdfg.all_control_flow_blocks())


def _size_versions(g: Graph) -> int:
    from dace.sdfg.state import ConditionalBlock

    return sum(isinstance(b, ConditionalBlock) and b.label.endswith("_by_size")
               for b in g.sdfg.all_control_flow_blocks())


def _npbench_conv() -> Graph:
    from tests.corpus import npbench

    return Graph.of(npbench.nb_conv2d_bias.to_sdfg(simplify=True))


def _npbench_syrk() -> Graph:
    from tests.corpus import npbench

    return Graph.of(npbench.nb_syrk.to_sdfg())


def _has_backward(g: Graph) -> bool:
    return any(b.label == "gradflow_backward" for b in g.sdfg.nodes()) and "grad_X" in g.sdfg.arrays


def _onnx_input() -> Graph:
    from onnx import TensorProto, helper

    from gradflow.frontend.onnx import model_graph, read_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    return model_graph(read_model(model.SerializeToString()))


def _normalized(program) -> Graph:
    return NORMALIZE(Graph.of(program.to_sdfg())).unwrap()


N = dace.symbol("N")


@dace.program
def _steps_as_argument(A: dace.float64[N], S: dace.float64[1], steps: dace.int64, unused: dace.int64):
    for _ in range(steps):
        A[:] = np.sin(A)
    S[0] = np.sum(A)


def _outer_gradient() -> Graph:
    """The reverse of a map summing tanh(a[i] b[j]): one tasklet sums into the gradients of a (owned by i)
    and b (owned by j)."""
    from tests.optimize.test_split_sums import outer_tanh

    return Reverse(("a", "b"), ("S",))(_normalized(outer_tanh)).unwrap()


def _splittable_maps(g: Graph) -> int:
    from gradflow.optimize.split_sums import groups

    return sum(isinstance(n, nd.MapEntry) and s.entry_node(n) is None and groups(sub, s, n) is not None
               for sub in g.sdfg.all_sdfgs_recursive() for s in sub.states() for n in s.nodes())


def _count_arguments(g: Graph) -> list[str]:
    """Integer scalar arguments read only by control flow (`unused`, read by nothing, is not one)."""
    return count_arguments(g.sdfg)


def _gradient_program() -> Graph:
    from gradflow.api import grad_graph

    return Graph.adopt(grad_graph(loops.lp_jacobi_1d.to_sdfg(), ["A", "B"], "S", optimize=False).to_sdfg())


def _made_names(g: Graph) -> int:
    """Transients and symbols named as gradflow's passes name theirs (the program's own arguments aside)."""
    return sum(1 for s in g.sdfg.all_sdfgs_recursive() for n in (
        *(a for a, d in s.arrays.items() if d.transient or s is not g.sdfg), *s.symbols,
        *(k for e in s.all_interstate_edges() for k in e.data.assignments)) if n.startswith(MADE))


#: pass name -> (input builder, the pass to run, property of a graph, expected (before, after)).
CONTRACTS: dict[str, tuple[Callable[[], Graph], Callable, Callable[[Graph], object], tuple]] = {
    "set_aside_internal_names": (_gradient_program, None, _made_names, ("> 0", 0)),
    "count_arguments_to_symbols": (lambda: Graph.of(_steps_as_argument.to_sdfg()), None, _count_arguments,
                                   (["steps"], [])),
    "lift_control_flow": (lambda: Graph.of(unstructured.lp_api_loop_branch()), None, _branching, ("> 0", 0)),
    "lower_breaks": (lambda: Graph.of(loops.lp_break_search.to_sdfg()), None, _breaks, ("> 0", 0)),
    "raise_convolutions": (_npbench_conv, None, _loops, (2, 0)),
    "remove_views": (lambda: Graph.of(dataflow.df_strided.to_sdfg()), None, _views, ("> 0", 0)),
    "expand_library_nodes": (lambda: Graph.of(dataflow.df_lib_sum.to_sdfg()),
                             ExpandLibraryNodes(RuleTable("library")), _libraries, ("> 0", 0)),
    "fold_product_scales": (lambda: Graph.of(_npbench_unviewed("nb_gesummv")()), None, _product_alphas,
                            ([1, 1], [1.2, 1.5])),
    "hoist_row_products": (_npbench_unviewed("nb_covariance"), None, _row_products, (1, 0)),
    "raise_loop_reductions": (lambda: Graph.of(loops.lp_softmax.to_sdfg()), None, _loop_reductions, (1, 0)),
    "lower_indirection": (lambda: Graph.of(dataflow.df_gather.to_sdfg()), None, _data_symbols, ("> 0", 0)),
    "demote_data_symbols": (lambda: Graph.of(_halved_where_large.to_sdfg()), None, _data_symbol_reads, ("> 0", 0)),
    "complete_conditional_writes": (lambda: Graph.of(dataflow.df_masked_assign.to_sdfg()), None,
                                    _conditional_writes, ("> 0", 0)),
    "bound_transient_shapes": (lambda: Graph.of(loops.lp_growing_prefix.to_sdfg()), None, _loop_sized, ("> 0", 0)),
    "choose_schedules": (lambda: Reverse(("x",), ("S",))(_normalized(loops.lp_triangular)).unwrap(), None,
                         _small_parallel_maps, ("> 0", 0)),
    "loops_to_maps": (lambda: Graph.of(loops.lp_go_fast.to_sdfg()), None, _loops, (3, 0)),
    "version_by_size": (_npbench_syrk, None, _size_versions, (0, "> 0")),
    "fuse_maps": (lambda: Graph.of(loops.lp_jacobi_1d.to_sdfg()), None, _maps, (6, 2)),
    "write_in_place": (_time_step_before_in_place, None, _temporaries_copied_back, ("> 0", 0)),
    "move_loops_into_maps": (_column_loop_before_interchange, None, _interchangeable_loops, (1, 0)),
    "reduce_in_maps": (_reduction_before_fusion, None, _fusable_reductions, ("> 0", 0)),
    "join_copy_states": (_gradient_before_join, None, _joinable_pairs, ("> 0", 0)),
    "join_elementwise_states": (_gradient_before_elementwise_join, None, _elementwise_pairs, ("> 0", 0)),
    "simplify_index_arithmetic": (_divided_program, None, _divided_indices, ("> 0", 0)),
    "to_gpu": (lambda: Reverse(("X",), ("S",))(_normalized(loops.lp_if_else)).unwrap(), None, _gpu_kernels,
               (0, "> 0")),
    "own_scatter_writes": (lambda: Reverse(("A", "B"), ("S",))(_normalized(loops.lp_jacobi_1d)).unwrap(), None,
                           _conflicting_scatters, ("> 0", 0)),
    "drop_dead_stores": (
        lambda: Reverse(("X", "Wt"), ("S",))(_normalized(dataflow.df_flatten_matmul)).unwrap(), None,
        lambda g: len(_dead_writes(g.sdfg)), ("> 0", 0)),
    "overwrite_zeroed_products": (
        lambda: Reverse(("X", "Wt"), ("S",))(_normalized(dataflow.df_flatten_matmul)).unwrap(), None,
        _zeroed_products, ("> 0", 0)),
    "overwrite_loop_sums": (_runge_kutta_before_loop_sums, None, _loop_sums, ("> 0", 0)),
    "tile_element_chains": (_runge_kutta_before_tiling, None, _untiled_chains, ("> 0", 0)),
    "gather_element_maps": (_rk4_before_gathering, None, _scattered_map_runs, ("> 0", 0)),
    "nest_reductions": (lambda: Graph.of(dataflow.df_softmax_wcr.to_sdfg()), None,
                        _unowned_sums, ("> 0", 0)),
    "merge_element_sums": (_two_outer_products, None, _sibling_sums, (1, 0)),
    "split_sum_maps": (_outer_gradient, None, _splittable_maps, (1, 0)),
    "forward_broadcasts": (_sum_gradient, None, _broadcasts, ("> 0", 0)),
    "register_scalar_sums": (_optimized_but_scalar_sums, None, _scalar_sums, ("> 0", 0)),
    "simd_register_sums": (_optimized_but_simd_sums, None, _unmarked_simd_sums, ("> 0", 0)),
    "persistent_tapes": (_optimized_with_tapes, None, _scope_tapes, ("> 0", 0)),
    "persistent_transients": (_optimized_with_tapes, None, _scope_temporaries, ("> 0", 0)),
    "transient_layouts": (_gram_schmidt_gradient, None, _row_walked_columns, ("> 0", 0)),
    "share_dead_buffers": (lambda: _states_sequence_gradient("share_dead_buffers"), None, _shareable_ranges,
                           ("> 0", 0)),
    "sink_fills": (lambda: _states_sequence_gradient("sink_fills", "share_dead_buffers"), None, _distant_fills,
                   ("> 0", 0)),
    "local_reductions": (lambda: Graph.of(dataflow.df_lib_sum_axis.to_sdfg()), None, _default_reductions, (4, 0)),
    "collapse_maps": (lambda: Graph.of(dataflow.df_nested_map.to_sdfg()), CollapseMaps(),
                      _nested_maps, ("> 0", 0)),
    "split_operations": (lambda: Graph.of(dataflow.df_states_sequence.to_sdfg()), SplitOperations(),
                         _multi_op_states, ("> 0", 0)),
    "reverse": (lambda: _normalized(loops.lp_if_else), Reverse(("X",), ("S",)), _has_backward, (False, True)),
    "tangent": (lambda: _normalized(loops.lp_if_else), Tangent(("X",), ("S",)),
                lambda g: {"tan_X", "tan_S"} <= set(g.sdfg.arrays), (False, True)),
    "split_vjp": (lambda: Reverse(("X",), ("S",), "vjp")(_normalized(loops.lp_if_else)).unwrap(), SplitVJP(),
                  lambda g: "vjp" in g.meta, (False, True)),
    "onnx_lower": (_onnx_input, None, lambda g: sorted(n for n, d in g.sdfg.arrays.items() if not d.transient),
                   ([], "non-empty")),
}


def _matches(value, expected) -> bool:
    if expected == "> 0":
        return value > 0
    if expected == "non-empty":
        return bool(value)
    return value == expected


def test_every_registered_pass_has_a_contract() -> None:
    assert set(registered_passes()) == set(CONTRACTS)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_before_and_after(name: str) -> None:
    build, step, measure, (before, after) = CONTRACTS[name]
    graph = build()
    step = step if step is not None else registered_passes()[name]()
    assert _matches(measure(graph), before), f"{name}: the input lacks what the pass changes"
    out = step(graph).unwrap()
    assert _matches(measure(out), after), f"{name}: {measure(out)!r}"
    assert _matches(measure(graph), before), f"{name}: the input changed"
    out.sdfg.validate()
