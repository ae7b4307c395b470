"""kmeans: the k-means cost (the sum over points of the squared distance to the nearest centroid) and the
Newton direction `dir = J / diag(H)` of GradBench's eval: the gradient with respect to the centroids over
the diagonal of the Hessian (each centroid's coordinates only meet their own points, so H is diagonal and
H 1 is that diagonal: one Hessian-vector product, forward over reverse, whose program also yields the
gradient: `gradflow.grad_and_hvp`).

Written with numpy's all-pairs distances (|p|^2 + |c|^2 - 2 p.c, one matrix product) and `np.min` along
the centroids, as a numpy user writes it.
"""

from __future__ import annotations

import dace
import numpy as np

from . import Function, built, forward_call

N, K, D = dace.symbol("N"), dace.symbol("K"), dace.symbol("D")


@dace.program
def kmeans(points: dace.float64[N, D], centroids: dace.float64[K, D], S: dace.float64[1]):
    distances = (np.sum(points * points, axis=1)[:, None] + np.sum(centroids * centroids, axis=1)[None, :]
                 - 2.0 * (points @ np.transpose(centroids)))
    S[0] = np.sum(np.min(distances, axis=1))


_hvp: dict = {}


def _inputs(input) -> dict:
    return {name: np.array(input[name], dtype=np.float64) for name in ("points", "centroids")}


def _cost(input):
    forward, _ = built(kmeans, "centroids", "S")
    arguments, S = _inputs(input), np.zeros(1)
    return forward_call(forward, S, **arguments, S=S), lambda S: float(S[0])


def _dir(input):
    import gradflow

    if not _hvp:
        _hvp["f"] = gradflow.grad_and_hvp(kmeans, wrt="centroids", of="S")
    grad_and_hvp = _hvp["f"]
    arguments = _inputs(input)
    ones = np.ones_like(arguments["centroids"])

    def call():
        gradient, diagonal = grad_and_hvp(**arguments, S=np.zeros(1), tan_centroids=ones)
        return gradient["centroids"] / diagonal["centroids"]

    return call, lambda d: d.tolist()


FUNCTIONS = {"cost": Function(_cost), "dir": Function(_dir)}
