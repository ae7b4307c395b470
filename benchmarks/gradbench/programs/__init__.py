"""The GradBench evals' functions as DaCe programs, written as a DaCe user writes numpy code.

One module per eval. Each defines `FUNCTIONS`: the eval's function name -> `Function`, which turns the
eval's JSON input into a prepared call (built and compiled before it is timed) and its result back into
JSON. The derivatives are gradflow's: `gradflow.value_and_grad` of the program; nothing is differentiated
by hand.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import attrs


@attrs.frozen
class Function:
    """`prepare(input)` returns `(call, post)`: `call()` computes the function on the prepared input (the
    timed part), `post(result)` turns its result into the eval's JSON output."""

    prepare: Callable[[Any], tuple[Callable[[], Any], Callable[[Any], Any]]]


@functools.cache
def built(program, wrt: str | tuple[str, ...], of: str):
    """`program`'s optimized forward (a `Runner`) and its `gradflow.value_and_grad`, built once each."""
    import gradflow
    from gradflow.api import optimized
    from gradflow.runtime import Runner

    return (Runner(optimized(gradflow.Graph.of(program), True)),
            gradflow.value_and_grad(program, wrt=wrt if isinstance(wrt, str) else list(wrt), of=of))


def forward_call(forward, result, **arguments) -> Callable[[], Any]:
    """A call of `forward` on `arguments` (arrays prepared once) that returns `result`, an array it writes."""
    def call():
        forward(**arguments)
        return result
    return call
