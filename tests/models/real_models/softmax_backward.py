"""A softmax classifier with a hand-written backward pass in the column-major style of "neural
network from scratch" code: examples are columns (X: [D, m]), class scores rows, and the
cross-entropy gradient is written through a transpose of the probabilities,
``grad_y = probs.T; grad_y[range(m), y] -= 1.``, which numpy writes into ``probs`` itself.
"""

import numpy as np


def softmax(z):
    # [C, m] -> [C, m], each column sums to 1
    e = np.exp(z - np.max(z, axis=0, keepdims=True))
    return e / np.sum(e, axis=0, keepdims=True)


def forward(params, X):
    # X: [D, m] -> hidden [H, m] -> probabilities [C, m]
    hidden = np.tanh(params["W1"] @ X + params["b1"])
    return hidden, softmax(params["W2"] @ hidden + params["b2"])


def loss(params, X, y):
    _, probs = forward(params, X)
    m = y.shape[0]
    return -np.sum(np.log(probs[y, np.arange(m)])) / m


def softmax_cross_entropy_backward(probs, y):
    """d loss / d scores, computed in place in the probabilities (through their transpose)."""
    m = y.shape[0]
    grad_y = probs.T  # [m, C], a view of probs
    grad_y[range(m), y] -= 1.0
    grad_y /= m
    return probs  # (numpy wrote the gradient into probs through grad_y)


def loss_and_grads(params, X, y):
    hidden, probs = forward(params, X)
    m = y.shape[0]
    value = -np.sum(np.log(probs[y, np.arange(m)])) / m
    dscores = softmax_cross_entropy_backward(probs, y)  # [C, m]
    dhidden = params["W2"].T @ dscores * (1.0 - hidden**2)
    grads = {
        "W1": dhidden @ X.T,
        "b1": np.sum(dhidden, axis=1, keepdims=True),
        "W2": dscores @ hidden.T,
        "b2": np.sum(dscores, axis=1, keepdims=True),
    }
    return value, grads


def init_params(rng, D, H, C):
    return {
        "W1": 0.5 * rng.standard_normal((H, D)),
        "b1": 0.1 * rng.standard_normal((H, 1)),
        "W2": 0.5 * rng.standard_normal((C, H)),
        "b2": 0.1 * rng.standard_normal((C, 1)),
    }
