"""JAX versions of the NPBench corpus's linear-algebra, stencil and solver kernels (`tests/corpus/npbench.py`).

Each returns the program's summary `S[0] = sum(x * ct_x)` over its outputs. Constants (ALPHA, BETA, the
cavity-flow and vadv coefficients) are the corpus's. The deep-learning kernels are in `jax_dl.py`.
Conventions in `benchmarks/peers/__init__.py`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from benchmarks.peers import JaxKernel
from benchmarks.peers.jax_loops import (_masked_loop, forward_substitution, heat_3d_sweeps, jacobi_2d_sweeps,
                                        levinson_durbin, lu_in_place, seidel_2d_sweeps)
from tests.corpus import npbench as nb

ALPHA, BETA = nb.ALPHA, nb.BETA


def _wsum(x, ct):
    return jnp.sum(x * ct)


# ----------------------------------------------------------------------------------------- BLAS-like


def atax(A, x, ct_y, **_):
    return _wsum((A @ x) @ A, ct_y)


def bicg(A, p, r, ct_s, ct_q, **_):
    return _wsum(r @ A, ct_s) + _wsum(A @ p, ct_q)


def gemm(C, A, B, ct_C, **_):
    return _wsum(ALPHA * A @ B + BETA * C, ct_C)


def gemver(A, u1, v1, u2, v2, w, x, y, z, ct_w, **_):
    A = A + jnp.outer(u1, v1) + jnp.outer(u2, v2)
    x = x + BETA * y @ A + z
    return _wsum(w + ALPHA * A @ x, ct_w)


def gesummv(A, B, x, ct_res, **_):
    return _wsum(ALPHA * A @ x + BETA * B @ x, ct_res)


def k2mm(A, B, C, D, ct_D, **_):
    return _wsum(ALPHA * A @ B @ C + BETA * D, ct_D)


def k3mm(A, B, C, D, ct_E, **_):
    return _wsum(A @ B @ C @ D, ct_E)


def mvt(x1, x2, y_1, y_2, A, ct_x1, ct_x2, **_):
    return _wsum(x1 + A @ y_1, ct_x1) + _wsum(x2 + y_2 @ A, ct_x2)


def doitgen(A, C4, ct_A, **_):
    """The loop over r has independent iterations: one batched product."""
    return _wsum(jnp.einsum("rqp,ps->rqs", A, C4), ct_A)


def go_fast(a, ct_res, **_):
    return _wsum(a + jnp.sum(jnp.tanh(jnp.diagonal(a))), ct_res)


# --------------------------------------------------------------------------------- factorisations, solvers


def cholesky(A, W, **_):
    """In place, row by row; the strictly lower part of a row left to right (each element needs the ones
    before it), the diagonal last. The upper part keeps its input values, as in the program. The corpus
    program (`lp_cholesky_dot`, shared with the loop corpus) names its cotangent `W`."""
    n = A.shape[0]
    idx = jnp.arange(n)
    A = A.at[0, 0].set(jnp.sqrt(A[0, 0]))

    def row(i, a):
        def lower(j, a):
            s = jnp.dot(jnp.where(idx < j, a[i], 0.0), jnp.where(idx < j, a[j], 0.0))
            return a.at[i, j].set((a[i, j] - s) / a[j, j])

        a = _masked_loop(n, i, lower, a)
        head = jnp.where(idx < i, a[i], 0.0)
        return a.at[i, i].set(jnp.sqrt(a[i, i] - jnp.dot(head, head)))

    return _wsum(lax.fori_loop(1, n, row, A), W)


def lu(A, W, **_):
    """`lp_lu_slices` (shared with the loop corpus) names its cotangent `W`."""
    return _wsum(lu_in_place(A), W)


def ludcmp(A, b, ct_x, ct_y, **_):
    n = A.shape[0]
    idx = jnp.arange(n)
    A = lu_in_place(A)
    y = lax.fori_loop(0, n, lambda i, y: y.at[i].set(b[i] - jnp.dot(jnp.where(idx < i, A[i], 0.0), y)),
                      jnp.zeros_like(b))

    def back(k, x):
        i = n - 1 - k
        return x.at[i].set((y[i] - jnp.dot(jnp.where(idx > i, A[i], 0.0), x)) / A[i, i])

    x = lax.fori_loop(0, n, back, jnp.zeros_like(b))
    return _wsum(x, ct_x) + _wsum(y, ct_y)


def trisolv(L, b, ct_x, **_):
    return _wsum(forward_substitution(L, b), ct_x)


def durbin(r, ct_y, **_):
    return _wsum(levinson_durbin(r), ct_y)


def gramschmidt(A, ct_Q, ct_R, ct_A, **_):
    """Modified Gram-Schmidt; the loop over j > k has independent iterations: one product and one
    rank-1 update masked to the columns after k."""
    n = A.shape[1]
    idx = jnp.arange(n)

    def column(k, carry):
        a, q, r = carry
        rkk = jnp.sqrt(jnp.dot(a[:, k], a[:, k]))
        qk = a[:, k] / rkk
        rk = jnp.where(idx > k, qk @ a, 0.0)
        r = r.at[k].set(rk).at[k, k].set(rkk)
        return a - jnp.outer(qk, rk), q.at[:, k].set(qk), r

    A, Q, R = lax.fori_loop(0, n, column, (A, jnp.zeros_like(A), jnp.zeros((n, n), A.dtype)))
    return _wsum(Q, ct_Q) + _wsum(R, ct_R) + _wsum(A, ct_A)


def symm(C, A, B, ct_C, **_):
    """Row i of A (its part before the diagonal) updates the rows above i of C and gives temp2; the loop over
    columns j has independent iterations."""
    m = C.shape[0]
    idx = jnp.arange(m)

    def row(i, c):
        head = jnp.where(idx < i, A[i], 0.0)
        c = c + ALPHA * jnp.outer(head, B[i])
        return c.at[i].add(ALPHA * B[i] * A[i, i] + ALPHA * (head @ B))

    return _wsum(lax.fori_loop(0, m, row, C * BETA), ct_C)


def syr2k(C, A, B, ct_C, **_):
    """Rows are independent and the loop over k is a reduction: the lower triangle at once."""
    lower = jnp.tril(jnp.ones(C.shape, dtype=bool))
    return _wsum(jnp.where(lower, BETA * C + ALPHA * (B @ A.T + A @ B.T), C), ct_C)


def syrk(C, A, ct_C, **_):
    lower = jnp.tril(jnp.ones(C.shape, dtype=bool))
    return _wsum(jnp.where(lower, BETA * C + ALPHA * (A @ A.T), C), ct_C)


def trmm(A, B, ct_B, **_):
    """Row i reads only rows below i, which are not yet updated: B + (strictly lower A)^T B."""
    return _wsum((B + jnp.tril(A, -1).T @ B) * ALPHA, ct_B)


def covariance(data, ct_cov, **_):
    n = data.shape[0]
    d = data - jnp.mean(data, axis=0)
    return _wsum(d.T @ d / (n - 1.0), ct_cov)


def correlation(data, ct_corr, **_):
    n, m = data.shape
    mean = jnp.mean(data, axis=0)
    stddev = jnp.sqrt(jnp.mean((data - mean) ** 2, axis=0))
    stddev = jnp.where(stddev <= 0.1, 1.0, stddev)
    d = (data - mean) / (jnp.sqrt(float(n)) * stddev)
    return _wsum(jnp.where(jnp.eye(m, dtype=bool), 1.0, d.T @ d), ct_corr)


# ------------------------------------------------------------------------------------------------ stencils


def jacobi_1d(A, B, ct_A, ct_B, T, **_):
    def step(_, ab):
        a, b = ab
        b = b.at[1:-1].set(0.33333 * (a[:-2] + a[1:-1] + a[2:]))
        a = a.at[1:-1].set(0.33333 * (b[:-2] + b[1:-1] + b[2:]))
        return a, b

    A, B = lax.fori_loop(1, T, step, (A, B))
    return _wsum(A, ct_A) + _wsum(B, ct_B)


def jacobi_2d(A, B, ct_A, ct_B, T, **_):
    A, B = jacobi_2d_sweeps(A, B, T)
    return _wsum(A, ct_A) + _wsum(B, ct_B)


def heat_3d(A, B, ct_A, ct_B, T, **_):
    A, B = heat_3d_sweeps(A, B, T)
    return _wsum(A, ct_A) + _wsum(B, ct_B)


def seidel_2d(A, ct_A, T, **_):
    return _wsum(seidel_2d_sweeps(A, T), ct_A)


def fdtd_2d(ex, ey, hz, fict, ct_ex, ct_ey, ct_hz, **_):
    def step(t, fields):
        ex, ey, hz = fields
        ey = ey.at[0, :].set(fict[t])
        ey = ey.at[1:, :].add(-0.5 * (hz[1:, :] - hz[:-1, :]))
        ex = ex.at[:, 1:].add(-0.5 * (hz[:, 1:] - hz[:, :-1]))
        hz = hz.at[:-1, :-1].add(-0.7 * (ex[:-1, 1:] - ex[:-1, :-1] + ey[1:, :-1] - ey[:-1, :-1]))
        return ex, ey, hz

    ex, ey, hz = lax.fori_loop(0, fict.shape[0], step, (ex, ey, hz))
    return _wsum(ex, ct_ex) + _wsum(ey, ct_ey) + _wsum(hz, ct_hz)


def _tridiagonal(lower, diag, upper, rhs, first):
    """One ADI sweep: the recurrences p[j] = -upper / (lower p[j-1] + diag) and q[j] = (rhs[j] - lower
    q[j-1]) / (lower p[j-1] + diag) from p = 0, q = `first` (a scan over j = 1..n-2, vectorised over the
    other axis), then the back substitution x[j] = p[j] x[j+1] + q[j] from x[n-1] = `first`.
    `rhs` holds rows j = 1..n-2; returns x for j = 1..n-2 (rows)."""

    def forward(carry, r):
        p, q = carry
        den = lower * p + diag
        p, q = -upper / den, (r - lower * q) / den
        return (p, q), (p, q)

    _, (ps, qs) = lax.scan(forward, (jnp.zeros_like(first), first), rhs)

    def backward(x_next, pq):
        x = pq[0] * x_next + pq[1]
        return x, x

    _, xs = lax.scan(backward, first, (ps, qs), reverse=True)
    return xs


def adi(u, ct_u, T, **_):
    n = u.shape[0]
    dx = dy = 1.0 / n
    dt = 1.0 / T
    mul1, mul2 = 2.0 * dt / (dx * dx), 1.0 * dt / (dy * dy)
    a, b, d, e = -mul1 / 2.0, 1.0 + mul2, -mul2 / 2.0, 1.0 + mul2
    c, f = a, d
    one = jnp.ones(n - 2, dtype=u.dtype)

    def step(_, u):
        # column sweep: v[j, 1:n-1] for j = 1..n-2, from rows j of u; rows 0 and n-1 of v hold 1
        rhs = -d * u[1:-1, :-2] + (1.0 + 2.0 * d) * u[1:-1, 1:-1] - f * u[1:-1, 2:]
        v = _tridiagonal(a, b, c, rhs, one)
        v = jnp.concatenate([one[None], v, one[None]])  # (n, n - 2): columns 1..n-2 of v
        # row sweep: u[1:n-1, j] for j = 1..n-2, from columns j of v
        rhs = -a * v[:-2].T + (1.0 + 2.0 * a) * v[1:-1].T - c * v[2:].T
        cols = _tridiagonal(d, e, f, rhs, one)
        inner = jnp.concatenate([one[:, None], cols.T, one[:, None]], axis=1)
        return u.at[1:-1, :].set(inner)

    return _wsum(lax.fori_loop(0, T, step, u), ct_u)


def _iir(x, a0, a1, a2, a3, b1, b2):
    """Deriche's causal plus anti-causal recurrences along axis 0 (two scans)."""
    zero = jnp.zeros_like(x[0])

    def causal(carry, xj):
        y1, y2, x1 = carry  # y[j-1], y[j-2], x[j-1]
        y = a0 * xj + a1 * x1 + b1 * y1 + b2 * y2
        return (y, y1, xj), y

    def anticausal(carry, xj):
        y1, y2, x1, x2 = carry  # y[j+1], y[j+2], x[j+1], x[j+2]
        y = a2 * x1 + a3 * x2 + b1 * y1 + b2 * y2
        return (y, y1, xj, x1), y

    _, forward = lax.scan(causal, (zero, zero, zero), x)
    _, backward = lax.scan(anticausal, (zero, zero, zero, zero), x, reverse=True)
    return forward + backward


