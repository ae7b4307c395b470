"""`gradflow-vector`: an implementation of DaCe's `Reduce` whose inner loop the C++ compiler vectorizes.

DaCe's "pure-seq" expansion accumulates each output in a scalar through a chain of dependent updates: the
sum over a softmax row waits for every previous add (4 cycles each), a `max` even more, and GCC may not
reorder floating-point sums by itself. This expansion writes the loops as C++ with OpenMP `simd`:

- the unit-stride axis is reduced (a row sum, `np.max(x, axis=-1)`, a full sum): one accumulator per
  output, and the innermost reduced loop is `#pragma omp simd reduction(op: acc)`, which licenses the
  compiler to keep several partial results in a vector (a sum is then added in another order: the same
  reassociation numpy's pairwise sums, torch and XLA make);
- the unit-stride axis is kept (a column sum, `np.mean(x, axis=0)`): the output row is the accumulator,
  and each step over the reduced axes updates the whole row in a `#pragma omp simd` loop -- vectorized
  across outputs, each output summed in the original order.

The outputs outside the vector axis are a map, so they stay parallel where the schedule passes say so.
Only reductions with an identity and a `+`, `*`, `max` or `min` are expanded this way
(`supports(node, state, sdfg)`); others keep "pure-seq".
"""

from __future__ import annotations

import copy
import math

import dace
import sympy
from dace import dtypes, subsets
from dace.codegen.common import sym2cpp
from dace.frontend.operations import detect_reduction_type
from dace.libraries.standard.nodes.reduce import Reduce
from dace.symbolic import symstr
from dace.transformation import transformation as pm

IMPLEMENTATION = "gradflow-vector"

#: reduction type -> (OpenMP reduction identifier, C++ combining accumulator `a` with value `b`)
_OPS = {
    dtypes.ReductionType.Sum: ("+", "{a} + {b}"),
    dtypes.ReductionType.Product: ("*", "{a} * {b}"),
    dtypes.ReductionType.Max: ("max", "({b} > {a} ? {b} : {a})"),
    dtypes.ReductionType.Min: ("min", "({b} < {a} ? {b} : {a})"),
}

_NUMERIC = (dace.float32, dace.float64, dace.int8, dace.int16, dace.int32, dace.int64, dace.uint8, dace.uint16,
            dace.uint32, dace.uint64)


def _literal(value, dtype: dtypes.typeclass) -> str:
    """The identity as a C++ literal of the reduction's type."""
    if dtype in (dace.float32, dace.float64):
        number = float(value)
        if math.isinf(number):
            return ("-" if number < 0 else "") + f"std::numeric_limits<{dtype.ctype}>::infinity()"
        return f"{dtype.ctype}({number!r})"
    return f"{dtype.ctype}({int(value)})"


def _layout(node: Reduce, state: dace.SDFGState, sdfg: dace.SDFG):
    """(input dims reduced, input dims kept, output dims paired with them) or None where the shapes do not
    pair up the way the pure expansions pair them (kept input dims of size != 1 with output dims of size
    != 1, in order)."""
    inedge, outedge = state.in_edges(node)[0], state.out_edges(node)[0]
    size = inedge.data.subset.size()
    axes = sorted(node.axes if node.axes is not None else range(len(size)))
    reduced = [d for d in axes if size[d] != 1]
    kept = [d for d in range(len(size)) if d not in axes and size[d] != 1]
    out_dims = [d for d, s in enumerate(outedge.data.subset.size()) if s != 1]
    if not reduced or len(kept) != len(out_dims):
        return None
    return reduced, kept, out_dims


def supports(node: Reduce, state: dace.SDFGState, sdfg: dace.SDFG) -> bool:
    """This expansion handles `node`: identity, a simple combining operator, a numeric type, shapes that
    pair up."""
    if node.identity is None or len(state.in_edges(node)) != 1 or len(state.out_edges(node)) != 1:
        return False
    redtype = detect_reduction_type(node.wcr)
    inedge, outedge = state.in_edges(node)[0], state.out_edges(node)[0]
    dtype = sdfg.arrays[inedge.data.data].dtype
    if redtype not in _OPS or dtype not in _NUMERIC or sdfg.arrays[outedge.data.data].dtype != dtype:
        return False
    return _layout(node, state, sdfg) is not None


def _descriptor(desc: dace.data.Data) -> dace.data.Data:
    """The outer container as a non-transient array of the nested SDFG (a view becomes a plain array)."""
    if isinstance(desc, dace.data.View):
        desc = dace.data.Array(desc.dtype, desc.shape, strides=desc.strides, offset=desc.offset,
                               total_size=desc.total_size, storage=desc.storage)
    else:
        desc = copy.deepcopy(desc)
    desc.transient = False
    return desc


def _merged(loops: list[tuple]) -> list[tuple]:
    """(count, stride) loops, outermost first, with each loop that steps exactly over the whole next one
    folded into it: a full sum over a contiguous array is one long loop for the vectorizer."""
    merged = [loops[-1]]
    for count, stride in reversed(loops[:-1]):
        inner_count, inner_stride = merged[0]
        if sympy.simplify(stride - inner_count * inner_stride) == 0:
            merged[0] = (count * inner_count, inner_stride)
        else:
            merged.insert(0, (count, stride))
    return merged


