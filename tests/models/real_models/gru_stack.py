"""A GRU written from scratch, in the style of tutorials that keep one weight matrix per gate over
the stacked input: ``np.column_stack((h, x, np.ones(n)))`` puts the previous hidden state, the input
and a column of ones (the bias row of the weights) side by side, and each gate is one matmul.
"""

import numpy as np


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def gru_step(x, h, p):
    # x: [n, d], h: [n, hid] -> [n, hid]
    ones = np.ones(x.shape[0])
    hx = np.column_stack((h, x, ones))  # [n, hid + d + 1]
    z = sigmoid(hx @ p["Wz"])
    r = sigmoid(hx @ p["Wr"])
    h_tilde = np.tanh(np.column_stack((r * h, x, ones)) @ p["Wh"])
    return (1 - z) * h + z * h_tilde


def gru_forward(xs, h0, p):
    # xs: [t, n, d] -> hs: [t, n, hid]
    hs = []
    h = h0
    for x in xs:
        h = gru_step(x, h, p)
        hs.append(h)
    return np.array(hs)


def loss(p, xs, h0, labels):
    """Cross-entropy of a linear readout of every step's hidden state; labels: [t, n] ints."""
    hs = gru_forward(xs, h0, p)
    logits = hs @ p["Wy"]  # [t, n, classes]
    logits = logits - np.max(logits, axis=-1, keepdims=True)
    log_probs = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
    t, n = labels.shape
    picked = log_probs[np.arange(t)[:, None], np.arange(n)[None, :], labels]
    return -np.mean(picked)


def init_params(rng, d, hid, classes):
    def gate():
        return rng.standard_normal((hid + d + 1, hid)) / np.sqrt(hid + d)

    return {"Wz": gate(), "Wr": gate(), "Wh": gate(), "Wy": rng.standard_normal((hid, classes)) / np.sqrt(hid)}
