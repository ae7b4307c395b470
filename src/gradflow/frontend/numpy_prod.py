"""`np.prod` for DaCe's Python frontend.

DaCe 2.0.0b1 lowers `np.sum`, `np.max`, `a.prod()` and `np.multiply.reduce` to `Reduce` library nodes, but
has no replacement for `np.prod`: a program calling it gets a callback into the Python interpreter, which
no AD can see into (and whose result type DaCe cannot infer for an `axis`). Importing gradflow registers one
through DaCe's op repository (the frontend's documented extension point), as DaCe's own `np.sum` is: a
product `Reduce` over the given axes with identity 1, which reverse mode differentiates
(`ProductReduceReverse`). A DaCe that has its own `numpy.prod` keeps it.
"""

from __future__ import annotations

from dace.frontend.common import op_repository as oprepo
from dace.frontend.python.replacements.reduction import reduce


def _prod(pv, sdfg, state, a: str, axis=None):
    return reduce(pv, sdfg, state, "lambda x, y: x * y", a, axis=axis, identity=1)


if oprepo.Replacements.get("numpy.prod") is None:
    oprepo.replaces("numpy.prod")(_prod)