def _loop(var: str, count, body: str, pragma: str = "") -> str:
    head = f"{pragma}\n" if pragma else ""
    return f"{head}for (long long {var} = 0; {var} < {sym2cpp(count)}; ++{var}) {{\n{body}\n}}"


@dace.library.register_expansion(Reduce, IMPLEMENTATION)
class ExpandReduceVector(pm.ExpandTransformation):
    """See the module docstring."""

    environments: list = []

    @staticmethod
    def expansion(node: Reduce, state: dace.SDFGState, sdfg: dace.SDFG) -> dace.SDFG:
        inedge, outedge = state.in_edges(node)[0], state.out_edges(node)[0]
        insub, outsub = inedge.data.subset, outedge.data.subset
        indesc, outdesc = sdfg.arrays[inedge.data.data], sdfg.arrays[outedge.data.data]
        reduced, kept, out_dims = _layout(node, state, sdfg)
        pair = dict(zip(kept, out_dims))
        omp, combine = _OPS[detect_reduction_type(node.wcr)]
        ctype, identity = indesc.dtype.ctype, _literal(node.identity, indesc.dtype)
        size = insub.size()
        step = lambda sub, desc, d: sympy.sympify(sub[d][2]) * sympy.sympify(desc.strides[d])  # noqa: E731

        unit = [d for d in reduced + kept if sympy.sympify(indesc.strides[d]) == 1]
        vector = unit[0] if unit and unit[0] in kept else None
        if unit and unit[0] in reduced:  # the unit-stride reduced axis is the innermost loop
            reduced = [d for d in reduced if d != unit[0]] + [unit[0]]
        mapped = [d for d in kept if d != vector]

        # map parameters must not shadow a symbol of the outer subsets
        taken = {str(s) for s in insub.free_symbols | outsub.free_symbols}
        prefix = "__gv"
        while any(name.startswith(prefix) for name in taken):
            prefix += "_"
        params = {d: f"{prefix}o{k}" for k, d in enumerate(mapped)}

        def point(sub: subsets.Range, d: int, param: str):
            begin, _, stride = sub[d]
            return (begin + stride * sympy.Symbol(param), begin + stride * sympy.Symbol(param), 1)

        in_ranges = [point(insub, d, params[d]) if d in params else insub[d] for d in range(len(size))]
        out_param = {od: params[d] for d, od in pair.items() if d in params}
        out_ranges = [point(outsub, od, out_param[od]) if od in out_param else outsub[od]
                      for od in range(len(outsub))]

        loops = _merged([(size[d], step(insub, indesc, d)) for d in reduced])
        names = [f"{prefix}r{k}" for k in range(len(loops))]
        index = " + ".join(f"{v} * ({sym2cpp(stride)})" for v, (_, stride) in zip(names, loops))
        if vector is None:
            body = f"__acc = {combine.format(a='__acc', b=f'__vin[{index}]')};"
            for k, (v, (count, _)) in enumerate(reversed(list(zip(names, loops)))):
                body = _loop(v, count, body, f"#pragma omp simd reduction({omp}: __acc)" if k == 0 else "")
            code = f"{ctype} __acc = {identity};\n{body}\n__vout = __acc;"
        else:
            ostep = sym2cpp(step(outsub, outdesc, pair[vector]))
            istep = sym2cpp(step(insub, indesc, vector))
            out = f"__vout[{prefix}j * ({ostep})]"
            update = f"{out} = {combine.format(a=out, b=f'__vin[{index} + {prefix}j * ({istep})]')};"
            body = _loop(f"{prefix}j", size[vector], update, "#pragma omp simd")
            for v, (count, _) in reversed(list(zip(names, loops))):
                body = _loop(v, count, body)
            code = _loop(f"{prefix}j", size[vector], f"{out} = {identity};", "#pragma omp simd") + "\n" + body

        nsdfg = dace.SDFG("reduce_vector")
        nsdfg.add_datadesc("_in", _descriptor(indesc))
        nsdfg.add_datadesc("_out", _descriptor(outdesc))
        nstate = nsdfg.add_state()
        tasklet = nstate.add_tasklet("reduce_vector", {"__vin"}, {"__vout"}, code,
                                     language=dtypes.Language.CPP)
        in_memlet = dace.Memlet(data="_in", subset=subsets.Range(in_ranges))
        out_memlet = dace.Memlet(data="_out", subset=subsets.Range(out_ranges))
        read, write = nstate.add_read("_in"), nstate.add_write("_out")
        if mapped:
            entry, exit_ = nstate.add_map("reduce_vector_outputs",
                                          {params[d]: f"0:{symstr(size[d])}" for d in mapped})
            nstate.add_memlet_path(read, entry, tasklet, dst_conn="__vin", memlet=in_memlet)
            nstate.add_memlet_path(tasklet, exit_, write, src_conn="__vout", memlet=out_memlet)
        else:
            nstate.add_edge(read, None, tasklet, "__vin", in_memlet)
            nstate.add_edge(tasklet, "__vout", write, None, out_memlet)

        inedge._dst_conn = "_in"
        outedge._src_conn = "_out"
        node.add_in_connector("_in")
        node.add_out_connector("_out")
        return nsdfg
