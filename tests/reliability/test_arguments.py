"""Call arguments of compiled programs: whatever is passed, the call either computes the right value and
gradients from the values given, or raises a `GradflowError` naming the argument. Nothing is misread
(byte order), nothing read-only is written, nothing is silently zero-filled, no call crashes.

`value_and_grad(energy)` is compiled once for the module; hypothesis varies the arguments.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import gradflow
from gradflow.core.errors import ArgumentError, GradflowError
from gradflow.runtime.calling import Runner
from gradflow.runtime.compile import compile_sdfg
from tests.reliability import programs

N = 5


@functools.cache
def energy():
    return gradflow.value_and_grad(programs.energy, wrt=["X", "W"], of="S")


@functools.cache
def accumulate():
    return gradflow.value_and_grad(programs.accumulate, wrt="X", of="S")


def _reference(X: np.ndarray, W: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    t = np.tanh(X)
    return float(np.sum(t * W)), (1.0 - t * t) * W, t


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(N), rng.standard_normal(N)


# ---------------------------------------------------------------------------------------------------------
# the cases of the issue, one by one


def test_big_endian_arrays_are_rejected_not_misread():
    X, W = _inputs()
    with pytest.raises(ArgumentError, match=r"argument 'X': has non-native byte order \(dtype '>f8'\)"):
        energy()(X=X.astype(">f8"), W=W)
    with pytest.raises(ArgumentError, match=r"argument 'W': has non-native byte order"):
        energy()(X, W.astype(">f8"))
    value, grads = energy()(X=X.astype(">f8").astype(np.float64), W=W)  # converted: accepted, exact
    assert value == pytest.approx(_reference(X, W)[0], rel=1e-12)


def test_read_only_arrays_the_program_writes_are_rejected():
    X, W = _inputs()
    frozen = np.frombuffer(bytes(8), dtype=np.float64)  # read-only memory of an immutable bytes object
    with pytest.raises(ArgumentError, match=r"argument 'S': is read-only.*but the program writes it"):
        energy()(X, W, frozen)
    assert frozen[0] == 0.0
    # read-only arrays the program only reads are fine
    value, grads = energy()(np.frombuffer(X.tobytes()), np.frombuffer(W.tobytes()))
    want, gX, gW = _reference(X, W)
    assert value == pytest.approx(want, rel=1e-12)
    np.testing.assert_allclose(grads["X"], gX, rtol=1e-12)


def test_read_only_memmap_output_is_rejected(tmp_path):
    path = tmp_path / "S.bin"
    np.zeros(1).tofile(path)
    mapped = np.memmap(path, dtype=np.float64, mode="r", shape=(1,))
    X, W = _inputs()
    with pytest.raises(ArgumentError, match=r"argument 'S': is read-only"):
        energy()(X, W, mapped)
    # through the general Runner, too
    sdfg = programs.energy.to_sdfg(simplify=True)
    with pytest.raises(ArgumentError, match=r"argument 'S': is read-only"):
        Runner(compile_sdfg(sdfg))(X=X, W=W, S=mapped)


def test_omitted_array_that_the_program_reads_is_an_error_naming_it():
    X, W = _inputs()
    with pytest.raises(ArgumentError, match=r"'X' missing: the program may read"):
        energy()(W=W)
    with pytest.raises(ArgumentError, match=r"'S' missing"):  # S += ...: read before written
        accumulate()(X)
    value, grad = accumulate()(X, np.full(1, 2.0))
    assert value == pytest.approx(2.0 + float(np.sum(X * X)), rel=1e-12)
    np.testing.assert_allclose(grad, 2 * X, rtol=1e-12)
    value, _ = energy()(X, W)  # S is overwritten before it is read: allocated
    assert value == pytest.approx(_reference(X, W)[0], rel=1e-12)


def test_none_and_junk_arguments_are_argument_errors():
    X, W = _inputs()
    with pytest.raises(ArgumentError, match=r"argument 'X' is None"):
        energy()(None, W)
    with pytest.raises(ArgumentError, match=r"symbol 'N' must be an int, got 'five'"):
        energy()(X, W, N="five")
    with pytest.raises(ArgumentError, match=r"argument 'W': expected a torch.Tensor or numpy.ndarray, got str"):
        energy()(X, "W")


# ---------------------------------------------------------------------------------------------------------
# fuzzing: every argument drawn from good and bad variants


def _variants(good: np.ndarray) -> dict[str, object]:
    t = torch.from_numpy(good.copy())
    two = np.stack([good, good])
    return {
        "good": good.copy(),
        "torch": t,
        "torch-requires-grad": t.clone().requires_grad_(True),
        "read-only": np.frombuffer(good.tobytes()),
        "float32": good.astype(np.float32),
        "int64": good.astype(np.int64),
        "bool": good > 0,
        "big-endian": good.astype(">f8"),
        "strided": np.repeat(good, 2)[::2],
        "broadcast": np.broadcast_to(good[:1], good.shape),
        "fortran-2d": np.asfortranarray(two),
        "longer": np.concatenate([good, good[:1]]),
        "0-d": np.asarray(good[0]),
        "list": good.tolist(),
        "None": None,
        "str": "X",
        "float": 1.5,
        "torch-float32": t.float(),
        "torch-neg-view": torch._neg_view(t),
        "torch-meta": torch.empty(good.shape, dtype=torch.float64, device="meta"),
        "torch-sparse": t.to_sparse(),
        "torch-transposed": torch.from_numpy(two.copy()).t(),
    }


_BAD = sorted(set(_variants(np.zeros(2))) - {"good", "torch", "torch-requires-grad", "read-only"})
#: mostly values that must be accepted (repeated entries weigh the draw), and every bad variant
_ARRAY = st.sampled_from(["good"] * 8 + ["torch"] * 3 + ["torch-requires-grad", "read-only", "absent"] + _BAD)
_OUTPUT = st.sampled_from(["absent"] * 6 + ["good"] * 3 + ["torch", "read-only", "float32", "big-endian", "list",
                                                            "None", "0-d", "float"])
_SYMBOL = st.sampled_from([None] * 8 + [N, N + 1, -1, 2**40, 3.5, "5", [5], np.int64(N)])
_EXTRA = st.sampled_from([None] * 6 + ["Q", "grad_X", "N"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=_ARRAY, w=_ARRAY, s=_OUTPUT, n=_SYMBOL, positional=st.booleans(), extra=_EXTRA, seed=st.integers(0, 99))
def test_any_call_is_right_or_a_gradflow_error(x, w, s, n, positional, extra, seed):
    X, W = _inputs(seed)
    values = {"X": _variants(X).get(x), "W": _variants(W).get(w), "S": _variants(np.zeros(1)).get(s)}
    kinds = {"X": x, "W": w, "S": s}
    given = {k: v for k, v in values.items() if kinds[k] != "absent"}
    snapshot = {k: (v.copy() if isinstance(v, np.ndarray) else v.detach().clone() if isinstance(v, torch.Tensor)
                    and v.layout is torch.strided and v.device.type == "cpu" else None) for k, v in given.items()}
    kwargs = dict(given)
    if n is not None:
        kwargs["N"] = n
    if extra is not None:
        kwargs[extra] = np.zeros(N)
    args: tuple = ()
    if positional and "X" in kwargs and "W" in kwargs:
        args = (kwargs.pop("X"), kwargs.pop("W"))
    try:
        value, grads = energy()(*args, **kwargs)
    except GradflowError as exc:
        event(type(exc).__name__)
    else:
        event("accepted")
        # accepted: the values given are what was computed with
        want, gX, gW = _reference(np.asarray(values["X"].detach() if isinstance(values["X"], torch.Tensor)
                                             else values["X"], dtype=np.float64),
                                  np.asarray(values["W"].detach() if isinstance(values["W"], torch.Tensor)
                                             else values["W"], dtype=np.float64))
        assert value == pytest.approx(want, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(np.asarray(grads["X"]), gX, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(grads["W"]), gW, rtol=1e-12, atol=1e-12)
    for k in ("X", "W"):  # inputs are never modified, whatever happened
        if snapshot.get(k) is not None:
            now = given[k].detach() if isinstance(given[k], torch.Tensor) else given[k]
            assert (now == snapshot[k]).all()
