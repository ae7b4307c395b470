"""gradflow's GradBench tool (`benchmarks/gradbench/tool.py`), spoken to through its protocol in a child
process as GradBench's driver would, on small inputs: outputs against independent numpy/scipy references
(densities from `scipy.stats` for gmm, a plain Runge-Kutta loop for ode) and gradients against their
central differences. And the relay's comparison of outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks.gradbench.run import compare

TOOL = Path(__file__).resolve().parents[2] / "benchmarks" / "gradbench" / "tool.py"


@pytest.fixture(scope="module")
def tool():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, str(TOOL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1, env=env)
    ids = iter(range(10**6))

    def ask(**message):
        message = {"id": next(ids)} | message
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == message["id"]
        return answer

    assert ask(kind="start")["tool"] == "gradflow"
    yield ask
    proc.stdin.close()
    proc.wait(timeout=60)


def _evaluate(tool, module: str, function: str, input) -> object:
    answer = tool(kind="evaluate", module=module, function=function, input=input)
    assert answer["success"], answer.get("error")
    assert [t["name"] for t in answer["timings"]][:3] == ["prepare", "warmup", "evaluate"]
    return answer["output"]


def _central(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        grad.flat[i] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


def test_define_names_what_the_tool_lacks(tool) -> None:
    assert tool(kind="define", module="lse")["success"]
    answer = tool(kind="define", module="det")
    assert not answer["success"] and "no programs for eval 'det'" in answer["error"]


def test_hello_and_lse(tool) -> None:
    assert _evaluate(tool, "hello", "square", 3.0) == 9.0
    assert _evaluate(tool, "hello", "double", 3.0) == 6.0
    x = np.random.default_rng(1).uniform(-3, 3, 37)
    runs = {"min_runs": 2, "min_seconds": 0}
    assert np.isclose(_evaluate(tool, "lse", "primal", {"x": x.tolist()} | runs), np.log(np.sum(np.exp(x))),
                      rtol=1e-14)
    softmax = np.exp(x) / np.sum(np.exp(x))
    np.testing.assert_allclose(_evaluate(tool, "lse", "gradient", {"x": x.tolist()} | runs), softmax, rtol=1e-12)


def _llsq(x: np.ndarray, n: int) -> float:
    total = 0.0
    for i in range(n):
        t = -1.0 + 2.0 * i / (n - 1)
        total += (np.sign(t) - sum(x[j] * t**j for j in range(x.size))) ** 2
    return total / 2


def test_llsq(tool) -> None:
    x, n = np.random.default_rng(2).uniform(-1, 1, 6), 9
    given = {"x": x.tolist(), "n": n, "min_runs": 1, "min_seconds": 0}
    assert np.isclose(_evaluate(tool, "llsq", "primal", given), _llsq(x, n), rtol=1e-12)
    np.testing.assert_allclose(_evaluate(tool, "llsq", "gradient", given), _central(lambda v: _llsq(v, n), x),
                               rtol=1e-6)


def _ode(x: np.ndarray, steps: int) -> np.ndarray:
    def rate(y):
        return np.concatenate([x[:1], x[1:] * y[:-1]])

    y, h = np.zeros_like(x), 2.0 / steps
    for _ in range(steps):
        k1 = rate(y)
        k2 = rate(y + h / 2 * k1)
        k3 = rate(y + h / 2 * k2)
        k4 = rate(y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


def test_ode(tool) -> None:
    x, steps = np.random.default_rng(3).uniform(0, 1, 7), 5
    given = {"x": x.tolist(), "s": steps, "min_runs": 1, "min_seconds": 0}
    np.testing.assert_allclose(_evaluate(tool, "ode", "primal", given), _ode(x, steps), rtol=1e-13)

    def last(v, steps=steps):
        return _ode(v, steps)[-1]
    np.testing.assert_allclose(_evaluate(tool, "ode", "gradient", given), _central(last, x), rtol=1e-6, atol=1e-10)


def _log_posterior(d, k, x, m, gamma, alpha, mu, q, l) -> float:
    """log(prod_i sum_k phi_k N(x_i; mu_k, (Q_k^T Q_k)^-1)) + sum_k log Wishart(Q_k^T Q_k; d + m + 1, I / gamma^2),
    from scipy's densities (the eval's README definition)."""
    phi = np.exp(alpha) / np.sum(np.exp(alpha))
    rows, cols = np.tril_indices(d, -1)
    order = np.lexsort((rows, cols))  # l fills L column by column
    total = 0.0
    precisions = []
    for c in range(k):
        Q = np.diag(np.exp(q[c]))
        Q[rows[order], cols[order]] = l[c]
        precisions.append(Q.T @ Q)
    for xi in x:
        total += np.log(sum(phi[c] * stats.multivariate_normal.pdf(xi, mu[c], np.linalg.inv(precisions[c]))
                            for c in range(k)))
    for c in range(k):
        total += stats.wishart.logpdf(precisions[c], df=d + m + 1, scale=np.eye(d) / gamma**2)
    return total


def test_gmm(tool) -> None:
    rng = np.random.default_rng(4)
    d, k, n, m, gamma = 3, 2, 5, 1, 1.3
    params = {"alpha": rng.normal(size=k), "mu": rng.uniform(size=(k, d)), "q": 0.3 * rng.normal(size=(k, d)),
              "l": 0.3 * rng.normal(size=(k, d * (d - 1) // 2))}
    x = rng.normal(size=(n, d))
    given = {"d": d, "k": k, "n": n, "x": x.tolist(), "m": m, "gamma": gamma, "min_runs": 1, "min_seconds": 0} | {
        name: value.tolist() for name, value in params.items()}

    def objective(**changed):
        return _log_posterior(d, k, x, m, gamma, **(params | changed))

    assert np.isclose(_evaluate(tool, "gmm", "objective", given), objective(), rtol=1e-12)
    jacobian = _evaluate(tool, "gmm", "jacobian", given)
    assert sorted(jacobian) == ["alpha", "l", "mu", "q"]
    for name, value in params.items():
        want = _central(lambda v, name=name: objective(**{name: v}), value)
        np.testing.assert_allclose(np.array(jacobian[name]), want, rtol=1e-6, atol=1e-8, err_msg=name)


def test_relay_compares_relatively_and_at_the_output_scale() -> None:
    assert compare([1.0, 2e-3], [1.0 + 1e-12, 2e-3 * (1 + 1e-12)], 1e-8)[0]
    assert not compare([1.0, 2e-3], [1.0, 2.0000001e-3], 1e-8)[0]  # relative, not absolute below 1
    assert compare([5.0, 1e-20], [5.0, -3e-19], 1e-8)[0]  # rounding-level values far below the scale
    assert not compare({"a": [1.0]}, {"a": [1.0, 2.0]}, 1e-8)[0]
    assert not compare({"a": [1.0]}, {"b": [1.0]}, 1e-8)[0]


def _lstm(main_params, extra_params, state, sequence) -> float:
    """ADBench's LSTM objective, element by element as its C++ reference computes it."""
    def sigmoid(v):
        return 1.0 / (1.0 + np.exp(-v))

    layers, b = main_params.shape[0] // 2, sequence.shape[1]
    hidden, cell = state[0::2].copy(), state[1::2].copy()
    total = 0.0
    for t in range(sequence.shape[0] - 1):
        layer_input = sequence[t] * extra_params[0]
        for k in range(layers):
            weight, bias = main_params[2 * k], main_params[2 * k + 1]
            for j in range(b):
                forget = sigmoid(layer_input[j] * weight[j] + bias[j])
                ingate = sigmoid(hidden[k, j] * weight[b + j] + bias[b + j])
                outgate = sigmoid(layer_input[j] * weight[2 * b + j] + bias[2 * b + j])
                change = np.tanh(hidden[k, j] * weight[3 * b + j] + bias[3 * b + j])
                cell[k, j] = cell[k, j] * forget + ingate * change
                hidden[k, j] = outgate * np.tanh(cell[k, j])
            layer_input = hidden[k]
        y = layer_input * extra_params[1] + extra_params[2]
        total += np.sum(sequence[t + 1] * (y - np.log(np.sum(np.exp(y)) + 2)))
    return -total / ((sequence.shape[0] - 1) * b)


