"""ba: ADBench's bundle adjustment: per observation, the reprojection error of a point seen by a camera
(Rodrigues rotation, radial distortion, focal length, principal point), weighted, and the weight's error
1 - w^2; and the sparse Jacobian of both with respect to the cameras, points and weights.

The program is one map over the observations, scalar code in its body as a DaCe user writes such a
kernel. The Jacobian is forward mode's: an observation's errors depend on one camera, one point and one
weight, so seeding parameter k of *every* camera (and likewise of every point, every weight) gives, in
one tangent of the errors, the k-th column of every observation's block (the Curtis-Powell-Reid
compression of a Jacobian with this structure): 15 `jvp` calls, whatever the numbers of cameras and points.
The blocks are laid out in GradBench's sparse format (`BASparseMat`: rows per observation, camera then
point then weight columns, then one row per weight error), of which the eval receives the first 30
entries and the last.
"""

from __future__ import annotations

import dace
import numpy as np

from . import Function

P, NC, NP = dace.symbol("P"), dace.symbol("NC"), dace.symbol("NP")
CAMERA, POINT = 11, 3  # parameters per camera (rotation, centre, focal, principal point, distortion), per point


@dace.program
def ba(cams: dace.float64[NC, 11], X: dace.float64[NP, 3], w: dace.float64[P], feats: dace.float64[P, 2],
       obs: dace.int64[P, 2], reproj_err: dace.float64[P, 2], w_err: dace.float64[P]):
    for j in dace.map[0:P]:
        c = obs[j, 0]
        p = obs[j, 1]
        rx = cams[c, 0]
        ry = cams[c, 1]
        rz = cams[c, 2]
        dx = X[p, 0] - cams[c, 3]
        dy = X[p, 1] - cams[c, 4]
        dz = X[p, 2] - cams[c, 5]
        sqtheta = rx * rx + ry * ry + rz * rz
        if sqtheta != 0.0:
            theta = np.sqrt(sqtheta)
            cos_t = np.cos(theta)
            sin_t = np.sin(theta)
            ux = rx / theta
            uy = ry / theta
            uz = rz / theta
            along = (ux * dx + uy * dy + uz * dz) * (1.0 - cos_t)
            qx = dx * cos_t + (uy * dz - uz * dy) * sin_t + ux * along
            qy = dy * cos_t + (uz * dx - ux * dz) * sin_t + uy * along
            qz = dz * cos_t + (ux * dy - uy * dx) * sin_t + uz * along
        else:
            qx = dx + (ry * dz - rz * dy)
            qy = dy + (rz * dx - rx * dz)
            qz = dz + (rx * dy - ry * dx)
        px = qx / qz
        py = qy / qz
        rsq = px * px + py * py
        distortion = 1.0 + cams[c, 9] * rsq + cams[c, 10] * rsq * rsq
        reproj_err[j, 0] = w[j] * (px * distortion * cams[c, 6] + cams[c, 7] - feats[j, 0])
        reproj_err[j, 1] = w[j] * (py * distortion * cams[c, 6] + cams[c, 8] - feats[j, 1])
        w_err[j] = 1.0 - w[j] * w[j]


def _inputs(input) -> dict:
    """The eval's input duplicated as its README asks: n cameras, m points, p observations of camera
    j mod n and point j mod m."""
    n, m, p = int(input["n"]), int(input["m"]), int(input["p"])
    j = np.arange(p)
    return {"cams": np.tile(np.array(input["cam"], dtype=np.float64), (n, 1)),
            "X": np.tile(np.array(input["x"], dtype=np.float64), (m, 1)),
            "w": np.full(p, float(input["w"])),
            "feats": np.tile(np.array(input["feat"], dtype=np.float64), (p, 1)),
            "obs": np.stack([j % n, j % m], axis=1).astype(np.int64)}


_built: dict = {}


def _programs():
    if not _built:
        import gradflow
        from gradflow.api import optimized
        from gradflow.runtime import Runner

        _built["forward"] = Runner(optimized(gradflow.Graph.of(ba), True))
        _built["jvp"] = gradflow.value_and_jvp(ba, wrt=["cams", "X", "w"], of=["reproj_err", "w_err"])
    return _built["forward"], _built["jvp"]


def _objective(input):
    forward, _ = _programs()
    a = _inputs(input)
    p = a["w"].size
    reproj, werr = np.zeros((p, 2)), np.zeros(p)

    def call():
        forward(**a, reproj_err=reproj, w_err=werr)
        return reproj, werr

    def post(result):
        r, e = result
        return {"reproj_error": {"elements": r[0].tolist(), "repeated": p}, "w_err": {"element": float(e[0]),
                                                                                    "repeated": p}}
    return call, post


def _jacobian(input):
    _, jvp = _programs()
    a = _inputs(input)
    n, m, p = a["cams"].shape[0], a["X"].shape[0], a["w"].size
    zeros = {"tan_cams": np.zeros_like(a["cams"]), "tan_X": np.zeros_like(a["X"]), "tan_w": np.zeros_like(a["w"])}
    seeds = []  # one direction per column of an observation's block
    for name, width in (("tan_cams", CAMERA), ("tan_X", POINT), ("tan_w", 1)):
        for k in range(width):
            seed = dict(zeros)
            seed[name] = np.zeros_like(zeros[name])
            if name == "tan_w":
                seed[name][:] = 1.0
            else:
                seed[name][:, k] = 1.0
            seeds.append(seed)
    outputs = {"reproj_err": np.zeros((p, 2)), "w_err": np.zeros(p)}

    def call():
        block = np.empty((p, 2, len(seeds)))  # d error[j, row] / d (column k of observation j's block)
        w_derivative = None
        for k, seed in enumerate(seeds):
            _, tangents = jvp(**a, **seed, **outputs)
            block[:, :, k] = tangents["reproj_err"]
            if k == len(seeds) - 1:
                w_derivative = tangents["w_err"]
        return _sparse(block, w_derivative, a["obs"], n, m)

    def post(matrix):
        rows, cols, vals = matrix
        return {name: [cast(v) for v in (list(values[:30]) + [values[-1]])]
                for name, values, cast in (("rows", rows, int), ("cols", cols, int), ("vals", vals, float))}
    return call, post


def _sparse(block: np.ndarray, w_derivative: np.ndarray, obs: np.ndarray, n: int, m: int):
    """GradBench's `BASparseMat` (compressed rows) of the reprojection blocks and the weight errors."""
    p, width = block.shape[0], block.shape[2]
    j = np.arange(p)
    columns = np.concatenate([CAMERA * obs[:, :1] + np.arange(CAMERA),
                              CAMERA * n + POINT * obs[:, 1:] + np.arange(POINT),
                              (CAMERA * n + POINT * m + j)[:, None]], axis=1)  # (p, width)
    cols = np.concatenate([np.repeat(columns[:, None, :], 2, axis=1).reshape(-1), CAMERA * n + POINT * m + j])
    vals = np.concatenate([block.reshape(-1), w_derivative])
    rows = np.concatenate([[0], width * np.arange(1, 2 * p + 1), 2 * p * width + np.arange(1, p + 1)])
    return rows, cols, vals


FUNCTIONS = {"objective": Function(_objective), "jacobian": Function(_jacobian)}
