"""ONNX names never reach generated code: hostile names lower, run, and are absent from the C++."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from gradflow.frontend.onnx import load
from onnx_testutil import reference

F = TensorProto.FLOAT
EVIL = 'a"; system("touch /tmp/pwned"); //'


def _hostile_model():
    x, w, h, y = f"{EVIL} x", "w */ int main(){ /*", "1:0 ü ä\n#include <evil_header.h>", "out put/0"
    nodes = [
        helper.make_node("MatMul", [x, w], [h], name=f"node {EVIL}"),
        helper.make_node("Tanh", [h], ["__state"], name="}}}; return 1;"),
        helper.make_node("Add", ["__state", x], [y], name="class"),
    ]
    init = helper.make_tensor(w, F, [3, 3], np.arange(9, dtype=np.float32).ravel() / 10)
    graph = helper.make_graph(
        nodes, f"graph {EVIL}",
        [helper.make_tensor_value_info(x, F, [3, 3])],
        [helper.make_tensor_value_info(y, F, [3, 3])],
        initializer=[init],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), x


def test_hostile_names_lower_and_run(tmp_path):
    model, x_name = _hostile_model()
    prog = load(model)
    x = np.random.default_rng(0).standard_normal((3, 3)).astype(np.float32)
    (got,) = prog(x)
    (want,) = reference(model, {x_name: x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    (got_kw,) = prog(**{x_name: x})
    np.testing.assert_array_equal(got, got_kw)
    code = "\n".join(obj.clean_code for obj in prog.sdfg.generate_code())
    # sanitized hints keep letters and digits ("a_system_touch"); punctuation never survives
    for fragment in ('system("', "main(){", "w */", "#include <evil", '"; ', "1:0", "}}}", "ü"):
        assert fragment not in code
    for name in list(prog.sdfg.arrays) + [prog.sdfg.name]:
        assert name.isidentifier() and name.isascii()
