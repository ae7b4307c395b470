"""JAX versions of the loop corpus (`gradflow.verify.corpus.loops`, the `lp_*` kernels).

Each function computes what its `@dace.program` computes, as its torch reference states it: the final value
of `S[0]` (which includes the initial `S[0]` where the program accumulates into it). Conventions in
`benchmarks/peers/__init__.py`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.peers import JaxKernel


def _weights(n: int) -> jnp.ndarray:
    """(1, 2, ..., n) as float64: the `(i + 1)` weights of several summaries."""
    return jnp.arange(1, n + 1, dtype=jnp.float64)


def _masked_loop(n: int, stop, body, carry):
    """`for j in range(stop): carry = body(j, carry)` with a traced `stop <= n`: a static trip count of n,
    the iterations from `stop` on skipped by `lax.cond` (reverse mode needs static trip counts)."""
    return lax.fori_loop(0, n, lambda j, c: lax.cond(j < stop, lambda c: body(j, c), lambda c: c, c), carry)


# ------------------------------------------------------------------------------------------------ stencils


def jacobi_1d(A, B, S, T, **_):
    def step(_, ab):
        a, b = ab
        b = b.at[1:-1].set(0.33333 * (a[:-2] + a[1:-1] + a[2:]))
        a = a.at[1:-1].set(0.33333 * (b[:-2] + b[1:-1] + b[2:]))
        return a, b

    A, B = lax.fori_loop(0, T, step, (A, B))
    return S[0] + jnp.sum(A * A * B)


def _jacobi_2d_step(a):
    return 0.2 * (a[1:-1, 1:-1] + a[1:-1, :-2] + a[1:-1, 2:] + a[2:, 1:-1] + a[:-2, 1:-1])


def jacobi_2d_sweeps(A, B, T):
    """`for t in range(1, T)`: B's interior from A, then A's interior from B."""

    def step(_, ab):
        a, b = ab
        b = b.at[1:-1, 1:-1].set(_jacobi_2d_step(a))
        a = a.at[1:-1, 1:-1].set(_jacobi_2d_step(b))
        return a, b

    return lax.fori_loop(1, T, step, (A, B))


def jacobi_2d(A, B, S, T, **_):
    A, B = jacobi_2d_sweeps(A, B, T)
    return S[0] + jnp.sum(jnp.sin(A) * B)


def _heat_step(a):
    c = a[1:-1, 1:-1, 1:-1]
    return (0.125 * (a[2:, 1:-1, 1:-1] - 2.0 * c + a[:-2, 1:-1, 1:-1])
            + 0.125 * (a[1:-1, 2:, 1:-1] - 2.0 * c + a[1:-1, :-2, 1:-1])
            + 0.125 * (a[1:-1, 1:-1, 2:] - 2.0 * c + a[1:-1, 1:-1, :-2]) + c)


def heat_3d_sweeps(A, B, T):
    """`for t in range(1, T)`: B's interior from A, then A's interior from B."""

    def step(_, ab):
        a, b = ab
        inner = (slice(1, -1),) * 3
        b = b.at[inner].set(_heat_step(a))
        a = a.at[inner].set(_heat_step(b))
        return a, b

    return lax.fori_loop(1, T, step, (A, B))


def heat_3d(A, B, S, T, **_):
    A, _ = heat_3d_sweeps(A, B, T)
    return S[0] + jnp.sum(A * A)


def seidel_2d_sweeps(A, T):
    """T - 1 Gauss-Seidel sweeps: per row, the vectorised 8-neighbour update, then the sequential
    recurrence v[j] = (v[j] + v[j - 1]) / 9 along the row (a scan)."""
    n = A.shape[0]

    def row(i, a):
        up, mid, down = a[i - 1], a[i], a[i + 1]
        r = mid[1:-1] + (up[:-2] + up[1:-1] + up[2:] + mid[2:] + down[:-2] + down[1:-1] + down[2:])

        def along(prev, rj):
            v = (rj + prev) / 9.0
            return v, v

        _, vals = lax.scan(along, mid[0], r)
        return lax.dynamic_update_slice(a, vals[None, :], (i, 1))

    return lax.fori_loop(0, T - 1, lambda _, a: lax.fori_loop(1, n - 1, row, a), A)


def seidel_2d(A, S, T, **_):
    A = seidel_2d_sweeps(A, T)
    return S[0] + jnp.sum(A * A)


# ------------------------------------------------------------------------------------- scalar-loop kernels


def go_fast(A, S, **_):
    trace = jnp.sum(jnp.tanh(jnp.diagonal(A)))
    B = A + trace
    return S[0] + jnp.sum(B * B * A.T)


def softmax(X, W, S, **_):
    m = jnp.max(X, axis=1, keepdims=True)
    e = jnp.exp(X - m)
    return S[0] + jnp.sum(e / jnp.sum(e, axis=1, keepdims=True) * W)


def forward_substitution(L, b):
    """x[i] = (b[i] - L[i, :i] @ x[:i]) / L[i, i], row after row."""
    n = L.shape[0]
    idx = jnp.arange(n)

    def row(i, x):
        return x.at[i].set((b[i] - jnp.dot(jnp.where(idx < i, L[i], 0.0), x)) / L[i, i])

    return lax.fori_loop(0, n, row, jnp.zeros_like(b))


def trisolv(L, b, S, **_):
    x = forward_substitution(L, b)
    return S[0] + jnp.sum(x * x * _weights(x.shape[0]))


def lu_in_place(A):
    """Doolittle LU without pivoting, in place, row by row (PolyBench lu): the strictly lower part of row i
    left to right (each element needs the ones before it), then the upper part of the row at once."""
    n = A.shape[0]
    idx = jnp.arange(n)

    def row(i, a):
        def lower(j, a):
            s = jnp.dot(jnp.where(idx < j, a[i], 0.0), a[:, j])
            return a.at[i, j].set((a[i, j] - s) / a[j, j])

        a = _masked_loop(n, i, lower, a)
        upper = a[i] - jnp.where(idx < i, a[i], 0.0) @ a
        return a.at[i].set(jnp.where(idx >= i, upper, a[i]))

    return lax.fori_loop(0, n, row, A)


def lu(A, W, S, **_):
    return S[0] + jnp.sum(lu_in_place(A) * W)


def levinson_durbin(r):
    """PolyBench durbin: y solves the Yule-Walker system of r, with loop-carried alpha and beta."""
    n = r.shape[0]
    idx = jnp.arange(n)

    def step(k, carry):
        y, alpha, beta = carry
        beta = beta * (1.0 - alpha * alpha)
        mask = idx < k
        flipped = jnp.clip(k - 1 - idx, 0, n - 1)  # i -> k - 1 - i on the prefix i < k
        s = jnp.sum(jnp.where(mask, r[flipped] * y, 0.0))
        alpha = -(r[k] + s) / beta
        y = jnp.where(mask, y + alpha * y[flipped], y).at[k].set(alpha)
        return y, alpha, beta

    y0 = jnp.zeros_like(r).at[0].set(-r[0])
    y, _, _ = lax.fori_loop(1, n, step, (y0, -r[0], jnp.ones((), r.dtype)))
    return y


def durbin(r, S, **_):
    y = levinson_durbin(r)
    return S[0] + jnp.sum(y * _weights(y.shape[0]))


def vadv_sweeps(a, b, c, d, S, **_):
    """Thomas algorithm along axis 1 (a scan over columns, vectorised over rows), then back substitution."""

    def forward(carry, col):
        cp, dp = carry
        ak, bk, ck, dk = col
        den = bk - ak * cp
        cp, dp = ck / den, (dk - ak * dp) / den
        return (cp, dp), (cp, dp)

    cp0, dp0 = c[:, 0] / b[:, 0], d[:, 0] / b[:, 0]
    _, (cps, dps) = lax.scan(forward, (cp0, dp0), (a[:, 1:].T, b[:, 1:].T, c[:, 1:].T, d[:, 1:].T))
    cps = jnp.concatenate([cp0[None], cps])
    dps = jnp.concatenate([dp0[None], dps])

    def backward(x_next, col):
        cpk, dpk = col
        x = dpk - cpk * x_next
        return x, x

    _, xs = lax.scan(backward, dps[-1], (cps[:-1], dps[:-1]), reverse=True)
    x = jnp.concatenate([xs, dps[-1:]])
    return S[0] + jnp.sum(x * x)


# ------------------------------------------------------------------------------------------ while loops


def _newton_sqrt(A, iters):
    """`while |x^2 - A| > 1e-10 A: x = (x + A / x) / 2` from x = A, element-wise, as `iters` masked steps."""

    def step(_, x):
        return jnp.where(jnp.abs(x * x - A) > 1e-10 * A, 0.5 * (x + A / x), x)

    return lax.fori_loop(0, iters, step, A)


def newton_trips(A: np.ndarray) -> int:
    """The largest trip count of the Newton while loop over the elements of A (computed in numpy)."""
    x, trips = np.array(A, dtype=np.float64), 0
    active = np.abs(x * x - A) > 1e-10 * A
    while active.any():
        x = np.where(active, 0.5 * (x + A / x), x)
        active = np.abs(x * x - A) > 1e-10 * A
        trips += 1
    return trips


def newton_sqrt(A, S, iters, **_):
    x = _newton_sqrt(A, iters)
    return S[0] + jnp.sum(x * _weights(x.shape[0]))


def map_of_while(X, S, iters, **_):
    y = _newton_sqrt(X, iters)
    return S[0] + jnp.sum(y * y * _weights(y.shape[0]))


# ---------------------------------------------------------------------------- strides and negative steps


def _strided(X, Y, S, start, step):
    xs, ys = X[start::step], Y[start::step]
    s, _ = lax.scan(lambda s, xy: (s * jnp.cos(xy[0]) + xy[0] * xy[1], None), S[0], (xs, ys))
    Y = Y.at[start::step].set(ys * xs + 1.0)
    return s + jnp.sum(Y * Y)


def strided_step2(X, Y, S, **_):
    return _strided(X, Y, S, 0, 2)


def strided_step3(X, Y, S, **_):
    return _strided(X, Y, S, 1, 3)


def negative_step(C, X, z, S, **_):
    """i = N-1 down to 0: X[i] += 0.5 sin(X[i + 1]) (the updated X[i + 1]), S = S z + C[i] X[i]."""
    n = C.shape[0]

    def step(carry, cx):
        x_next, s = carry
        c, x = cx
        x = x + 0.5 * jnp.sin(x_next)
        return (x, s * z[0] + c * x), None

    (_, s), _ = lax.scan(step, (X[n], S[0]), (C, X[:n]), reverse=True)
    return s


# ----------------------------------------------------------------------------------------- conditionals


def if_else(X, S, **_):
    pos = X > 0.0
    y = jnp.where(pos, X * X, jnp.sin(X) * 3.0)
    decay = jnp.where(pos, 0.9, 0.8)
    add = jnp.where(pos, y, y * X)
    s, _ = lax.scan(lambda s, da: (s * da[0] + da[1], None), S[0], (decay, add))
    return s + jnp.sum(y * 0.5)


def conditional_accumulate(X, S, **_):
    s, _ = lax.scan(lambda s, x: (jnp.where(s > 2.0, s * 0.5 + x, s + x * x), None), S[0], X)
    return s


def map_with_branch(X, S, **_):
    y = jnp.where(X > 0.0, jnp.exp(-X) * X, X * X * X)
    return S[0] + jnp.sum(y * _weights(X.shape[0]))


def break_search(X, S, **_):
    """Per row: X^2 up to and including the first element > 1, sin(X) X strictly before it."""
    big = (X > 1.0).astype(X.dtype)
    seen = jnp.cumsum(big, axis=1)  # number of breaking elements up to and including i
    squares = jnp.where(seen - big == 0.0, X * X, 0.0)
    sines = jnp.where(seen == 0.0, jnp.sin(X) * X, 0.0)
    return S[0] + jnp.sum(squares) + jnp.sum(sines)


# -------------------------------------------------------------------------------- triangles, recurrences


def triangular(A, x, B, S, **_):
    """The nest's iterations are independent (each reads B[i, j] once before writing it): one array
    expression masked to the lower triangle."""
    Bn = A * x[None, :] + B * x[:, None]
    return S[0] + jnp.sum(jnp.tril(Bn * A.T))


def recurrence(A, W, S, **_):
    def step(prev, aw):
        new = jnp.sin(prev) * aw[1] + 0.5 * aw[0]
        return new, new

    _, rest = lax.scan(step, A[0], (A[1:], W[1:]))
    A = jnp.concatenate([A[:1], rest])
    return S[0] + jnp.sum(A * A)


def whole_array_update(A, W, S, T, **_):
    A = lax.fori_loop(0, T, lambda _, a: jnp.tanh(a) * W + 0.1 * a, A)
    return S[0] + jnp.sum(A * _weights(A.shape[0]))


def map_of_loops(X, S, **_):
    acc, _ = lax.scan(lambda acc, col: (acc * 0.5 + jnp.sin(col) * acc, None), X[:, 0], X[:, 1:].T)
    return S[0] + jnp.sum(acc * acc)


def map_inplace_rows(A, W, S, **_):
    def step(prev, col):
        new = col + jnp.sin(prev) * prev
        return new, new

    _, cols = lax.scan(step, A[:, 0], A[:, 1:].T)
    return S[0] + jnp.sum(jnp.concatenate([A[:, :1], cols.T], axis=1) * W)


def growing_prefix(A, C, **_):
    idx = jnp.arange(A.shape[0])
    C = lax.fori_loop(0, A.shape[0], lambda i, c: c + jnp.where(idx <= i, A[i] * A, 0.0), C)
    return jnp.sum(C * C)


def _newton_statics(name: str):
    def statics(symbols, inputs):
        return {**symbols, "iters": newton_trips(np.asarray(inputs[name]))}

    return statics


KERNELS: dict[str, JaxKernel] = {
    "lp_jacobi_1d": JaxKernel(jacobi_1d),
    "lp_jacobi_2d": JaxKernel(jacobi_2d),
    "lp_heat_3d": JaxKernel(heat_3d),
    "lp_seidel_2d": JaxKernel(seidel_2d),
    "lp_go_fast": JaxKernel(go_fast),
    "lp_softmax": JaxKernel(softmax),
    "lp_trisolv": JaxKernel(trisolv),
    "lp_lu": JaxKernel(lu),
    "lp_durbin": JaxKernel(durbin),
    "lp_vadv_sweeps": JaxKernel(vadv_sweeps),
    "lp_newton_sqrt": JaxKernel(newton_sqrt, _newton_statics("A")),
    "lp_strided_step2": JaxKernel(strided_step2),
    "lp_strided_step2_odd": JaxKernel(strided_step2),
    "lp_strided_step3": JaxKernel(strided_step3),
    "lp_negative_step": JaxKernel(negative_step),
    "lp_if_else": JaxKernel(if_else),
    "lp_conditional_accumulate": JaxKernel(conditional_accumulate),
    "lp_triangular": JaxKernel(triangular),
    "lp_recurrence": JaxKernel(recurrence),
    "lp_whole_array_update": JaxKernel(whole_array_update),
    "lp_map_of_loops": JaxKernel(map_of_loops),
    "lp_map_with_branch": JaxKernel(map_with_branch),
    "lp_break_search": JaxKernel(break_search),
    "lp_growing_prefix": JaxKernel(growing_prefix),
    "lp_map_inplace_rows": JaxKernel(map_inplace_rows),
    "lp_map_of_while": JaxKernel(map_of_while, _newton_statics("X")),
}