def deriche(imgIn, ct_imgOut, **_):
    al = nb.ALPHA_DERICHE
    ea, e2a = jnp.exp(-al), jnp.exp(-2.0 * al)
    k = (1.0 - ea) * (1.0 - ea) / (1.0 + al * ea - jnp.exp(2.0 * al))
    coeffs = (k, k * ea * (al - 1.0), k * ea * (al + 1.0), -k * e2a, 2.0 ** (-al), -e2a)
    out = _iir(imgIn.T, *coeffs).T  # along j (axis 1)
    return _wsum(_iir(out, *coeffs), ct_imgOut)  # along i (axis 0)


def cavity_flow(u, v, p, ct_u, ct_v, T, NIT, **_):
    dx, dy, dt, rho, nu = nb.DX_C, nb.DY_C, nb.DT_C, nb.RHO, nb.NU

    def step(_, fields):
        u, v, p, b = fields
        un, vn = u, v
        b = b.at[1:-1, 1:-1].set(
            rho * (1 / dt * ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * dx) + (v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * dy))
                   - ((u[1:-1, 2:] - u[1:-1, 0:-2]) / (2 * dx)) ** 2
                   - 2 * ((u[2:, 1:-1] - u[0:-2, 1:-1]) / (2 * dy) * (v[1:-1, 2:] - v[1:-1, 0:-2]) / (2 * dx))
                   - ((v[2:, 1:-1] - v[0:-2, 1:-1]) / (2 * dy)) ** 2))

        def poisson(_, p):
            pn = p
            p = p.at[1:-1, 1:-1].set(
                ((pn[1:-1, 2:] + pn[1:-1, 0:-2]) * dy ** 2 + (pn[2:, 1:-1] + pn[0:-2, 1:-1]) * dx ** 2)
                / (2 * (dx ** 2 + dy ** 2)) - dx ** 2 * dy ** 2 / (2 * (dx ** 2 + dy ** 2)) * b[1:-1, 1:-1])
            p = p.at[:, -1].set(p[:, -2])
            p = p.at[0, :].set(p[1, :])
            p = p.at[:, 0].set(p[:, 1])
            return p.at[-1, :].set(0.0)

        p = lax.fori_loop(0, NIT, poisson, p)
        u = un.at[1:-1, 1:-1].set(
            un[1:-1, 1:-1] - un[1:-1, 1:-1] * dt / dx * (un[1:-1, 1:-1] - un[1:-1, 0:-2])
            - vn[1:-1, 1:-1] * dt / dy * (un[1:-1, 1:-1] - un[0:-2, 1:-1])
            - dt / (2 * rho * dx) * (p[1:-1, 2:] - p[1:-1, 0:-2])
            + nu * (dt / dx ** 2 * (un[1:-1, 2:] - 2 * un[1:-1, 1:-1] + un[1:-1, 0:-2])
                    + dt / dy ** 2 * (un[2:, 1:-1] - 2 * un[1:-1, 1:-1] + un[0:-2, 1:-1])))
        v = vn.at[1:-1, 1:-1].set(
            vn[1:-1, 1:-1] - un[1:-1, 1:-1] * dt / dx * (vn[1:-1, 1:-1] - vn[1:-1, 0:-2])
            - vn[1:-1, 1:-1] * dt / dy * (vn[1:-1, 1:-1] - vn[0:-2, 1:-1])
            - dt / (2 * rho * dy) * (p[2:, 1:-1] - p[0:-2, 1:-1])
            + nu * (dt / dx ** 2 * (vn[1:-1, 2:] - 2 * vn[1:-1, 1:-1] + vn[1:-1, 0:-2])
                    + dt / dy ** 2 * (vn[2:, 1:-1] - 2 * vn[1:-1, 1:-1] + vn[0:-2, 1:-1])))
        u = u.at[0, :].set(0.0).at[:, 0].set(0.0).at[:, -1].set(0.0).at[-1, :].set(1.0)
        v = v.at[0, :].set(0.0).at[-1, :].set(0.0).at[:, 0].set(0.0).at[:, -1].set(0.0)
        return u, v, p, b

    u, v, _, _ = lax.fori_loop(0, T, step, (u, v, p, jnp.zeros_like(u)))
    return _wsum(u, ct_u) + _wsum(v, ct_v)


