"""A Mamba block in plain numpy, in the style of the numpy ports of mamba-minimal: the depthwise
causal conv1d written as ``np.convolve`` per channel, cut to the sequence length (out[t] sees
x[t - k + 1 .. t]) and written into a buffer, then the selective scan as a Python loop over time.
"""

import numpy as np


def silu(x):
    return x / (1 + np.exp(-x))


def softplus(x):
    return np.log(1 + np.exp(x))


def causal_conv1d(x, w, b):
    # x: [b, l, d], w: [d, k], b: [d] -> [b, l, d]
    batch, l, d = x.shape
    out = np.empty_like(x)
    for i in range(batch):
        for c in range(d):
            out[i, :, c] = np.convolve(x[i, :, c], w[c])[:l] + b[c]
    return out


def selective_scan(u, delta, A, B, C, D):
    # u, delta: [b, l, d_in], A: [d_in, n], B, C: [b, l, n], D: [d_in] -> [b, l, d_in]
    b, l, d_in = u.shape
    n = A.shape[1]
    deltaA = np.exp(np.einsum("bld,dn->bldn", delta, A))
    deltaB_u = np.einsum("bld,bln,bld->bldn", delta, B, u)
    x = np.zeros((b, d_in, n))
    ys = []
    for i in range(l):
        x = deltaA[:, i] * x + deltaB_u[:, i]
        ys.append(np.einsum("bdn,bn->bd", x, C[:, i, :]))
    return np.stack(ys, axis=1) + u * D


def mamba_block(p, x):
    # x: [b, l, d_model] -> [b, l, d_model]
    d_inner, n = p["A_log"].shape
    dt_rank = p["dt_proj"].shape[0]
    xz = x @ p["in_proj"]  # [b, l, 2 * d_inner]
    x, res = xz[..., :d_inner], xz[..., d_inner:]
    x = silu(causal_conv1d(x, p["conv_w"], p["conv_b"]))
    x_dbl = x @ p["x_proj"]  # [b, l, dt_rank + 2 * n]
    delta, B, C = np.split(x_dbl, [dt_rank, dt_rank + n], axis=-1)
    delta = softplus(delta @ p["dt_proj"] + p["dt_bias"])  # [b, l, d_inner]
    A = -np.exp(p["A_log"])
    y = selective_scan(x, delta, A, B, C, p["D"])
    return (y * silu(res)) @ p["out_proj"]


def loss(p, x, target):
    return np.mean((mamba_block(p, x) - target) ** 2)


def init_params(rng, d_model=4, d_inner=6, d_state=4, d_conv=4, dt_rank=2):
    def dense(m, n):
        return rng.standard_normal((m, n)) / np.sqrt(m)

    return {
        "in_proj": dense(d_model, 2 * d_inner),
        "conv_w": 0.5 * rng.standard_normal((d_inner, d_conv)),
        "conv_b": 0.1 * rng.standard_normal(d_inner),
        "x_proj": dense(d_inner, dt_rank + 2 * d_state),
        "dt_proj": dense(dt_rank, d_inner),
        "dt_bias": 0.1 * rng.standard_normal(d_inner),
        "A_log": np.log(np.tile(np.arange(1, d_state + 1, dtype=np.float64), (d_inner, 1))),
        "D": np.ones(d_inner),
        "out_proj": dense(d_inner, d_model),
    }
