"""An Elman RNN and an LSTM over a sequence, in the usual numpy style: a Python loop over time
steps, the hidden states kept in a list. ``*_loss`` is the mean squared error of a linear readout
of every step; ``*_loss_and_grads_numpy`` are the same losses with their gradients written out by
hand (backpropagation through time), the peer ``graphc bench runtime`` times
``graphc.value_and_grad`` against and the tests check it with.

params (Elman): {"wx": [I, H], "wh": [H, H], "b": [H], "wy": [H, O], "by": [O]}
params (LSTM):  {"wx": [I, 4H], "wh": [H, 4H], "b": [4H], "wy": [H, O], "by": [O]} (gates i, f, g, o)
xs: [T, B, I], ys: [T, B, O]
"""

import numpy as np


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def elman(params, xs):
    T, B, _ = xs.shape
    h = np.zeros((B, params["wh"].shape[0]), xs.dtype)
    hs = []
    for t in range(T):
        h = np.tanh(xs[t] @ params["wx"] + h @ params["wh"] + params["b"])
        hs.append(h)
    return np.stack(hs)  # [T, B, H]


def elman_loss(params, xs, ys):
    out = elman(params, xs) @ params["wy"] + params["by"]
    return np.mean((out - ys) ** 2)


def lstm(params, xs):
    T, B, _ = xs.shape
    H = params["wh"].shape[0]
    h = np.zeros((B, H), xs.dtype)
    c = np.zeros((B, H), xs.dtype)
    hs = []
    for t in range(T):
        z = xs[t] @ params["wx"] + h @ params["wh"] + params["b"]
        i, f, g, o = sigmoid(z[:, :H]), sigmoid(z[:, H : 2 * H]), np.tanh(z[:, 2 * H : 3 * H]), sigmoid(z[:, 3 * H :])
        c = f * c + i * g
        h = o * np.tanh(c)
        hs.append(h)
    return np.stack(hs)


def lstm_loss(params, xs, ys):
    out = lstm(params, xs) @ params["wy"] + params["by"]
    return np.mean((out - ys) ** 2)


def _readout_grads(params, hs, ys):
    """Loss, d loss / d hs, and the readout's gradients."""
    out = hs @ params["wy"] + params["by"]
    diff = out - ys
    loss = np.mean(diff**2)
    dout = (2 / diff.size) * diff  # a Python float keeps float32 float32
    T, B, H = hs.shape
    flat_h, flat_d = hs.reshape(T * B, H), dout.reshape(T * B, -1)
    return loss, dout @ params["wy"].T, {"wy": flat_h.T @ flat_d, "by": flat_d.sum(axis=0)}


def elman_loss_and_grads_numpy(params, xs, ys):
    hs = elman(params, xs)
    loss, dhs, grads = _readout_grads(params, hs, ys)
    T, B, _ = xs.shape
    dwx, dwh, db = np.zeros_like(params["wx"]), np.zeros_like(params["wh"]), np.zeros_like(params["b"])
    dh_next = np.zeros_like(hs[0])
    for t in range(T - 1, -1, -1):
        dz = (dhs[t] + dh_next) * (1 - hs[t] ** 2)
        h_prev = hs[t - 1] if t else np.zeros_like(hs[0])
        dwx += xs[t].T @ dz
        dwh += h_prev.T @ dz
        db += dz.sum(axis=0)
        dh_next = dz @ params["wh"].T
    grads.update(wx=dwx, wh=dwh, b=db)
    return loss, grads


def lstm_loss_and_grads_numpy(params, xs, ys):
    T, B, _ = xs.shape
    H = params["wh"].shape[0]
    h = np.zeros((B, H), xs.dtype)
    c = np.zeros((B, H), xs.dtype)
    hs, cache = [], []
    for t in range(T):
        z = xs[t] @ params["wx"] + h @ params["wh"] + params["b"]
        i, f, g, o = sigmoid(z[:, :H]), sigmoid(z[:, H : 2 * H]), np.tanh(z[:, 2 * H : 3 * H]), sigmoid(z[:, 3 * H :])
        c_prev, h_prev = c, h
        c = f * c + i * g
        tc = np.tanh(c)
        h = o * tc
        hs.append(h)
        cache.append((i, f, g, o, c_prev, h_prev, tc))
    loss, dhs, grads = _readout_grads(params, np.stack(hs), ys)
    dwx, dwh, db = np.zeros_like(params["wx"]), np.zeros_like(params["wh"]), np.zeros_like(params["b"])
    dh_next, dc_next = np.zeros((B, H), xs.dtype), np.zeros((B, H), xs.dtype)
    dz = np.empty((B, 4 * H), xs.dtype)
    for t in range(T - 1, -1, -1):
        i, f, g, o, c_prev, h_prev, tc = cache[t]
        dh = dhs[t] + dh_next
        dc = dc_next + dh * o * (1 - tc**2)
        dz[:, :H] = dc * g * i * (1 - i)
        dz[:, H : 2 * H] = dc * c_prev * f * (1 - f)
        dz[:, 2 * H : 3 * H] = dc * i * (1 - g**2)
        dz[:, 3 * H :] = dh * tc * o * (1 - o)
        dwx += xs[t].T @ dz
        dwh += h_prev.T @ dz
        db += dz.sum(axis=0)
        dh_next = dz @ params["wh"].T
        dc_next = dc * f
    grads.update(wx=dwx, wh=dwh, b=db)
    return loss, grads


def init_params(rng, n_in=16, hidden=32, n_out=16, gates=1, dtype=np.float32):
    """Weights of an Elman RNN (``gates=1``) or an LSTM (``gates=4``)."""

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)

    return {
        "wx": w(n_in, gates * hidden),
        "wh": w(hidden, gates * hidden),
        "b": np.zeros(gates * hidden, dtype),
        "wy": w(hidden, n_out),
        "by": np.zeros(n_out, dtype),
    }


def example_args(steps=20, batch=8, n_in=16, hidden=32, n_out=16, gates=1, seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(rng, n_in, hidden, n_out, gates)
    xs = rng.standard_normal((steps, batch, n_in)).astype(np.float32)
    ys = rng.standard_normal((steps, batch, n_out)).astype(np.float32)
    return (params, xs, ys), {}


def example_lstm_args(steps=20, batch=8, n_in=16, hidden=32, n_out=16, seed=0):
    return example_args(steps, batch, n_in, hidden, n_out, gates=4, seed=seed)