def test_lstm(tool) -> None:
    rng = np.random.default_rng(5)
    layers, chars, bits = 2, 6, 3
    arrays = {"main_params": rng.random((2 * layers, 4 * bits)), "extra_params": rng.random((3, bits)),
              "state": rng.random((2 * layers, bits)),
              "sequence": rng.integers(0, 2, (chars, bits)).astype(np.float64)}
    given = {name: value.tolist() for name, value in arrays.items()} | {"min_runs": 1, "min_seconds": 0}
    assert np.isclose(_evaluate(tool, "lstm", "objective", given), _lstm(**arrays), rtol=1e-12)
    main = _central(lambda v: _lstm(**(arrays | {"main_params": v})), arrays["main_params"])
    extra = _central(lambda v: _lstm(**(arrays | {"extra_params": v})), arrays["extra_params"])
    np.testing.assert_allclose(_evaluate(tool, "lstm", "jacobian", given),
                               np.concatenate([main.ravel(), extra.ravel()]), rtol=1e-6, atol=1e-9)


def _ba_errors(cams, X, w, feats, obs):
    """ADBench's reprojection and weight errors, observation by observation (its Python reference)."""
    reproj, werr = np.zeros((len(w), 2)), 1.0 - w * w
    for j, (c, p) in enumerate(obs):
        cam, d = cams[c], X[p] - cams[c, 3:6]
        rot = cam[0:3]
        sqtheta = rot @ rot
        if sqtheta != 0:
            theta = np.sqrt(sqtheta)
            u = rot / theta
            q = d * np.cos(theta) + np.cross(u, d) * np.sin(theta) + u * (u @ d) * (1 - np.cos(theta))
        else:
            q = d + np.cross(rot, d)
        proj = q[:2] / q[2]
        rsq = proj @ proj
        reproj[j] = w[j] * (proj * (1 + cam[9] * rsq + cam[10] * rsq * rsq) * cam[6] + cam[7:9] - feats[j])
    return reproj, werr


