"""gradflow's convolution nodes (`gradflow/library/convolution.py`) and their C++ kernels
(`runtime/conv_kernels.h`) against torch.

- The kernels, compiled from the shim header into a small library and called on one and on two OpenMP
  threads in this process (images split over the team, per-thread partial weight gradients): forward,
  input gradient and weight gradient match `torch.nn.functional.conv2d` and `torch.nn.grad`, and the two
  gradients add into what their output held.
- Each node in an SDFG of its own, compiled with its `pure` expansion (map nests) and with the default one
  (the kernels, while a program compiles): both match torch (the gradient nodes' `pure` expansion is
  otherwise used only for operands the kernels cannot take).
The reverse rule of `Convolution` is checked with the other library rules (`tests/verify/test_library.py`,
cases `conv_*`). No skip without the scipy-openblas32 wheel: it is a declared dependency, so its absence
is a failure."""

from __future__ import annotations

import ctypes
from pathlib import Path

import dace
import numpy as np
import pytest
import torch

from gradflow.library.convolution import Convolution, ConvolutionGradInput, ConvolutionGradWeights, wire
from gradflow.runtime.compile import compile_sdfg
from tests.runtime.shim_probe import compile_probe


_SOURCE = r"""
#include "gradflow_cblas.h"
extern "C" {
void set_threads(int n) { omp_set_num_threads(n); }
#define EXPORT(T, SUFFIX)                                                                              \
    void forward_##SUFFIX(const long* d, const T* x, const T* w, T* y) {                               \
        gradflow_conv::forward(shape(d), x, w, y);                                                     \
    }                                                                                                  \
    void grad_input_##SUFFIX(const long* d, const T* dy, const T* w, T* dx) {                          \
        gradflow_conv::grad_input(shape(d), dy, w, dx);                                                \
    }                                                                                                  \
    void grad_weights_##SUFFIX(const long* d, const T* x, const T* dy, T* dw) {                        \
        gradflow_conv::grad_weights(shape(d), x, dy, dw);                                              \
    }
static gradflow_conv::Shape shape(const long* d) {
    return gradflow_conv::Shape{d[0], d[1], d[2], d[3], d[4],  d[5],  d[6],  d[7],
                                d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15]};
}
EXPORT(float, f)
EXPORT(double, d)
}
"""

#: (N, C, H, W, M, KH, KW, strides, dilations, layout[, pads]): x is (N, C, H, W) (NCHW; NHWC: x (N, H, W, C),
#: w (KH, KW, C, M)); pads: zeros (before rows, before columns, after rows, after columns), none if absent
CONFIGS = [
    (3, 2, 7, 8, 3, 3, 2, (2, 1), (1, 2), "NCHW"),   # strided, dilated, odd image count (uneven thread split)
    (4, 3, 6, 5, 2, 1, 1, (1, 1), (1, 1), "NCHW"),   # 1x1 stride 1: the image is its own unfolded matrix
    (2, 4, 5, 5, 5, 1, 1, (2, 2), (1, 1), "NCHW"),   # 1x1 strided: unfolded
    (1, 1, 6, 6, 2, 3, 3, (1, 1), (1, 1), "NCHW"),   # one image, one channel
    (5, 16, 10, 10, 16, 3, 3, (1, 1), (1, 1), "NCHW"),
    (3, 2, 7, 8, 3, 3, 2, (2, 1), (1, 2), "NHWC"),
    (4, 3, 6, 5, 2, 1, 1, (1, 1), (1, 1), "NHWC"),
    (2, 3, 9, 9, 16, 3, 3, (1, 1), (1, 1), "NHWC"),
    (2, 3, 9, 6, 4, 3, 2, (2, 1), (1, 1), "NHWC"),
    # padded: the kernels read zeros outside x and send its gradient nowhere
    (5, 16, 10, 10, 16, 3, 3, (1, 1), (1, 1), "NCHW", (1, 1, 1, 1)),  # a ResNet block's
    (3, 2, 7, 8, 3, 3, 2, (2, 1), (1, 2), "NCHW", (1, 2, 0, 1)),   # uneven, strided, dilated
    (2, 2, 4, 4, 3, 3, 3, (1, 1), (1, 1), "NCHW", (3, 3, 3, 2)),   # whole rows and columns of zeros
    (2, 3, 5, 5, 2, 1, 1, (1, 1), (1, 1), "NCHW", (1, 1, 1, 1)),   # 1x1 padded: not its own unfolding
    (2, 3, 9, 6, 4, 3, 2, (2, 1), (1, 1), "NHWC", (1, 0, 1, 2)),
]
#: NCHW -> layout permutations of x, w, y
_PERM = {"NCHW": ((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)), "NHWC": ((0, 2, 3, 1), (2, 3, 1, 0), (0, 2, 3, 1))}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    loaded = compile_probe(tmp_path_factory.mktemp("conv_kernels"), _SOURCE)
    yield loaded
    loaded.set_threads(1)


