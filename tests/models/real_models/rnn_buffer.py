"""A vanilla RNN language model in the course-assignment style: step functions, a preallocated
hidden-state buffer filled in a Python loop, a temporal softmax loss, and hand-written backward
functions (backpropagation through time) to check gradients against.
"""

import numpy as np


def rnn_step_forward(x, prev_h, Wx, Wh, b):
    next_h = np.tanh(x.dot(Wx) + prev_h.dot(Wh) + b)
    cache = (x, prev_h, Wx, Wh, next_h)
    return next_h, cache


def rnn_step_backward(dnext_h, cache):
    x, prev_h, Wx, Wh, next_h = cache
    dtanh = dnext_h * (1 - next_h**2)
    dx = dtanh.dot(Wx.T)
    dprev_h = dtanh.dot(Wh.T)
    dWx = x.T.dot(dtanh)
    dWh = prev_h.T.dot(dtanh)
    db = dtanh.sum(axis=0)
    return dx, dprev_h, dWx, dWh, db


def rnn_forward(x, h0, Wx, Wh, b):
    """x: [T, N, D], h0: [N, H] -> hs: [T, N, H]."""
    T, N, _ = x.shape
    H = h0.shape[1]
    hs = np.zeros((T, N, H))
    prev_h = h0
    for t in range(T):
        hs[t] = np.tanh(x[t].dot(Wx) + prev_h.dot(Wh) + b)
        prev_h = hs[t]
    return hs


def temporal_affine_forward(h, w, b):
    T, N, H = h.shape
    return h.reshape(T * N, H).dot(w).reshape(T, N, -1) + b


def temporal_softmax_loss(scores, y):
    T, N, V = scores.shape
    flat = scores.reshape(T * N, V)
    probs = np.exp(flat - np.max(flat, axis=1, keepdims=True))
    probs /= np.sum(probs, axis=1, keepdims=True)
    return -np.sum(np.log(probs[np.arange(T * N), y.reshape(T * N)])) / N


def loss(params, x, y, h0):
    hs = rnn_forward(x, h0, params["Wx"], params["Wh"], params["b"])
    scores = temporal_affine_forward(hs, params["W_vocab"], params["b_vocab"])
    return temporal_softmax_loss(scores, y)


def loss_and_grads(params, x, y, h0):
    """The same loss with a hand-written backward pass (BPTT)."""
    T, N, _ = x.shape
    H = h0.shape[1]
    caches, hs, prev_h = [], np.zeros((T, N, H)), h0
    for t in range(T):
        prev_h, cache = rnn_step_forward(x[t], prev_h, params["Wx"], params["Wh"], params["b"])
        hs[t] = prev_h
        caches.append(cache)
    scores = temporal_affine_forward(hs, params["W_vocab"], params["b_vocab"])
    V = scores.shape[2]
    flat = scores.reshape(T * N, V)
    probs = np.exp(flat - np.max(flat, axis=1, keepdims=True))
    probs /= np.sum(probs, axis=1, keepdims=True)
    yf = y.reshape(T * N)
    value = -np.sum(np.log(probs[np.arange(T * N), yf])) / N
    dflat = probs.copy()
    dflat[np.arange(T * N), yf] -= 1
    dflat /= N
    grads = {
        "W_vocab": hs.reshape(T * N, H).T.dot(dflat),
        "b_vocab": dflat.sum(axis=0),
        "Wx": np.zeros_like(params["Wx"]),
        "Wh": np.zeros_like(params["Wh"]),
        "b": np.zeros_like(params["b"]),
    }
    dhs = dflat.dot(params["W_vocab"].T).reshape(T, N, H)
    dprev = np.zeros((N, H))
    for t in reversed(range(T)):
        _, dprev, dWx, dWh, db = rnn_step_backward(dhs[t] + dprev, caches[t])
        grads["Wx"] += dWx
        grads["Wh"] += dWh
        grads["b"] += db
    return value, grads
