"""A convolution layer through im2col, in the style of the classic course code (im2col.py): the
patches are gathered with index arrays, and the backward pass scatters them back with
``np.add.at`` into an ``np.zeros`` buffer (col2im), overlapping patches adding up.
"""

import numpy as np


def get_im2col_indices(x_shape, field_height, field_width, padding=1, stride=1):
    N, C, H, W = x_shape
    out_height = (H + 2 * padding - field_height) // stride + 1
    out_width = (W + 2 * padding - field_width) // stride + 1
    i0 = np.repeat(np.arange(field_height), field_width)
    i0 = np.tile(i0, C)
    i1 = stride * np.repeat(np.arange(out_height), out_width)
    j0 = np.tile(np.arange(field_width), field_height * C)
    j1 = stride * np.tile(np.arange(out_width), out_height)
    i = i0.reshape(-1, 1) + i1.reshape(1, -1)
    j = j0.reshape(-1, 1) + j1.reshape(1, -1)
    k = np.repeat(np.arange(C), field_height * field_width).reshape(-1, 1)
    return k, i, j


def im2col_indices(x, field_height, field_width, padding=1, stride=1):
    # x: [N, C, H, W] -> cols: [C * fh * fw, out_h * out_w * N]
    p = padding
    x_padded = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), mode="constant")
    k, i, j = get_im2col_indices(x.shape, field_height, field_width, padding, stride)
    cols = x_padded[:, k, i, j]
    C = x.shape[1]
    return cols.transpose(1, 2, 0).reshape(field_height * field_width * C, -1)


def col2im_indices(cols, x_shape, field_height=3, field_width=3, padding=1, stride=1):
    # cols: [C * fh * fw, out_h * out_w * N] -> [N, C, H, W], overlapping patches summed
    N, C, H, W = x_shape
    H_padded, W_padded = H + 2 * padding, W + 2 * padding
    x_padded = np.zeros((N, C, H_padded, W_padded), dtype=cols.dtype)
    k, i, j = get_im2col_indices(x_shape, field_height, field_width, padding, stride)
    cols_reshaped = cols.reshape(C * field_height * field_width, -1, N)
    cols_reshaped = cols_reshaped.transpose(2, 0, 1)
    np.add.at(x_padded, (slice(None), k, i, j), cols_reshaped)
    if padding == 0:
        return x_padded
    return x_padded[:, :, padding:-padding, padding:-padding]


def conv_forward(x, w, b, stride=1, pad=1):
    # x: [N, C, H, W], w: [F, C, fh, fw] -> out: [N, F, out_h, out_w]
    N, C, H, W = x.shape
    F, _, fh, fw = w.shape
    out_h = (H + 2 * pad - fh) // stride + 1
    out_w = (W + 2 * pad - fw) // stride + 1
    x_cols = im2col_indices(x, fh, fw, pad, stride)
    out = w.reshape(F, -1).dot(x_cols) + b.reshape(-1, 1)
    out = out.reshape(F, out_h, out_w, N).transpose(3, 0, 1, 2)
    return out, (x, w, x_cols, stride, pad)


def conv_backward(dout, cache):
    x, w, x_cols, stride, pad = cache
    F, _, fh, fw = w.shape
    db = np.sum(dout, axis=(0, 2, 3))
    dout_reshaped = dout.transpose(1, 2, 3, 0).reshape(F, -1)
    dw = dout_reshaped.dot(x_cols.T).reshape(w.shape)
    dx_cols = w.reshape(F, -1).T.dot(dout_reshaped)
    dx = col2im_indices(dx_cols, x.shape, fh, fw, pad, stride)
    return dx, dw, db


def loss(params, x, target):
    out, _ = conv_forward(x, params["w"], params["b"])
    return 0.5 * np.sum((np.tanh(out) - target) ** 2)


def loss_and_grads(params, x, target):
    out, cache = conv_forward(x, params["w"], params["b"])
    act = np.tanh(out)
    value = 0.5 * np.sum((act - target) ** 2)
    dout = (act - target) * (1.0 - act**2)
    dx, dw, db = conv_backward(dout, cache)
    return value, {"w": dw, "b": db}, dx
