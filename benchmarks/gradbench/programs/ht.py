"""ht: ADBench's hand tracking: a hand model of 22 bones posed by 26 angles (`theta`), its 10,000 vertices
skinned (each a weighted blend of its bones' transforms), moved by a global rotation and translation; the
objective is, per observed point, the point minus its vertex ("simple") or minus a point of its triangle
at barycentric coordinates `us` ("complicated"); and the Jacobian of that with respect to theta (and us).

The program follows the model's steps as numpy code: the per-bone rotations from Euler angles in a map,
the bones' absolute transforms in a loop over the bones (each bone after its parent, read through the
`parents` index array), the blend as one matrix product of the weights with the flattened transforms,
then a map over the points. The Jacobian is forward mode's: 26 `jvp` calls, one per angle, and in the
complicated case two more for `us`: point i's error depends on us[i] alone, so seeding column k of
every row of `us` gives the k-th column of every point's 3 x 2 block at once (GradBench's layout: those
two columns first, then the 26 of theta).
"""

from __future__ import annotations

import dace
import numpy as np

from . import Function

B, V, C, T = dace.symbol("B"), dace.symbol("V"), dace.symbol("C"), dace.symbol("T")
THETA = 26  # global rotation (3), global translation (3), then 4 per finger for 5 fingers


@dace.program
def vertices(theta: dace.float64[26], base_relatives: dace.float64[B, 4, 4],
             inverse_base_absolutes: dace.float64[B, 4, 4], base_positions: dace.float64[V, 4],
             weights: dace.float64[V, B], parents: dace.int64[B], mirror: dace.float64[1],
             posed: dace.float64[V, 3]):
    # the bones' rotations (angles about x, z, y), a bone's row of `pose` from theta's finger layout
    pose = np.zeros((B, 3))
    for f in range(5):
        pose[2 + 4 * f, 0] = theta[6 + 4 * f]
        pose[2 + 4 * f, 1] = theta[7 + 4 * f]
        pose[3 + 4 * f, 0] = theta[8 + 4 * f]
        pose[4 + 4 * f, 0] = theta[9 + 4 * f]
    rotations = np.zeros((B, 4, 4))
    for b in dace.map[0:B]:
        cx = np.cos(pose[b, 0])
        sx = np.sin(pose[b, 0])
        cz = np.cos(pose[b, 1])
        sz = np.sin(pose[b, 1])
        cy = np.cos(pose[b, 2])
        sy = np.sin(pose[b, 2])
        # Rz @ Ry @ Rx
        rotations[b, 0, 0] = cz * cy
        rotations[b, 0, 1] = -sz * cx - cz * sy * sx
        rotations[b, 0, 2] = sz * sx - cz * sy * cx
        rotations[b, 1, 0] = sz * cy
        rotations[b, 1, 1] = cz * cx - sz * sy * sx
        rotations[b, 1, 2] = -cz * sx - sz * sy * cx
        rotations[b, 2, 0] = sy
        rotations[b, 2, 1] = cy * sx
        rotations[b, 2, 2] = cy * cx
        rotations[b, 3, 3] = 1.0
    relatives = np.zeros((B, 4, 4))
    for b in range(B):
        relatives[b] = base_relatives[b] @ rotations[b]
    absolutes = np.zeros((B, 4, 4))
    for b in range(B):
        p = parents[b]
        if p < 0:
            absolutes[b] = relatives[b]
        else:
            absolutes[b] = absolutes[p] @ relatives[b]
    transforms = np.zeros((B, 16))
    for b in range(B):
        transforms[b] = np.reshape(absolutes[b] @ inverse_base_absolutes[b], (16,))
    blend = weights @ transforms  # (V, 16): each vertex's blended transform, row-major 4 x 4
    skinned = np.zeros((V, 3))
    for v, r in dace.map[0:V, 0:3]:
        skinned[v, r] = (blend[v, 4 * r] * base_positions[v, 0] + blend[v, 4 * r + 1] * base_positions[v, 1]
                         + blend[v, 4 * r + 2] * base_positions[v, 2] + blend[v, 4 * r + 3] * base_positions[v, 3])
    skinned[:, 0] = skinned[:, 0] * mirror[0]
    # the global rotation (angle-axis theta[0:3]; the identity near zero) and translation theta[3:6]
    G = np.zeros((3, 3))
    sq = theta[0] * theta[0] + theta[1] * theta[1] + theta[2] * theta[2]
    if sq < 1e-8:
        G[0, 0] = 1.0
        G[1, 1] = 1.0
        G[2, 2] = 1.0
    else:
        n = np.sqrt(sq)
        x = theta[0] / n
        y = theta[1] / n
        z = theta[2] / n
        s = np.sin(n)
        c = np.cos(n)
        G[0, 0] = x * x + (1.0 - x * x) * c
        G[0, 1] = x * y * (1.0 - c) - z * s
        G[0, 2] = x * z * (1.0 - c) + y * s
        G[1, 0] = x * y * (1.0 - c) + z * s
        G[1, 1] = y * y + (1.0 - y * y) * c
        G[1, 2] = y * z * (1.0 - c) - x * s
        G[2, 0] = x * z * (1.0 - c) - y * s
        G[2, 1] = z * y * (1.0 - c) + x * s
        G[2, 2] = z * z + (1.0 - z * z) * c
    posed[:] = skinned @ np.transpose(G) + theta[3:6]


