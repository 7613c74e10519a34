"""A classifier in the functional style of autograd's examples: params are a list of (W, b)
tuples, the net is a loop of ``np.dot`` and ``np.tanh``, the output is normalized with
``scipy.special.logsumexp`` and the objective is a log-posterior with a Gaussian prior.
"""

import numpy as np
from scipy.special import logsumexp


def init_random_params(scale, layer_sizes, rs=np.random.RandomState(0)):  # noqa: B008 (the style)
    """A list of (weights, biases) tuples, one per layer."""
    return [(scale * rs.randn(m, n), scale * rs.randn(n)) for m, n in zip(layer_sizes[:-1], layer_sizes[1:])]


def neural_net_predict(params, inputs):
    """Normalized class log-probabilities, [N, D] -> [N, C]."""
    for W, b in params:
        outputs = np.dot(inputs, W) + b
        inputs = np.tanh(outputs)
    return outputs - logsumexp(outputs, axis=1, keepdims=True)


def l2_norm(params):
    """Sum of the squares of every parameter."""
    return sum(np.sum(W**2) + np.sum(b**2) for W, b in params)


def log_posterior(params, inputs, targets, L2_reg):
    log_prior = -L2_reg * l2_norm(params)
    log_lik = np.sum(neural_net_predict(params, inputs) * targets)
    return log_prior + log_lik


def accuracy(params, inputs, targets):
    target_class = np.argmax(targets, axis=1)
    predicted_class = np.argmax(neural_net_predict(params, inputs), axis=1)
    return np.mean(predicted_class == target_class)


def objective(params, inputs, targets, L2_reg=1e-3):
    return -log_posterior(params, inputs, targets, L2_reg)