def _pads(config) -> tuple[int, int, int, int]:
    return config[10] if len(config) > 10 else (0, 0, 0, 0)


def _out_size(extent: int, k: int, s: int, d: int, pads: int = 0) -> int:
    return (extent + pads - d * (k - 1) - 1) // s + 1


def _outs(config) -> tuple[int, int]:
    N, C, H, W, M, KH, KW, st, dil, layout = config[:10]
    ph, pw, eh, ew = _pads(config)
    return _out_size(H, KH, st[0], dil[0], ph + eh), _out_size(W, KW, st[1], dil[1], pw + ew)


def _case(config, dtype, seed):
    """x, w, dy in the config's layout, and the kernel's shape argument."""
    N, C, H, W, M, KH, KW, st, dil, layout = config[:10]
    OH, OW = _outs(config)
    rng = np.random.default_rng(seed)
    px, pw, py = _PERM[layout]
    x = np.ascontiguousarray(rng.normal(size=(N, C, H, W)).transpose(px)).astype(dtype)
    w = np.ascontiguousarray(rng.normal(size=(M, C, KH, KW)).transpose(pw)).astype(dtype)
    dy = np.ascontiguousarray(rng.normal(size=(N, M, OH, OW)).transpose(py)).astype(dtype)
    dims = np.array([N, C, H, W, M, KH, KW, OH, OW, st[0], st[1], dil[0], dil[1], layout == "NHWC",
                     *_pads(config)[:2]], dtype=np.int64)
    return x, w, dy, dims


def _torch(x, w, dy, config):
    """y, the input gradient and the weight gradient (float64), in the config's layout: torch's on x
    zero-padded as the config says (torch's own padding is the same on both sides)."""
    st, dil, layout = config[7], config[8], config[9]
    ph, pw_, eh, ew = _pads(config)
    px, pw, py = (np.argsort(p) for p in _PERM[layout])  # layout -> NCHW
    tx = torch.nn.functional.pad(torch.from_numpy(x).double().permute(*px), (pw_, ew, ph, eh))
    tw = torch.from_numpy(w).double().permute(*pw)
    tdy = torch.from_numpy(dy).double().permute(*py)
    y = torch.nn.functional.conv2d(tx, tw, stride=st, dilation=dil)
    gx = torch.nn.grad.conv2d_input(tx.shape, tw, tdy, stride=st, dilation=dil)
    gx = gx[:, :, ph:gx.shape[2] - eh, pw_:gx.shape[3] - ew]
    gw = torch.nn.grad.conv2d_weight(tx, tw.shape, tdy, stride=st, dilation=dil)
    to = _PERM[layout]
    return y.permute(*to[2]).numpy(), gx.permute(*to[0]).numpy(), gw.permute(*to[1]).numpy()


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("config", CONFIGS,
                         ids=lambda c: "x".join(map(str, c[:7])) + f"_s{c[7][0]}{c[7][1]}d{c[8][0]}{c[8][1]}_{c[9]}"
                         + ("_p" + "".join(map(str, c[10])) if len(c) > 10 else ""))
def test_kernels_match_torch_and_add_into_gradients(kernels, config, dtype, threads):
    x, w, dy, dims = _case(config, dtype, seed=threads)
    want_y, want_gx, want_gw = _torch(x, w, dy, config)
    kernels.set_threads(threads)
    suffix = "f" if dtype == np.float32 else "d"
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    y = np.full(want_y.shape, np.nan, dtype=dtype)  # overwritten whole
    getattr(kernels, f"forward_{suffix}")(_ptr(dims), _ptr(x), _ptr(w), _ptr(y))
    old_gx = np.random.default_rng(9).normal(size=x.shape).astype(dtype)
    old_gw = np.random.default_rng(10).normal(size=w.shape).astype(dtype)
    gx, gw = old_gx.copy(), old_gw.copy()
    getattr(kernels, f"grad_input_{suffix}")(_ptr(dims), _ptr(dy), _ptr(w), _ptr(gx))
    getattr(kernels, f"grad_weights_{suffix}")(_ptr(dims), _ptr(x), _ptr(dy), _ptr(gw))
    for got, want in ((y, want_y), (gx - old_gx, want_gx), (gw - old_gw, want_gw)):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale * 10)


