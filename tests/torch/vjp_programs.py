"""Hand-written forward/backward SDFG pairs (VJPResults) and their pure-torch references, for the tests.

They stand in for `gradflow.vjp` results: each forward computes what the reference computes, writes the
values the backward needs, and the backward is the textbook vector-Jacobian product written as maps.
"""

from __future__ import annotations

import dace
import torch

from gradflow.autodiff.interface import VJPResult

N = dace.symbol("N")
M = dace.symbol("M")


def square_mul(dtype=dace.float64, name: str = "sqmul") -> VJPResult:
    """Y = X * X * W elementwise; the forward saves the transient T = X * X for the backward."""
    fwd = dace.SDFG(f"{name}_fwd")
    for a in ("X", "W", "Y", "T"):
        fwd.add_array(a, [N], dtype)
    s1 = fwd.add_state("square")
    s1.add_mapped_tasklet("sq", dict(i="0:N"), dict(x=dace.Memlet("X[i]")), "t = x * x",
                          dict(t=dace.Memlet("T[i]")), external_edges=True)
    s2 = fwd.add_state_after(s1, "mul")
    s2.add_mapped_tasklet("mul", dict(i="0:N"), dict(t=dace.Memlet("T[i]"), w=dace.Memlet("W[i]")),
                          "y = t * w", dict(y=dace.Memlet("Y[i]")), external_edges=True)

    bwd = dace.SDFG(f"{name}_bwd")
    for a in ("X", "W", "T", "gY", "gX", "gW"):
        bwd.add_array(a, [N], dtype)
    b = bwd.add_state("grads")
    b.add_mapped_tasklet(
        "grads", dict(i="0:N"),
        dict(x=dace.Memlet("X[i]"), w=dace.Memlet("W[i]"), t=dace.Memlet("T[i]"), gy=dace.Memlet("gY[i]")),
        "gx = 2 * x * w * gy\ngw = t * gy",
        dict(gx=dace.Memlet("gX[i]"), gw=dace.Memlet("gW[i]")), external_edges=True)
    return VJPResult(
        forward=fwd, backward=bwd, wrt=("X", "W"), of=("Y",), grads={"X": "gX", "W": "gW"},
        cotangents={"Y": "gY"}, forwarded=("X", "W", "T"), saved=("T",),
    )