def hdiff(in_field, coeff, ct_res, **_):
    i, j = coeff.shape[0], coeff.shape[1]
    f = in_field
    lap = 4.0 * f[1:i + 3, 1:j + 3] - (f[2:i + 4, 1:j + 3] + f[0:i + 2, 1:j + 3] + f[1:i + 3, 2:j + 4]
                                       + f[1:i + 3, 0:j + 2])
    res1 = lap[1:, 1:j + 1] - lap[:i + 1, 1:j + 1]
    flx = jnp.where(res1 * (f[2:i + 3, 2:j + 2] - f[1:i + 2, 2:j + 2]) > 0, 0.0, res1)
    res2 = lap[1:i + 1, 1:] - lap[1:i + 1, :j + 1]
    fly = jnp.where(res2 * (f[2:i + 2, 2:j + 3] - f[2:i + 2, 1:j + 2]) > 0, 0.0, res2)
    out = f[2:i + 2, 2:j + 2] - coeff * (flx[1:] - flx[:-1] + fly[:, 1:] - fly[:, :-1])
    return _wsum(out, ct_res)


def vadv(utens_stage, u_stage, wcon, u_pos, utens, ct_res, **_):
    """Thomas solve along K: the first level, a scan over the interior levels, the last level, then the back
    substitution as a reverse scan; every level vectorised over I and J."""
    dtr = nb.DTR_STAGE
    bm, bp = nb.BET_M, nb.BET_P
    kk = u_stage.shape[2]
    w, us, up, ut, uts = (jnp.moveaxis(x, 2, 0) for x in (wcon, u_stage, u_pos, utens, utens_stage))

    gcv = 0.25 * (w[1][1:] + w[1][:-1])
    c0 = gcv * bp
    d0 = dtr * up[0] + ut[0] + uts[0] - gcv * bm * (us[1] - us[0])
    div = 1.0 / (dtr - c0)
    c0, d0 = c0 * div, d0 * div

    def interior(carry, lv):
        c_prev, d_prev = carry
        w_k, w_next, us_prev, us_k, us_next, up_k, ut_k, uts_k = lv
        gav = -0.25 * (w_k[1:] + w_k[:-1])
        gcv = 0.25 * (w_next[1:] + w_next[:-1])
        acol, ccol = gav * bp, gcv * bp
        corr = -gav * bm * (us_prev - us_k) - gcv * bm * (us_next - us_k)
        d = dtr * up_k + ut_k + uts_k + corr
        div = 1.0 / (dtr - acol - ccol - c_prev * acol)
        c, d = ccol * div, (d - d_prev * acol) * div
        return (c, d), (c, d)

    levels = (w[1:kk - 1], w[2:kk], us[0:kk - 2], us[1:kk - 1], us[2:kk], up[1:kk - 1], ut[1:kk - 1],
              uts[1:kk - 1])
    (c_prev, d_prev), (cs, ds) = lax.scan(interior, (c0, d0), levels)
    last = kk - 1
    gav = -0.25 * (w[last][1:] + w[last][:-1])
    acol = gav * bp
    d = dtr * up[last] + ut[last] + uts[last] - gav * bm * (us[last - 1] - us[last])
    d_last = (d - d_prev * acol) / (dtr - acol - c_prev * acol)
    ccol = jnp.concatenate([c0[None], cs])  # levels 0..K-2
    dcol = jnp.concatenate([d0[None], ds])  # levels 0..K-2; level K-1 is d_last

    def back(data, lv):
        c, dc, upk = lv
        data = dc - c * data
        return data, dtr * (data - upk)

    _, out = lax.scan(back, d_last, (ccol, dcol, up[:last]), reverse=True)
    out = jnp.concatenate([out, (dtr * (d_last - up[last]))[None]])
    return _wsum(jnp.moveaxis(out, 0, 2), ct_res)


KERNELS: dict[str, JaxKernel] = {f"nb_{fn.__name__}": JaxKernel(fn) for fn in (
    atax, bicg, gemm, gemver, gesummv, k2mm, k3mm, mvt, doitgen, go_fast, cholesky, lu, ludcmp, trisolv,
    durbin, gramschmidt, symm, syr2k, syrk, trmm, covariance, correlation, jacobi_1d, jacobi_2d, heat_3d,
    seidel_2d, fdtd_2d, adi, deriche, cavity_flow, hdiff, vadv)}