#: float32 convolutions and whether torch's convolution can compute them once it is loaded: NCHW, with an
#: output extent that torch's padding (the same zeros on both sides) gives (`torch_can` in conv_kernels.h)
ROUTES = [
    ((3, 16, 9, 9, 16, 3, 3, (1, 1), (1, 1), "NCHW"), True),
    ((2, 16, 11, 10, 32, 3, 3, (2, 2), (1, 1), "NCHW"), True),  # strided
    ((2, 32, 12, 12, 16, 3, 3, (1, 1), (2, 1), "NCHW"), True),  # dilated
    ((2, 16, 9, 9, 16, 1, 1, (1, 1), (1, 1), "NCHW"), True),  # 1x1
    ((2, 3, 9, 9, 64, 3, 3, (1, 1), (1, 1), "NCHW"), True),  # a 3-channel stem
    ((3, 16, 9, 9, 16, 3, 3, (1, 1), (1, 1), "NCHW", (1, 1, 1, 1)), True),  # padded as torch pads
    ((2, 16, 11, 10, 32, 5, 3, (1, 1), (1, 1), "NCHW", (2, 0, 2, 0)), True),
    ((2, 8, 10, 10, 16, 3, 3, (2, 2), (1, 1), "NCHW", (1, 1, 0, 0)), True),  # a zero after that no window reads
    ((3, 16, 9, 9, 16, 3, 3, (1, 1), (1, 1), "NCHW", (1, 1, 0, 1)), False),  # one the last window reads
    ((2, 3, 9, 9, 16, 3, 3, (1, 1), (1, 1), "NHWC"), False),  # channels last
]
_ROUTE_IDS = ["x".join(map(str, c[:7])) + f"_s{c[7][0]}{c[7][1]}d{c[8][0]}{c[8][1]}_{c[9]}"
              + ("_p" + "".join(map(str, c[10])) if len(c) > 10 else "") for c, _ in ROUTES]


@pytest.fixture
def routes():
    """`gradflow.torch.convolution`, torch's convolution loaded (later tests in this process then also run
    through it, which the kernel test above accepts: same contract, same tolerance); its mode afterwards is
    GRADFLOW_CONV's again."""
    from gradflow.torch import convolution

    convolution.load()
    yield convolution
    convolution.set_mode(convolution.conv_choice())


def _all_three(kernels, config, seed: int):
    """The three kernels on one case; their results (y, what each gradient added) and torch's."""
    x, w, dy, dims = _case(config, np.float32, seed=seed)
    y = np.full(_torch(x, w, dy, config)[0].shape, np.nan, dtype=np.float32)  # overwritten whole
    old_gx = np.random.default_rng(seed + 9).normal(size=x.shape).astype(np.float32)
    old_gw = np.random.default_rng(seed + 10).normal(size=w.shape).astype(np.float32)
    gx, gw = old_gx.copy(), old_gw.copy()
    kernels.forward_f(_ptr(dims), _ptr(x), _ptr(w), _ptr(y))
    kernels.grad_input_f(_ptr(dims), _ptr(dy), _ptr(w), _ptr(gx))
    kernels.grad_weights_f(_ptr(dims), _ptr(x), _ptr(dy), _ptr(gw))
    return (y, gx - old_gx, gw - old_gw), _torch(x, w, dy, config), dims


def _assert_close(got, want) -> None:
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-5 * np.abs(r).max() * 10)


@pytest.mark.parametrize("config, can", ROUTES, ids=_ROUTE_IDS)
def test_torch_route_computes_what_torch_can_with_the_kernels_contract(kernels, routes, config, can):
    # GRADFLOW_CONV=torch: y overwritten, gradients added into, by torch wherever it can
    routes.set_mode("torch")
    kernels.set_threads(1)
    before = routes.torch_calls()
    got, want, _ = _all_three(kernels, config, seed=3)
    assert routes.torch_calls() - before == (3 if can else 0)
    _assert_close(got, want)


