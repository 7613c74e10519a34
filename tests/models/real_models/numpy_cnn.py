"""A CNN written with Python loops over windows (the Alescontrela/Numpy-CNN style).

``convolution`` and ``maxpool`` walk the image with ``while`` loops on Python ints and do one small
numpy op per window; ``maxpool_backward`` routes each pooled gradient to its window's maximum with
``np.unravel_index(np.nanargmax(window), window.shape)``. Every loop unrolls when traced: a
16 x 16 image with 4 filters makes several hundred tiny ops.
"""

import numpy as np


def convolution(image, filt, bias, s=1):
    (n_f, n_c_f, f, _) = filt.shape
    n_c, in_dim, _ = image.shape
    out_dim = int((in_dim - f) / s) + 1
    assert n_c == n_c_f, "Dimensions of filter must match dimensions of input image"
    out = np.zeros((n_f, out_dim, out_dim))
    for curr_f in range(n_f):
        curr_y = out_y = 0
        while curr_y + f <= in_dim:
            curr_x = out_x = 0
            while curr_x + f <= in_dim:
                out[curr_f, out_y, out_x] = (
                    np.sum(filt[curr_f] * image[:, curr_y : curr_y + f, curr_x : curr_x + f]) + bias[curr_f]
                )
                curr_x += s
                out_x += 1
            curr_y += s
            out_y += 1
    return out


def maxpool(image, f=2, s=2):
    n_c, h_prev, w_prev = image.shape
    h = int((h_prev - f) / s) + 1
    w = int((w_prev - f) / s) + 1
    downsampled = np.zeros((n_c, h, w))
    for i in range(n_c):
        curr_y = out_y = 0
        while curr_y + f <= h_prev:
            curr_x = out_x = 0
            while curr_x + f <= w_prev:
                downsampled[i, out_y, out_x] = np.max(image[i, curr_y : curr_y + f, curr_x : curr_x + f])
                curr_x += s
                out_x += 1
            curr_y += s
            out_y += 1
    return downsampled


def nanargmax(arr):
    idx = np.nanargmax(arr)
    idxs = np.unravel_index(idx, arr.shape)
    return idxs


def maxpool_backward(dpool, orig, f, s):
    (n_c, orig_dim, _) = orig.shape
    dout = np.zeros(orig.shape)
    for curr_c in range(n_c):
        curr_y = out_y = 0
        while curr_y + f <= orig_dim:
            curr_x = out_x = 0
            while curr_x + f <= orig_dim:
                (a, b) = nanargmax(orig[curr_c, curr_y : curr_y + f, curr_x : curr_x + f])
                dout[curr_c, curr_y + a, curr_x + b] = dpool[curr_c, out_y, out_x]
                curr_x += s
                out_x += 1
            curr_y += s
            out_y += 1
    return dout


def forward(image, params):
    [f1, b1, w3, b3] = params
    conv1 = convolution(image, f1, b1)
    conv1[conv1 <= 0] = 0  # ReLU
    pooled = maxpool(conv1, 2, 2)
    fc = pooled.reshape((-1, 1))
    z = w3.dot(fc) + b3
    probs = np.exp(z - np.max(z))
    return probs / np.sum(probs)


def pool_gradient(image, params, dpool):
    """The max-pool backward of the first layer's ReLU'd convolution."""
    [f1, b1, _w3, _b3] = params
    conv1 = convolution(image, f1, b1)
    conv1[conv1 <= 0] = 0
    return maxpool_backward(dpool, conv1, 2, 2)


def make_params(n_f=4, n_c=1, f=3, size=16, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    pooled = n_f * ((size - f + 1) // 2) ** 2
    return [
        rng.standard_normal((n_f, n_c, f, f)) * 0.3,
        rng.standard_normal(n_f) * 0.1,  # (n_f,): numpy 2.4 refuses to store bias[f] of shape (1,) in one element
        rng.standard_normal((classes, pooled)) * 0.05,
        np.zeros((classes, 1)),
    ]