def test_ba(tool) -> None:
    given = {"n": 2, "m": 3, "p": 5, "cam": [0.3, -0.2, 0.4, 1.0, -2.0, -9.0, 400.0, 5.0, -8.0, 0.08, 0.003],
             "x": [0.7, 0.1, 3.0], "w": 0.8, "feat": [270.0, 830.0], "min_runs": 1, "min_seconds": 0}
    n, m, p = 2, 3, 5
    cams, X = np.tile(given["cam"], (n, 1)), np.tile(given["x"], (m, 1))
    w, feats = np.full(p, given["w"]), np.tile(given["feat"], (p, 1))
    obs = np.stack([np.arange(p) % n, np.arange(p) % m], axis=1)
    reproj, werr = _ba_errors(cams, X, w, feats, obs)
    objective = _evaluate(tool, "ba", "objective", given)
    np.testing.assert_allclose(objective["reproj_error"]["elements"], reproj[0], rtol=1e-12)
    assert objective["reproj_error"]["repeated"] == p and objective["w_err"]["repeated"] == p
    assert np.isclose(objective["w_err"]["element"], werr[0], rtol=1e-14)
    # the whole sparse Jacobian, by columns of central differences, in GradBench's order: per observation two
    # rows (camera, point, weight columns), then one row per weight error; the eval gets entries 0-29 and the last
    flat = np.concatenate([cams.ravel(), X.ravel(), w])
    sizes = (cams.size, X.size)

    def errors(v):
        r, e = _ba_errors(v[:sizes[0]].reshape(n, 11), v[sizes[0]:sum(sizes)].reshape(m, 3), v[sum(sizes):], feats,
                          obs)
        return np.concatenate([r.ravel(), e])

    dense = np.stack([(errors(flat + h) - errors(flat - h)) / 2e-6 for h in np.eye(flat.size) * 1e-6], axis=1)
    rows, cols = [0], []
    for j, (c, q) in enumerate(obs):
        columns = [11 * c + k for k in range(11)] + [11 * n + 3 * q + k for k in range(3)] + [11 * n + 3 * m + j]
        for _ in range(2):
            cols += columns
            rows.append(rows[-1] + 15)
    for j in range(p):
        cols.append(11 * n + 3 * m + j)
        rows.append(rows[-1] + 1)
    row_of = [2 * j + r for j in range(p) for r in range(2) for _ in range(15)] + [2 * p + j for j in range(p)]
    vals = dense[row_of, cols]
    jacobian = _evaluate(tool, "ba", "jacobian", given)
    assert jacobian["rows"] == rows[:30] + [rows[-1]] and jacobian["cols"] == cols[:30] + [cols[-1]]
    np.testing.assert_allclose(jacobian["vals"], list(vals[:30]) + [vals[-1]], rtol=1e-6, atol=1e-6)
    # and every entry, from the tool's function in this process (the protocol carries 31 of them)
    from benchmarks.gradbench.programs import ba

    call, _ = ba.FUNCTIONS["jacobian"].prepare(given)
    all_rows, all_cols, all_vals = call()
    assert list(all_rows) == rows and list(all_cols) == cols
    np.testing.assert_allclose(all_vals, vals, rtol=1e-6, atol=1e-6)


