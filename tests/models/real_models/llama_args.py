"""A LLaMA forward as functions taking a frozen ``ModelArgs`` dataclass and a params dict.

The style of the numpy LLaMA-2 ports: a dataclass config, RMSNorm, rotary embeddings computed
with cos/sin tables, grouped-query attention with ``np.repeat``, a SwiGLU feed-forward.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 16
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 19
    hidden_dim: int = 24
    norm_eps: float = 1e-5
    max_seq_len: int = 8


def init_params(args: ModelArgs, seed=0):
    rng = np.random.default_rng(seed)
    head_dim = args.dim // args.n_heads

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    layers = []
    for _ in range(args.n_layers):
        layers.append(
            {
                "attention_norm": np.ones(args.dim, np.float32),
                "wq": w(args.dim, args.n_heads * head_dim),
                "wk": w(args.dim, args.n_kv_heads * head_dim),
                "wv": w(args.dim, args.n_kv_heads * head_dim),
                "wo": w(args.n_heads * head_dim, args.dim),
                "ffn_norm": np.ones(args.dim, np.float32),
                "w1": w(args.dim, args.hidden_dim),
                "w2": w(args.hidden_dim, args.dim),
                "w3": w(args.dim, args.hidden_dim),
            }
        )
    return {
        "tok_embeddings": w(args.vocab_size, args.dim),
        "layers": layers,
        "norm": np.ones(args.dim, np.float32),
        "output": w(args.dim, args.vocab_size),
    }


def rms_norm(x, weight, eps):
    z = (x**2).mean(-1, keepdims=True) + eps
    return x / np.sqrt(z) * weight


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2)[: (dim // 2)] / dim))
    t = np.arange(end)
    freqs = np.outer(t, freqs)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def apply_rotary_emb(xq, xk, freqs_cos, freqs_sin):
    # [B, L, H, D] -> split the last dim into (real, imag) pairs
    xq_r, xq_i = xq.reshape(xq.shape[:-1] + (-1, 2)).transpose(4, 0, 1, 2, 3)
    xk_r, xk_i = xk.reshape(xk.shape[:-1] + (-1, 2)).transpose(4, 0, 1, 2, 3)
    freqs_cos = np.expand_dims(freqs_cos, axis=(0, 2))
    freqs_sin = np.expand_dims(freqs_sin, axis=(0, 2))
    xq_out_r = xq_r * freqs_cos - xq_i * freqs_sin
    xq_out_i = xq_r * freqs_sin + xq_i * freqs_cos
    xk_out_r = xk_r * freqs_cos - xk_i * freqs_sin
    xk_out_i = xk_r * freqs_sin + xk_i * freqs_cos
    xq_out = np.stack([xq_out_r, xq_out_i], axis=-1).reshape(xq.shape)
    xk_out = np.stack([xk_out_r, xk_out_i], axis=-1).reshape(xk.shape)
    return xq_out, xk_out


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def silu(x):
    return x * (1 / (1 + np.exp(-x)))


def attention(layer, x, freqs_cos, freqs_sin, args: ModelArgs):
    B, L, _ = x.shape
    head_dim = args.dim // args.n_heads
    xq = (x @ layer["wq"]).reshape(B, L, args.n_heads, head_dim)
    xk = (x @ layer["wk"]).reshape(B, L, args.n_kv_heads, head_dim)
    xv = (x @ layer["wv"]).reshape(B, L, args.n_kv_heads, head_dim)
    xq, xk = apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)
    n_rep = args.n_heads // args.n_kv_heads
    xk = np.repeat(xk, n_rep, axis=2)
    xv = np.repeat(xv, n_rep, axis=2)
    xq, xk, xv = xq.transpose(0, 2, 1, 3), xk.transpose(0, 2, 1, 3), xv.transpose(0, 2, 1, 3)
    scores = xq @ xk.transpose(0, 1, 3, 2) / np.sqrt(head_dim)  # [B, H, L, L]
    mask = np.full((L, L), float("-inf"))
    mask = np.triu(mask, k=1)
    scores = scores + mask[None, None, :, :]
    scores = softmax(scores.astype(np.float32))
    out = (scores @ xv).transpose(0, 2, 1, 3).reshape(B, L, -1)
    return out @ layer["wo"]


def feed_forward(layer, x):
    return (silu(x @ layer["w1"]) * (x @ layer["w3"])) @ layer["w2"]


def transformer(params, tokens, args: ModelArgs):
    # tokens [B, L] -> logits [B, L, vocab]
    _, L = tokens.shape
    h = params["tok_embeddings"][tokens]
    freqs_cos, freqs_sin = precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len)
    freqs_cos, freqs_sin = freqs_cos[:L], freqs_sin[:L]
    for layer in params["layers"]:
        h = h + attention(layer, rms_norm(h, layer["attention_norm"], args.norm_eps), freqs_cos, freqs_sin, args)
        h = h + feed_forward(layer, rms_norm(h, layer["ffn_norm"], args.norm_eps))
    h = rms_norm(h, params["norm"], args.norm_eps)
    return h @ params["output"]


def cross_entropy(params, tokens, targets, args: ModelArgs):
    logits = transformer(params, tokens, args)
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    B, L = targets.shape
    return -np.mean(logp[np.arange(B)[:, None], np.arange(L)[None, :], targets])
