"""`stop_gradient(x)`: the value of x, through which no derivative flows (torch's `detach`, JAX's
`lax.stop_gradient`).

ONNX has no such operation, so a model whose forward detaches a tensor exports the value straight through;
gradflow's torch export writes the detach as a `StopGradient` node of the `gradflow` domain instead
(`torch/stops.py`), lowered to a tasklet calling `gradflow_stop_gradient(x)`. Differentiation reads that
call as `StopGradient`, a SymPy function whose derivative is 0, so every rule (reverse, tangent, and both
of them again for second order) gets a zero there without knowing about it. It is not in
`rules/elementwise.toml`: the table's entries are checked against finite differences of their formulas,
which a stop by definition disagrees with; its checks are against `torch.Tensor.detach`.

The C++ function is the identity. `DEFINITION` is put before the generated code by every gradflow build
(`runtime.compile`) and by the ONNX lowering into the SDFG's own global code, for a plain `sdfg.compile()`.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

import dace
import sympy
from dace.properties import CodeBlock

#: how tasklet code spells the stop (Python and C++ alike)
SPELLING = "gradflow_stop_gradient"

#: the C++ definition, guarded so that several copies in one translation unit are one
DEFINITION = (
    "#ifndef GRADFLOW_STOP_GRADIENT_DEFINED\n"
    "#define GRADFLOW_STOP_GRADIENT_DEFINED\n"
    "template <typename T> DACE_HDFI T gradflow_stop_gradient(const T& x) { return x; }\n"
    "#endif\n"
)


class StopGradient(sympy.Function):
    """x, with derivative 0 with respect to everything."""

    nargs = 1

    @classmethod
    def eval(cls, x):
        if x.is_Number or isinstance(x, StopGradient):  # a constant has no gradient to stop
            return x
        return None

    @staticmethod
    def _imp_(x):  # lambdify: the value
        return x

    def _eval_is_real(self):
        return self.args[0].is_real

    def fdiff(self, argindex=1):
        return sympy.Integer(0)


def only_stopped(tasklet: dace.nodes.Tasklet, connector: str) -> bool:
    """Whether `tasklet` reads `connector` only as the argument of a stop (`gradflow_stop_gradient(m)`): no
    derivative flows through that read, so activity analysis need not count it."""
    code = tasklet.code.as_string
    if not re.search(rf"\b{re.escape(connector)}\b", code):
        return False  # not read in the code at all: an index or a read some other way; count it
    rest = re.sub(rf"\b{SPELLING}\(\s*{re.escape(connector)}\s*\)", "", code)
    return not re.search(rf"\b{re.escape(connector)}\b", rest)


def used(sdfg: dace.SDFG) -> bool:
    """Whether some tasklet of `sdfg` (nested SDFGs included) calls the stop."""
    return any(isinstance(node, dace.nodes.Tasklet) and SPELLING in node.code.as_string
               for node, _ in sdfg.all_nodes_recursive())


def with_definition(code: CodeBlock | None) -> CodeBlock:
    """Global code `code` (C++) with `DEFINITION` in front, unless it has it."""
    text = code.as_string if code is not None else ""
    return CodeBlock(text if DEFINITION in text else DEFINITION + text, dace.dtypes.Language.CPP)


@contextlib.contextmanager
def defined(sdfg: dace.SDFG) -> Iterator[None]:
    """While active, `sdfg`'s global code (host and GPU) defines the stop when a tasklet calls it (restored
    after: the SDFG may belong to an immutable Graph). Programs without a stop are left as they are."""
    if not used(sdfg):
        yield
        return
    saved = dict(sdfg.global_code)
    sdfg.global_code = {**saved, **{key: with_definition(saved.get(key)) for key in ("frame", "cuda")}}
    try:
        yield
    finally:
        sdfg.global_code = saved