@dace.program
def ht_simple(theta: dace.float64[26], base_relatives: dace.float64[B, 4, 4],
           inverse_base_absolutes: dace.float64[B, 4, 4], base_positions: dace.float64[V, 4],
           weights: dace.float64[V, B], parents: dace.int64[B], mirror: dace.float64[1],
           correspondences: dace.int64[C], points: dace.float64[C, 3], err: dace.float64[C, 3]):
    posed = np.zeros((V, 3))
    vertices(theta, base_relatives, inverse_base_absolutes, base_positions, weights, parents, mirror, posed)
    for i, d in dace.map[0:C, 0:3]:
        err[i, d] = points[i, d] - posed[correspondences[i], d]


@dace.program
def ht_complicated(theta: dace.float64[26], us: dace.float64[C, 2], base_relatives: dace.float64[B, 4, 4],
                inverse_base_absolutes: dace.float64[B, 4, 4], base_positions: dace.float64[V, 4],
                weights: dace.float64[V, B], parents: dace.int64[B], mirror: dace.float64[1],
                triangles: dace.int64[T, 3], correspondences: dace.int64[C], points: dace.float64[C, 3],
                err: dace.float64[C, 3]):
    posed = np.zeros((V, 3))
    vertices(theta, base_relatives, inverse_base_absolutes, base_positions, weights, parents, mirror, posed)
    for i, d in dace.map[0:C, 0:3]:
        t = correspondences[i]
        err[i, d] = points[i, d] - (us[i, 0] * posed[triangles[t, 0], d] + us[i, 1] * posed[triangles[t, 1], d]
                                    + (1.0 - us[i, 0] - us[i, 1]) * posed[triangles[t, 2], d])


def _inputs(input) -> tuple[dict, bool]:
    """The program's arguments from the eval's input, and whether it is the complicated variant (with
    `us`). `is_mirrored` flips the x coordinate of the skinned vertices (ADBench's C++ reference; the
    eval's data never sets it)."""
    data, model = input["data"], input["data"]["model"]
    arguments = {
        "theta": np.array(input["theta"], dtype=np.float64),
        "base_relatives": np.array(model["base_relatives"], dtype=np.float64),
        "inverse_base_absolutes": np.array(model["inverse_base_absolutes"], dtype=np.float64),
        "base_positions": np.array(model["base_positions"], dtype=np.float64),
        "weights": np.array(model["weights"], dtype=np.float64),
        "parents": np.array(model["parents"], dtype=np.int64),
        "mirror": np.array([-1.0 if model["is_mirrored"] else 1.0]),
        "correspondences": np.array(data["correspondences"], dtype=np.int64),
        "points": np.array(data["points"], dtype=np.float64),
    }
    if arguments["theta"].shape != (THETA,):
        raise ValueError(f"ht: theta has {arguments['theta'].size} angles; the hand model takes {THETA}")
    complicated = len(input["us"]) > 0
    if complicated:
        arguments["us"] = np.array(input["us"], dtype=np.float64).reshape(-1, 2)
        arguments["triangles"] = np.array(model["triangles"], dtype=np.int64)
    return arguments, complicated


_built: dict = {}


def _program(complicated: bool, kind: str):
    """The optimized forward (`Runner`) or `value_and_jvp` of one variant, built once."""
    key = (complicated, kind)
    if key not in _built:
        import gradflow
        from gradflow.api import optimized
        from gradflow.runtime import Runner

        program = ht_complicated if complicated else ht_simple
        if kind == "forward":
            _built[key] = Runner(optimized(gradflow.Graph.of(program), True))
        else:
            _built[key] = gradflow.value_and_jvp(program, wrt=["theta", "us"] if complicated else "theta", of="err")
    return _built[key]


def _objective(input):
    arguments, complicated = _inputs(input)
    forward = _program(complicated, "forward")
    err = np.zeros((arguments["points"].shape[0], 3))

    def call():
        forward(**arguments, err=err)
        return err

    return call, lambda e: e.reshape(-1).tolist()


def _jacobian(input):
    arguments, complicated = _inputs(input)
    jvp = _program(complicated, "jvp")
    count = arguments["points"].shape[0]
    err = np.zeros((count, 3))
    seeds = []  # (the tangents of theta and us) per column: us's two (compressed), then theta's
    zero_theta = np.zeros(THETA)
    if complicated:
        zero_us = np.zeros((count, 2))
        for k in range(2):
            seed = np.zeros((count, 2))
            seed[:, k] = 1.0
            seeds.append({"tan_theta": zero_theta, "tan_us": seed})
    for k in range(THETA):
        seed = {"tan_theta": np.eye(THETA)[k]}
        seeds.append(seed | ({"tan_us": zero_us} if complicated else {}))

    def call():
        jacobian = np.empty((3 * count, len(seeds)))
        for k, seed in enumerate(seeds):
            _, tangent = jvp(**arguments, **seed, err=err)
            jacobian[:, k] = tangent["err"].reshape(-1)
        return jacobian

    return call, lambda j: j.tolist()


FUNCTIONS = {"objective": Function(_objective), "jacobian": Function(_jacobian)}
