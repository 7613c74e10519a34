"""Scaled dot-product attention in the style of ONNX's reference implementation of its Attention
operator: 4-d [batch, heads, seq, head_size] arrays, a causal mask and a boolean or additive float
mask (-inf where a key is hidden), and a softmax that tests for ``np.isneginf`` so that a query whose
keys are all hidden (a left-padded sequence under a causal mask) gets zeros, not nan.
"""

import numpy as np


def softmax(x, axis=-1):
    x_max = np.max(x, axis=axis, keepdims=True)
    x_max = np.where(np.isneginf(x_max), 0.0, x_max)  # every key hidden: exp(-inf - 0) = 0
    e = np.exp(x - x_max)
    total = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def compute_attention(Q, K, V, attn_mask=None, is_causal=False, scale=None):
    # Q: [b, h, q, e], K, V: [b, h, k, e] -> [b, h, q, e]
    q_len, kv_len, head_size = Q.shape[2], K.shape[2], Q.shape[3]
    if scale is None:
        scale = 1.0 / np.sqrt(head_size)
    qk = (Q @ np.swapaxes(K, -1, -2)) * scale  # [b, h, q, k]
    if is_causal:
        hidden = np.triu(np.ones((q_len, kv_len), dtype=bool), k=1)
        qk = np.where(hidden, -np.inf, qk)
    if attn_mask is not None:
        if attn_mask.dtype == bool:
            attn_mask = np.where(attn_mask, 0.0, -np.inf)
        qk = qk + attn_mask
    weights = softmax(qk, axis=-1)
    dead = np.all(np.isneginf(qk), axis=-1, keepdims=True)  # [b, h, q, 1]
    return np.where(dead, 0.0, weights @ V)


def self_attention(p, x, mask, num_heads):
    # x: [b, t, d], mask: [b, 1, 1, t] additive (0 or -inf) -> [b, t, d]
    b, t, d = x.shape

    def heads(w):
        return (x @ w).reshape(b, t, num_heads, d // num_heads).transpose(0, 2, 1, 3)

    out = compute_attention(heads(p["wq"]), heads(p["wk"]), heads(p["wv"]), mask, is_causal=True)
    return out.transpose(0, 2, 1, 3).reshape(b, t, d) @ p["wo"]


def padding_mask(lengths, t):
    """Left padding: sequence i holds its tokens in the last lengths[i] places. [b] -> [b, 1, 1, t]."""
    position = np.arange(t)[None, :]
    return np.where(position >= t - lengths[:, None], 0.0, -np.inf)[:, None, None, :]


def loss(p, x, mask, target, num_heads=2):
    return np.sum((self_attention(p, x, mask, num_heads) - target) ** 2)


def init_params(rng, d):
    return {k: rng.standard_normal((d, d)) / np.sqrt(d) for k in ("wq", "wk", "wv", "wo")}
