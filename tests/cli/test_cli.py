"""The `gradflow` command: grad of a program file and of an ONNX model, show as SVG and HTML, verify, and
one `error:` line with exit code 2 for bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import dace
import numpy as np
import pytest

from gradflow import verify
from gradflow.cli import main

PROGRAM = textwrap.dedent('''
    import dace, numpy as np
    N = dace.symbol("N")

    @dace.program
    def energy(X: dace.float64[N], W: dace.float64[N], S: dace.float64[1]):
        for i in range(N):
            if X[i] > 0:
                S[0] += np.tanh(X[i]) * W[i]
            else:
                S[0] += X[i] * X[i]
''')


@pytest.fixture(scope="module")
def differentiated(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    (folder / "prog.py").write_text(PROGRAM)
    out = folder / "energy.sdfg"
    assert main(["grad", f"{folder / 'prog.py'}:energy", "--wrt", "X,W", "-o", str(out)]) == 0
    return out


def test_grad_writes_a_differentiated_sdfg(differentiated: Path) -> None:
    sdfg = dace.SDFG.from_file(str(differentiated))
    assert {"grad_X", "grad_W"} <= set(sdfg.arrays)
    assert any(b.label == "gradflow_backward" for b in sdfg.nodes())


def test_show_draws_forward_and_backward(differentiated: Path, tmp_path: Path) -> None:
    assert main(["show", str(differentiated), "-o", str(tmp_path / "g.svg")]) == 0
    svg = (tmp_path / "g.svg").read_text()
    assert svg.startswith("<svg") and "forward: " in svg and "backward: gradflow_backward" in svg
    assert "loop reverse_" in svg and "if reverse_" in svg  # the reversed loop and branch are drawn
    assert main(["show", str(differentiated), "-o", str(tmp_path / "g.html")]) == 0
    html = (tmp_path / "g.html").read_text()
    assert "sdfv.js" in html and "gradflow_backward" in html and "</script>" in html


def test_grad_of_an_onnx_model_by_onnx_names(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((3, 2), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "m.sdfg"
    assert main(["grad", str(path), "--wrt", "W", "--of", "loss", "-o", str(out)]) == 0
    sdfg = dace.SDFG.from_file(str(out))
    assert any(name.startswith("grad_") and "W" in name for name in sdfg.arrays)


def test_verify_prints_one_row_per_rule(capsys) -> None:
    assert main(["verify", "--table", "elementwise", "--rule", "exp", "--rule", "tanh", "--quick", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "elementwise  exp" in out and "elementwise  tanh" in out and "2 of 2 rules verified" in out


def test_verify_exits_1_when_a_rule_fails(capsys, monkeypatch) -> None:
    def broken(item):
        return verify.Result(item, (("elementwise", item.name),), False, None, "CheckFailure: made up")

    monkeypatch.setattr(verify, "run_item", broken)
    assert main(["verify", "--table", "elementwise", "--rule", "exp", "--jobs", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["grad", "missing.py:f", "--wrt", "X", "-o", "x.sdfg"], "no such file"),
    (["grad", "nocolon", "--wrt", "X", "-o", "x.sdfg"], "FILE.py:NAME"),
    (["show", "missing.sdfg", "-o", "x.svg"], "no such file"),
    (["verify", "--table", "elementwise", "--rule", "no_such_rule"], "no rule named"),
])
def test_bad_input_is_one_error_line(argv, message, capsys) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_program_and_bad_suffix(differentiated: Path, capsys) -> None:
    assert main(["grad", f"{differentiated.parent / 'prog.py'}:nope", "--wrt", "X", "-o", "x.sdfg"]) == 2
    assert "defines no 'nope'" in capsys.readouterr().err
    assert main(["show", str(differentiated), "-o", str(differentiated.parent / "g.png")]) == 2
    assert ".svg or .html" in capsys.readouterr().err