_PARENTS = [-1, 0, 1, 2, 3, 0, 5, 6, 7, 0, 9, 10, 11, 0, 13, 14, 15, 0, 17, 18, 19, 0]  # ADBench's hand


def _rotation(axis: int, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    i, j = [(1, 2), (2, 0), (0, 1)][axis]
    r = np.eye(3)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def _hand_vertices(theta, model) -> np.ndarray:
    """ADBench's hand model, step by step: per-bone Euler rotations (x, then y, then z, the angles stored
    x, z, y) from theta's finger layout, absolute transforms down the bone tree, linear blend skinning,
    then Rodrigues' rotation by theta[0:3] and the translation theta[3:6]."""
    bones = len(_PARENTS)
    angles = np.zeros((bones, 3))
    for f in range(5):
        angles[2 + 4 * f, :2] = theta[6 + 4 * f:8 + 4 * f]
        angles[3 + 4 * f, 0], angles[4 + 4 * f, 0] = theta[8 + 4 * f], theta[9 + 4 * f]
    absolutes = []
    for b, parent in enumerate(_PARENTS):
        posed = np.eye(4)
        posed[:3, :3] = _rotation(2, angles[b, 1]) @ _rotation(1, -angles[b, 2]) @ _rotation(0, angles[b, 0])
        relative = model["base_relatives"][b] @ posed
        absolutes.append(relative if parent < 0 else absolutes[parent] @ relative)
    skinned = np.zeros((model["base_positions"].shape[0], 3))
    for b in range(bones):
        moved = (absolutes[b] @ model["inverse_base_absolutes"][b] @ model["base_positions"].T).T[:, :3]
        skinned += model["weights"][:, b:b + 1] * moved
    angle = np.linalg.norm(theta[:3])
    k = theta[:3] / angle
    cross = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    rotation = np.cos(angle) * np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * np.outer(k, k)
    return skinned @ rotation.T + theta[3:6]


def _hand_errors(theta, us, model, correspondences, points) -> np.ndarray:
    v = _hand_vertices(theta, model)
    if us is None:
        return (points - v[correspondences]).ravel()
    t = model["triangles"][correspondences]
    return (points - (us[:, :1] * v[t[:, 0]] + us[:, 1:] * v[t[:, 1]] + (1 - us.sum(1, keepdims=True)) * v[t[:, 2]])
            ).ravel()


@pytest.mark.parametrize("variant", ["simple", "complicated"])
def test_ht(tool, variant) -> None:
    rng = np.random.default_rng(7)
    bones, count, vertices = len(_PARENTS), 5, 12
    model = {"base_relatives": rng.uniform(-1, 1, (bones, 4, 4)),
             "inverse_base_absolutes": rng.uniform(-1, 1, (bones, 4, 4)),
             "base_positions": np.concatenate([rng.uniform(-1, 1, (vertices, 3)), np.ones((vertices, 1))], axis=1),
             "weights": rng.dirichlet(np.ones(bones), vertices), "triangles": rng.integers(0, vertices, (7, 3))}
    for name in ("base_relatives", "inverse_base_absolutes"):
        model[name][:, 3] = [0, 0, 0, 1]
    correspondences = rng.integers(0, 7 if variant == "complicated" else vertices, count)
    points, theta = rng.uniform(-1, 1, (count, 3)), rng.uniform(-0.8, 0.8, 26)
    us = rng.uniform(0, 0.5, (count, 2)) if variant == "complicated" else None
    given = {"theta": theta.tolist(), "us": [] if us is None else us.tolist(), "min_runs": 1, "min_seconds": 0,
             "data": {"correspondences": correspondences.tolist(), "points": points.tolist(),
                      "model": {"bone_count": bones, "parents": _PARENTS, "is_mirrored": False,
                                **{k: v.tolist() for k, v in model.items()}}}}
    want = _hand_errors(theta, us, model, correspondences, points)
    np.testing.assert_allclose(_evaluate(tool, "ht", "objective", given), want, rtol=1e-12, atol=1e-14)
    # the Jacobian: us's two columns (point i's rows against us[i, 0] and us[i, 1]), then theta's 26
    columns = []
    if us is not None:
        for k in range(2):
            step = np.zeros_like(us)
            step[:, k] = 1e-6
            columns.append((_hand_errors(theta, us + step, model, correspondences, points)
                            - _hand_errors(theta, us - step, model, correspondences, points)) / 2e-6)
    columns += [(_hand_errors(theta + h, us, model, correspondences, points)
                 - _hand_errors(theta - h, us, model, correspondences, points)) / 2e-6 for h in np.eye(26) * 1e-6]
    jacobian = np.array(_evaluate(tool, "ht", "jacobian", given))
    assert jacobian.shape == (3 * count, 26 + (us is not None) * 2)
    np.testing.assert_allclose(jacobian, np.stack(columns, axis=1), rtol=1e-6, atol=1e-7)


def test_kmeans(tool) -> None:
    rng = np.random.default_rng(6)
    points = rng.random((40, 3))
    centroids = points[-4:].copy()  # as the eval draws them: every centroid has a point of its own
    given = {"points": points.tolist(), "centroids": centroids.tolist(), "min_runs": 1, "min_seconds": 0}
    nearest = np.argmin(((points[:, None, :] - centroids[None, :, :]) ** 2).sum(-1), axis=1)
    cost = sum(((points[nearest == j] - centroids[j]) ** 2).sum() for j in range(4))
    assert np.isclose(_evaluate(tool, "kmeans", "cost", given), cost, rtol=1e-12)
    # J / diag(H) in closed form: 2 sum_i (c_j - p_i) over 2 n_j, each centroid minus its points' mean
    want = np.stack([centroids[j] - points[nearest == j].mean(axis=0) for j in range(4)])
    np.testing.assert_allclose(_evaluate(tool, "kmeans", "dir", given), want, rtol=1e-12, atol=1e-14)
