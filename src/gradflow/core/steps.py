"""Step functions: floor, ceiling, truncation, rounding and floor division as SymPy functions whose
derivative is 0.

They are constant between their jumps, so 0 is the derivative almost everywhere, and torch's convention
(`torch.floor(x)` has a zero gradient). SymPy's own `floor` leaves its derivative unevaluated, which
gradflow could only refuse; these say 0. Each evaluates on numbers (SymPy's folding, the tests'
`lambdify` through `_imp_`) as the C function of the same name does: `round` halves away from zero.
"""

from __future__ import annotations

import math
from typing import Callable, ClassVar

import numpy as np
import sympy


class Step(sympy.Function):
    """A real step function with integer values; `c_name` is the function tasklet code calls."""

    nargs = 1
    c_name = ""
    #: the function on Python floats (SymPy's folding of numbers)
    on_floats: ClassVar[Callable[..., float]]

    @classmethod
    def eval(cls, *xs):
        if len(xs) == 1 and xs[0].is_integer:
            return xs[0]
        if all(x.is_Number and x.is_finite for x in xs) and not (len(xs) == 2 and xs[1].is_zero):
            return sympy.Integer(int(cls.on_floats(*(float(x) for x in xs))))
        return None

    def _eval_is_integer(self):
        return True

    def _eval_is_real(self):
        return True

    def fdiff(self, argindex=1):
        return sympy.Integer(0)


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


class Floor(Step):
    c_name = "floor"
    on_floats = staticmethod(math.floor)
    _imp_ = staticmethod(np.floor)


class Ceil(Step):
    c_name = "ceil"
    on_floats = staticmethod(math.ceil)
    _imp_ = staticmethod(np.ceil)


class Trunc(Step):
    c_name = "trunc"
    on_floats = staticmethod(math.trunc)
    _imp_ = staticmethod(np.trunc)


class Round(Step):
    """C's `round`: halves away from zero (NumPy's `rint` and Python's `round` go to the even neighbour)."""

    c_name = "round"
    on_floats = staticmethod(lambda x: float(_round_half_away(x)))
    _imp_ = staticmethod(_round_half_away)


class FloorDiv(Step):
    """Python's `a // b`, printed as DaCe's `py_floor(a, b)`: `floor(a / b)` would truncate the quotient
    of two C integers before the floor."""

    nargs = 2
    c_name = "py_floor"
    on_floats = staticmethod(lambda a, b: math.floor(a / b))
    _imp_ = staticmethod(np.floor_divide)


#: formula name -> function (the names `rules/elementwise.toml` may use)
STEP_FUNCTIONS = {"floor": Floor, "ceil": Ceil, "trunc": Trunc, "round": Round, "floordiv": FloorDiv}