def square_mul_reference(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    return X * X * W


def scale_rows(dtype=dace.float64, name: str = "scalerows") -> VJPResult:
    """Two outputs, a scalar input, 2-D symbolic shapes and reductions:
    Z[i, j] = alpha * A[i, j] * b[j];  S[i] = sum_j A[i, j] ** 2 (accumulated into S with `+`)."""
    fwd = dace.SDFG(f"{name}_fwd")
    fwd.add_array("A", [N, M], dtype)
    fwd.add_array("b", [M], dtype)
    fwd.add_scalar("alpha", dtype)
    fwd.add_array("Z", [N, M], dtype)
    fwd.add_array("S", [N], dtype)
    st = fwd.add_state("main")
    st.add_mapped_tasklet(
        "scale", dict(i="0:N", j="0:M"),
        dict(a=dace.Memlet("A[i, j]"), bb=dace.Memlet("b[j]"), al=dace.Memlet("alpha[0]")),
        "z = al * a * bb", dict(z=dace.Memlet("Z[i, j]")), external_edges=True)
    st.add_mapped_tasklet(
        "sumsq", dict(i="0:N", j="0:M"), dict(a=dace.Memlet("A[i, j]")), "s = a * a",
        dict(s=dace.Memlet("S[i]", wcr="lambda x, y: x + y")), external_edges=True)

    bwd = dace.SDFG(f"{name}_bwd")
    bwd.add_array("A", [N, M], dtype)
    bwd.add_array("b", [M], dtype)
    bwd.add_scalar("alpha", dtype)
    bwd.add_array("gZ", [N, M], dtype)
    bwd.add_array("gS", [N], dtype)
    bwd.add_array("gA", [N, M], dtype)
    bwd.add_array("gb", [M], dtype)
    bwd.add_array("galpha", [1], dtype)
    init = bwd.add_state("zero")
    init.add_mapped_tasklet("zb", dict(j="0:M"), {}, "o = 0", dict(o=dace.Memlet("gb[j]")), external_edges=True)
    init.add_mapped_tasklet("za", dict(k="0:1"), {}, "o = 0", dict(o=dace.Memlet("galpha[k]")),
                            external_edges=True)
    st = bwd.add_state_after(init, "grads")
    st.add_mapped_tasklet(
        "ga", dict(i="0:N", j="0:M"),
        dict(a=dace.Memlet("A[i, j]"), bb=dace.Memlet("b[j]"), al=dace.Memlet("alpha[0]"),
             gz=dace.Memlet("gZ[i, j]"), gs=dace.Memlet("gS[i]")),
        "ga = al * bb * gz + 2 * a * gs\ngbb = al * a * gz\ngal = a * bb * gz",
        dict(ga=dace.Memlet("gA[i, j]"), gbb=dace.Memlet("gb[j]", wcr="lambda x, y: x + y"),
             gal=dace.Memlet("galpha[0]", wcr="lambda x, y: x + y")),
        external_edges=True)
    return VJPResult(
        forward=fwd, backward=bwd, wrt=("A", "b", "alpha"), of=("Z", "S"),
        grads={"A": "gA", "b": "gb", "alpha": "galpha"}, cotangents={"Z": "gZ", "S": "gS"},
        forwarded=("A", "b", "alpha"), saved=(),
    )


def scale_rows_reference(A: torch.Tensor, b: torch.Tensor, alpha) -> tuple[torch.Tensor, torch.Tensor]:
    return alpha * A * b, (A * A).sum(dim=1)


def square_in_place(dtype=dace.float64, name: str = "sqinplace") -> VJPResult:
    """A forward that overwrites its input and a backward that overwrites its cotangent:
    X <- X * X (in place; the old X is stored in T first), Y = X * W. The backward first doubles gY in
    place, then gX = T * W * gY (= 2 X0 W gY), gW = X * gY / 2 (= X0^2 gY)."""
    fwd = dace.SDFG(f"{name}_fwd")
    for a in ("X", "W", "Y", "T"):
        fwd.add_array(a, [N], dtype)
    s1 = fwd.add_state("store")
    s1.add_mapped_tasklet("store", dict(i="0:N"), dict(x=dace.Memlet("X[i]")), "t = x",
                          dict(t=dace.Memlet("T[i]")), external_edges=True)
    s2 = fwd.add_state_after(s1, "square")
    s2.add_mapped_tasklet("sq", dict(i="0:N"), dict(x=dace.Memlet("X[i]")), "o = x * x",
                          dict(o=dace.Memlet("X[i]")), external_edges=True)
    s3 = fwd.add_state_after(s2, "mul")
    s3.add_mapped_tasklet("mul", dict(i="0:N"), dict(x=dace.Memlet("X[i]"), w=dace.Memlet("W[i]")),
                          "y = x * w", dict(y=dace.Memlet("Y[i]")), external_edges=True)

    bwd = dace.SDFG(f"{name}_bwd")
    for a in ("X", "W", "T", "gY", "gX", "gW"):
        bwd.add_array(a, [N], dtype)
    b1 = bwd.add_state("double")
    b1.add_mapped_tasklet("dbl", dict(i="0:N"), dict(g=dace.Memlet("gY[i]")), "o = 2 * g",
                          dict(o=dace.Memlet("gY[i]")), external_edges=True)
    b2 = bwd.add_state_after(b1, "grads")
    b2.add_mapped_tasklet(
        "grads", dict(i="0:N"),
        dict(x=dace.Memlet("X[i]"), w=dace.Memlet("W[i]"), t=dace.Memlet("T[i]"), gy=dace.Memlet("gY[i]")),
        "gx = t * w * gy\ngw = x * gy / 2",
        dict(gx=dace.Memlet("gX[i]"), gw=dace.Memlet("gW[i]")), external_edges=True)
    return VJPResult(
        forward=fwd, backward=bwd, wrt=("X", "W"), of=("Y",), grads={"X": "gX", "W": "gW"},
        cotangents={"Y": "gY"}, forwarded=("X", "W", "T"), saved=("T",),
    )
