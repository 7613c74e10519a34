"""A two-layer net in the course-assignment style: layer functions that return a cache, and
backward functions that write into copies of the upstream gradient through boolean masks
(``dx[cache <= 0] = 0`` for ReLU, ``out[out < 0] *= alpha`` for a leaky ReLU in the forward).
"""

import numpy as np


def affine_forward(x, w, b):
    return x.dot(w) + b, (x, w)


def affine_backward(dout, cache):
    x, w = cache
    return dout.dot(w.T), x.T.dot(dout), np.sum(dout, axis=0)


def relu_forward(x):
    return np.maximum(0, x), x


def relu_backward(dout, cache):
    dx = dout.copy()
    dx[cache <= 0] = 0
    return dx


def leaky_relu_forward(x, alpha=0.1):
    out = x.copy()
    out[out < 0] *= alpha
    return out, x


def leaky_relu_backward(dout, cache, alpha=0.1):
    dx = dout.copy()
    dx[cache < 0] *= alpha
    return dx


def softmax_loss(scores, y):
    shifted = scores - np.max(scores, axis=1, keepdims=True)
    log_probs = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    n = scores.shape[0]
    dscores = np.exp(log_probs)
    dscores[np.arange(n), y] -= 1
    return -np.sum(log_probs[np.arange(n), y]) / n, dscores / n


def loss(params, X, y):
    h1, _ = affine_forward(X, params["W1"], params["b1"])
    a1, _ = relu_forward(h1)
    h2, _ = affine_forward(a1, params["W2"], params["b2"])
    a2, _ = leaky_relu_forward(h2)
    scores, _ = affine_forward(a2, params["W3"], params["b3"])
    return softmax_loss(scores, y)[0]


def loss_and_grads(params, X, y):
    h1, c1 = affine_forward(X, params["W1"], params["b1"])
    a1, r1 = relu_forward(h1)
    h2, c2 = affine_forward(a1, params["W2"], params["b2"])
    a2, r2 = leaky_relu_forward(h2)
    scores, c3 = affine_forward(a2, params["W3"], params["b3"])
    value, dscores = softmax_loss(scores, y)
    grads = {}
    da2, grads["W3"], grads["b3"] = affine_backward(dscores, c3)
    da1, grads["W2"], grads["b2"] = affine_backward(leaky_relu_backward(da2, r2), c2)
    _, grads["W1"], grads["b1"] = affine_backward(relu_backward(da1, r1), c1)
    return value, grads


def init_params(rng, sizes):
    params = {}
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:]), 1):
        params[f"W{i}"] = rng.standard_normal((m, n)) / np.sqrt(m)
        params[f"b{i}"] = 0.1 * rng.standard_normal(n)  # (no pre-activation exactly 0: the ReLU kink)
    return params
