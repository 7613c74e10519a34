"""A fully connected net with inverted dropout, written as layer functions with caches and
hand-written backward functions (the course-assignment style).

``dropout_forward`` draws its mask with the legacy ``np.random.rand``, or, given ``rng``, with a
``np.random.Generator``; ``loss`` returns the loss and the masks it drew, ``loss_with_masks``
replays given masks and returns the hand-written gradients.
"""

import numpy as np


def affine_forward(x, w, b):
    out = x.reshape(x.shape[0], -1).dot(w) + b
    return out, (x, w, b)


def affine_backward(dout, cache):
    x, w, _ = cache
    dx = dout.dot(w.T).reshape(x.shape)
    dw = x.reshape(x.shape[0], -1).T.dot(dout)
    db = np.sum(dout, axis=0)
    return dx, dw, db


def relu_forward(x):
    return np.maximum(0, x), x


def relu_backward(dout, cache):
    return dout * (cache > 0)


def dropout_forward(x, p, mode, rng=None, mask=None):
    """Inverted dropout; p is the probability of keeping a unit."""
    if mode != "train":
        return x, None
    if mask is None:
        u = np.random.rand(*x.shape) if rng is None else rng.random(x.shape)
        mask = (u < p) / p
    return x * mask, mask


def dropout_backward(dout, mask):
    return dout * mask


def softmax_loss(x, y):
    shifted = x - np.max(x, axis=1, keepdims=True)
    log_probs = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
    N = x.shape[0]
    loss = -np.sum(log_probs[np.arange(N), y]) / N
    dx = np.exp(log_probs)
    dx[np.arange(N), y] -= 1
    return loss, dx / N


def init_params(dims, seed=0, weight_scale=0.1):
    rng = np.random.default_rng(seed)
    params = {}
    for i in range(len(dims) - 1):
        params[f"W{i + 1}"] = weight_scale * rng.standard_normal((dims[i], dims[i + 1]))
        params[f"b{i + 1}"] = np.zeros(dims[i + 1])
    return params


def loss(params, X, y, p=0.5, rng=None, reg=0.0):
    """Loss of the net [affine - relu - dropout] x (L - 1) - affine - softmax, and the masks."""
    n_layers = len(params) // 2
    h, masks = X, []
    for i in range(1, n_layers):
        h, _ = affine_forward(h, params[f"W{i}"], params[f"b{i}"])
        h, _ = relu_forward(h)
        h, mask = dropout_forward(h, p, "train", rng)
        masks.append(mask)
    scores, _ = affine_forward(h, params[f"W{n_layers}"], params[f"b{n_layers}"])
    data_loss, _ = softmax_loss(scores, y)
    reg_loss = 0.5 * reg * sum(np.sum(params[f"W{i}"] ** 2) for i in range(1, n_layers + 1))
    return data_loss + reg_loss, masks


def loss_with_masks(params, X, y, masks, p=0.5, reg=0.0):
    """The same loss with given dropout masks, and its hand-written gradients."""
    n_layers = len(params) // 2
    h, caches = X, []
    for i in range(1, n_layers):
        h, fc_cache = affine_forward(h, params[f"W{i}"], params[f"b{i}"])
        h, relu_cache = relu_forward(h)
        h, _ = dropout_forward(h, p, "train", mask=masks[i - 1])
        caches.append((fc_cache, relu_cache, masks[i - 1]))
    scores, last_cache = affine_forward(h, params[f"W{n_layers}"], params[f"b{n_layers}"])
    data_loss, dscores = softmax_loss(scores, y)
    value = data_loss + 0.5 * reg * sum(np.sum(params[f"W{i}"] ** 2) for i in range(1, n_layers + 1))
    grads = {}
    dh, grads[f"W{n_layers}"], grads[f"b{n_layers}"] = affine_backward(dscores, last_cache)
    for i in reversed(range(1, n_layers)):
        fc_cache, relu_cache, mask = caches[i - 1]
        dh = relu_backward(dropout_backward(dh, mask), relu_cache)
        dh, grads[f"W{i}"], grads[f"b{i}"] = affine_backward(dh, fc_cache)
    for i in range(1, n_layers + 1):
        grads[f"W{i}"] += reg * params[f"W{i}"]
    return value, grads