@pytest.mark.parametrize("config, can", ROUTES, ids=_ROUTE_IDS)
def test_auto_route_times_both_at_the_first_call_then_keeps_one(kernels, routes, config, can):
    # GRADFLOW_CONV=auto: the first call of each kernel on a shape runs both routes on its output, restored
    # between them; what it leaves must still be one result (y), or one gradient added once
    routes.set_mode("auto")
    routes.forget_routes()
    kernels.set_threads(1)
    got, want, dims = _all_three(kernels, config, seed=5)
    _assert_close(got, want)
    key = [*dims[:13], *dims[14:16]]
    recorded = [r for r in routes.routes() if [r[k] for k in routes.SHAPE_FIELDS] == key]
    assert sorted(r["operation"] for r in recorded) == (sorted(routes.OPERATIONS) if can else [])
    assert all(r["threads"] == 1 for r in recorded)
    before = routes.torch_calls()
    got, want, _ = _all_three(kernels, config, seed=6)  # the recorded routes, no timing
    _assert_close(got, want)
    assert routes.torch_calls() - before == sum(r["torch"] for r in recorded)
    assert routes.routes() == recorded


def test_own_route_keeps_the_kernels(kernels, routes):
    routes.set_mode("own")
    kernels.set_threads(1)
    before = routes.torch_calls()
    got, want, _ = _all_three(kernels, ROUTES[0][0], seed=7)
    assert routes.torch_calls() == before
    _assert_close(got, want)


def test_an_unknown_route_is_a_typed_error(routes):
    from gradflow.core.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="'onednn'"):
        routes.set_mode("onednn")


# --- the nodes in compiled SDFGs, both expansions -----------------------------------------------------------

_NODES = {"forward": Convolution, "grad_input": ConvolutionGradInput, "grad_weights": ConvolutionGradWeights}


def _node_sdfg(kind: str, config, implementation: str | None) -> dace.SDFG:
    N, C, H, W, M, KH, KW, st, dil, layout = config[:10]
    OH, OW = _outs(config)
    px, pw, py = _PERM[layout]
    shapes = {"x": [[N, C, H, W][d] for d in px], "w": [[M, C, KH, KW][d] for d in pw],
              "y": [[N, M, OH, OW][d] for d in py]}
    conns = {"forward": ({"_x": "x", "_w": "w"}, ("_y", "y")),
             "grad_input": ({"_dy": "y", "_w": "w"}, ("_dx", "x")),
             "grad_weights": ({"_x": "x", "_dy": "y"}, ("_dw", "w"))}[kind]
    sdfg = dace.SDFG(f"conv_{kind}_{implementation or 'default'}_{'_'.join(map(str, config[:7]))}_{layout}"
                     f"{'_p' + ''.join(map(str, _pads(config))) if len(config) > 10 else ''}")
    for name, shape in shapes.items():
        sdfg.add_array(name, shape, dace.float64)
    state = sdfg.add_state("conv", is_start_block=True)
    node = _NODES[kind]("conv", strides=st, dilations=dil, layout=layout, pads=_pads(config)[:2])
    if implementation is not None:
        node.implementation = implementation
    whole = {name: dace.Memlet.from_array(name, desc) for name, desc in sdfg.arrays.items()}
    wire(state, node, {conn: whole[array] for conn, array in conns[0].items()}, (conns[1][0], whole[conns[1][1]]))
    return sdfg


@pytest.mark.parametrize("implementation", ["pure", None])
@pytest.mark.parametrize("kind", list(_NODES))
@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[1], CONFIGS[5], CONFIGS[6], CONFIGS[10], CONFIGS[13]],
                         ids=["strided_dilated", "pointwise", "strided_dilated_nhwc", "pointwise_nhwc",
                              "padded_strided_dilated", "padded_nhwc"])
def test_node_expansions_match_torch(kind, config, implementation):
    x, w, dy, _ = _case(config, np.float64, seed=5)
    want_y, want_gx, want_gw = _torch(x, w, dy, config)
    program = compile_sdfg(_node_sdfg(kind, config, implementation))
    if kind == "forward":
        y = np.full(want_y.shape, np.nan)
        program(x=x, w=w, y=y)
        got, want = y, want_y
    elif kind == "grad_input":
        old = np.random.default_rng(1).normal(size=x.shape)
        gx = old.copy()
        program(x=gx, w=w, y=dy)
        got, want = gx - old, want_gx
    else:
        old = np.random.default_rng(2).normal(size=w.shape)
        gw = old.copy()
        program(x=x, w=gw, y=dy)
        got, want = gw - old, want_gw
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    code = "\n".join(p.read_text() for p in Path(program.filename).parents[1].rglob("src/cpu/*.cpp"))
    assert ("gradflow_conv::" in code) == (implementation is None)
