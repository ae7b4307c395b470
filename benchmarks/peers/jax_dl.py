"""JAX versions of the deep-learning kernels: NPBench's conv2d_bias, lenet, mlp, resnet and softmax
(`tests/corpus/npbench.py`, NHWC tensors, float64) and the float32 MLP of `benchmarks/mlp.py`.

The programs' loops over output pixels have independent iterations: convolutions are
`lax.conv_general_dilated`, 2x2 max-pooling a reshape and a max. Conventions in `benchmarks/peers/__init__.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks.peers import JaxKernel


def _wsum(x, ct):
    return jnp.sum(x * ct)


def conv2d(x, w):
    """NHWC input, (K, K, C_in, C_out) weights, stride 1, no padding."""
    return lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def maxpool2d(x):
    """2x2 windows, stride 2, trailing odd rows/columns dropped (NPBench's `D1 // 2`)."""
    n, h, w, c = x.shape
    x = x[:, :h // 2 * 2, :w // 2 * 2, :]
    return jnp.max(x.reshape(n, h // 2, 2, w // 2, 2, c), axis=(2, 4))


def batchnorm2d(x):
    mean = jnp.mean(x, axis=0, keepdims=True)
    std = jnp.sqrt(jnp.sum((x - mean) * (x - mean), axis=0, keepdims=True) / x.shape[0])
    return (x - mean) / jnp.sqrt(std + 1e-5)


def softmax_last(x):
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def conv2d_bias(input, weights, bias, ct_res, **_):
    return _wsum(conv2d(input, weights) + bias, ct_res)


def lenet(input, conv1, conv1bias, conv2, conv2bias, fc1w, fc1b, fc2w, fc2b, fc3w, fc3b, ct_res, **_):
    x = maxpool2d(jax.nn.relu(conv2d(input, conv1) + conv1bias))
    x = maxpool2d(jax.nn.relu(conv2d(x, conv2) + conv2bias))
    x = x.reshape(x.shape[0], -1)
    x = jax.nn.relu(x @ fc1w + fc1b)
    x = jax.nn.relu(x @ fc2w + fc2b)
    return _wsum(x @ fc3w + fc3b, ct_res)


def mlp_npbench(input, w1, b1, w2, b2, w3, b3, ct_res, **_):
    x = jax.nn.relu(input @ w1 + b1)
    x = jax.nn.relu(x @ w2 + b2)
    return _wsum(softmax_last(x @ w3 + b3), ct_res)


def resnet(input, conv1, conv2, conv3, ct_res, **_):
    x = jnp.pad(conv2d(input, conv1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    x = jax.nn.relu(batchnorm2d(x))
    x = jax.nn.relu(batchnorm2d(conv2d(x, conv2)))
    x = batchnorm2d(conv2d(x, conv3))
    return _wsum(jax.nn.relu(x + input), ct_res)


def softmax(x, ct_res, **_):
    return _wsum(softmax_last(x), ct_res)


def mlp(x, W1, b1, W2, b2, W3, b3, T, **_):
    """`benchmarks/mlp.py`: S = sum((relu(relu(x W1 + b1) W2 + b2) W3 + b3 - T)^2), float32."""
    h1 = jnp.maximum(x @ W1 + b1, 0.0)
    h2 = jnp.maximum(h1 @ W2 + b2, 0.0)
    d = h2 @ W3 + b3 - T
    return jnp.sum(d * d)


KERNELS: dict[str, JaxKernel] = {
    "nb_conv2d_bias": JaxKernel(conv2d_bias),
    "nb_lenet": JaxKernel(lenet),
    "nb_mlp": JaxKernel(mlp_npbench),
    "nb_resnet": JaxKernel(resnet),
    "nb_softmax": JaxKernel(softmax),
    "mlp": JaxKernel(mlp),
}
