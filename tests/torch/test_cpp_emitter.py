"""The indentation-aware emitter behind the generated C++ dispatcher (`gradflow.torch.cpp_emit`), and the
shape of what `generate_source` writes through it (no C++ compiler needed)."""

from __future__ import annotations

import pytest

from gradflow.torch import cpp
from gradflow.torch.cpp_emit import Emitter
from gradflow.torch.plan import build_plan
from tests.torch.vjp_programs import scale_rows


def test_blocks_nest_and_indent_their_bodies():
    e = Emitter()
    e.line("int f() {}", "")
    with e.block("struct S", close="};"):
        with e.block("void g()"):
            e.line("a();")
            with e.block("if (x)"):
                e.line("b();")
                e.branch("} else {")
                e.line("c();")
            with e.block(""):
                e.line("d();")
        e.line("", "int y;")
    e.line("int z;")
    assert e.source() == (
        "int f() {}\n"
        "\n"
        "struct S {\n"
        "  void g() {\n"
        "    a();\n"
        "    if (x) {\n"
        "      b();\n"
        "    } else {\n"
        "      c();\n"
        "    }\n"
        "    {\n"
        "      d();\n"
        "    }\n"
        "  }\n"
        "\n"
        "  int y;\n"
        "};\n"
        "int z;\n"
    )


def test_text_indents_each_line_and_unindented_blocks_keep_the_depth():
    e = Emitter(indent="    ")
    with e.block("namespace", close="}  // namespace", indent=False):
        e.line("int a;")
        with e.block("void f()"):
            e.text("x();\n\ny();\n")
    assert e.lines == ["namespace {", "int a;", "void f() {", "    x();", "", "    y();", "}",
                       "}  // namespace"]


def test_an_error_inside_a_block_restores_the_depth():
    e = Emitter()
    with pytest.raises(ValueError):
        with e.block("void f()"):
            e.line("a();")
            raise ValueError("boom")
    assert e.depth == 0
    e.line("b();")
    assert e.lines[-1] == "b();"


@pytest.mark.parametrize("stateful", [(True, True), (False, True)])
def test_generated_source_closes_every_brace_and_has_no_trailing_blanks(stateful):
    vjp = scale_rows(name="emit_rows")
    plan = build_plan(vjp, ["A", "b", "alpha"], ["Z", "S"])
    source = cpp.generate_source(plan, "gradflow_emit", stateful)
    lines = source.split("\n")
    assert lines[-1] == "" and lines[-2] == "}"
    assert all(line == line.rstrip() for line in lines)
    depth = 0
    for line in lines:
        depth += line.count("{") - line.count("}")
        assert depth >= 0, line
    assert depth == 0
    # the body of the forward sits two levels in (struct, member function)
    assert "\n    TORCH_CHECK(a0.defined(), " in source
    assert "\n  static variable_list backward(AutogradContext* ctx, variable_list gouts) {\n" in source
