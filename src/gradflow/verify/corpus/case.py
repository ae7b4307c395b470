"""The `Case` record shared by the corpora, and helpers to run a case in DaCe and in PyTorch.

A case is a `@dace.program` with float64 arrays and symbolic sizes, paired with a torch function that
computes the same scalar `of` (a shape-(1,) array of the program) from the same inputs.

Conventions (every corpus module follows them):
- `make_inputs(rng)` returns *every* array the program takes, by name: inputs, outputs, and `of` as a
  shape-(1,) array. Values are drawn inside the domains of the functions applied to them (positive
  arguments of `log`/`sqrt`, no ties for `abs`/`maximum`, both branches of data-dependent conditions...).
  Output arrays are zero-filled unless stated otherwise.
- `torch_fn(**tensors)` receives every array of `make_inputs` as a float64 tensor (keyword arguments;
  it ignores the ones it does not need) and returns the value of `of[0]` *after* the program ran, as a
  0-d tensor. It never mutates its arguments, so `torch.autograd` gives d of / d (initial value of x).
  When a program accumulates into `of` (`S[0] += ...`), `torch_fn` includes the initial value of `S`.
- `wrt` names arrays whose initial values the gradient is taken with respect to. A program may update a
  `wrt` array in place; the gradient is with respect to the value it had when the program was called.
- `symbols` gives a value to every symbol of the program; sizes in `make_inputs` agree with it.
- `loop_bounds` (usually empty) caps the trip counts of while loops (`Forwarding.loop_bounds`): the case
  is differentiated with a fixed-size tape instead of a growable one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import dace
import numpy as np
import torch

from gradflow.core.graph import parse


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    program: Any  # a dace.frontend.python.parser.DaceProgram
    torch_fn: Callable[..., torch.Tensor]
    wrt: tuple[str, ...]
    of: str
    make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    symbols: Mapping[str, int]
    description: str = ""
    loop_bounds: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: the forwarding policy the case is always differentiated under (None: the caller's), for policies
    #: that are a property of the program (checkpointing, which needs the sizes of its loops)
    forwarding: Any = None

    def to_sdfg(self, simplify: bool = True) -> dace.SDFG:
        """A fresh SDFG of the program (each call parses the program again, as `gradflow.core.graph.parse`)."""
        return parse(self.program, simplify)

    def inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        return self.make_inputs(np.random.default_rng(seed))


class BuiltProgram:
    """An SDFG built with DaCe's API, usable as a case's `program`: `to_sdfg` builds a fresh one (it is
    not simplified, so structure the frontend would inline, such as a nested SDFG call, stays)."""

    def __init__(self, build: Callable[[], dace.SDFG], argnames: tuple[str, ...]) -> None:
        self.f = build
        self.argnames = list(argnames)
        self.name = build.__name__

    def to_sdfg(self, simplify: bool = True) -> dace.SDFG:
        return self.f()


def run_compiled(case: Case, compiled: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call a compiled SDFG of `case` on copies of `inputs`; return all arrays as they are afterwards."""
    arrays = {k: np.array(v, dtype=np.float64 if np.asarray(v).dtype.kind == "f" else None, copy=True)
              for k, v in inputs.items()}
    compiled(**arrays, **dict(case.symbols))
    return arrays


def to_tensors(inputs: Mapping[str, np.ndarray], requires_grad: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    return {
        k: torch.tensor(np.array(v, dtype=np.float64), dtype=torch.float64, requires_grad=k in requires_grad)
        for k, v in inputs.items()
    }


def torch_value(case: Case, inputs: Mapping[str, np.ndarray]) -> float:
    with torch.no_grad():
        out = case.torch_fn(**to_tensors(inputs))
    return float(out.reshape(()))


def torch_grads(case: Case, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """d of / d x for every x in `case.wrt`, by torch.autograd (zeros where `of` does not depend on x)."""
    tensors = to_tensors(inputs, requires_grad=case.wrt)
    out = case.torch_fn(**tensors).reshape(())
    leaves = [tensors[w] for w in case.wrt]
    grads = torch.autograd.grad(out, leaves, allow_unused=True)
    return {
        w: (np.zeros_like(inputs[w], dtype=np.float64) if g is None else g.detach().numpy().copy())
        for w, g in zip(case.wrt, grads)
    }


def normal_inputs(**shapes: tuple[int, ...]) -> Callable[[np.random.Generator], dict[str, np.ndarray]]:
    """An input generator: normal draws for the named arrays (a tuple shape each) and a zero `S`, the
    corpora's one-element output."""

    def make(rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {k: rng.normal(size=s) for k, s in shapes.items()}
        out["S"] = np.zeros(1, dtype=np.float64)
        return out

    return make


def element_rows(A: torch.Tensor) -> list[list[torch.Tensor]]:
    """A matrix as a list of lists of 0-d tensors (element-wise loop references write into these)."""
    return [[A[i, j] for j in range(A.shape[1])] for i in range(A.shape[0])]


def stack_rows(rows: list[list[torch.Tensor]]) -> torch.Tensor:
    """The matrix of `element_rows` form."""
    return torch.stack([torch.stack(r) for r in rows])


def list_dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    """Dot product of two lists of 0-d tensors; 0 for empty lists (as `np.dot` of empty slices)."""
    return sum((x * y for x, y in zip(a, b)), torch.zeros((), dtype=torch.float64))


def setitem(t: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """Functional `t[index] = value` for torch references: returns a fresh tensor, never mutates `t`.

    Using it for every write keeps autograd's saved tensors untouched (no version-counter errors).
    """
    out = t.clone()
    out[index] = value
    return out
