"""A small transformer classifier written with einops, as modern model code is: heads split and
merged with ``rearrange``, a class token copied over the batch with ``repeat``, attention scores with
``einops.einsum``, and pooling with ``reduce``.
"""

import einops
import numpy as np
from einops import rearrange, reduce, repeat


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def attention(x, p, heads):
    # x: [b, t, d] -> [b, t, d]
    q, k, v = np.split(x @ p["w_qkv"], 3, axis=-1)  # each [b, t, d]
    q = rearrange(q, "b t (h e) -> b h t e", h=heads)
    k = rearrange(k, "b t (h e) -> b h t e", h=heads)
    v = rearrange(v, "b t (h e) -> b h t e", h=heads)
    scores = einops.einsum(q, k, "b h t e, b h s e -> b h t s") / np.sqrt(q.shape[-1])
    out = einops.einsum(softmax(scores), v, "b h t s, b h s e -> b h t e")
    return rearrange(out, "b h t e -> b t (h e)") @ p["w_out"]


def classify(p, x, heads=2):
    # x: [b, t, d] -> logits: [b, classes]
    cls = repeat(p["cls"], "d -> b 1 d", b=x.shape[0])
    h = np.concatenate([cls, x], axis=1)  # [b, 1 + t, d]
    h = h + attention(h, p, heads)
    pooled = reduce(h[:, 1:], "b (t two) d -> b t d", "max", two=2)  # neighbouring tokens, pairwise max
    summary = reduce(pooled, "b t d -> b d", "mean") + h[:, 0]
    return summary @ p["w_head"]


def loss(p, x, labels, heads=2):
    logits = classify(p, x, heads)
    logits = logits - np.max(logits, axis=-1, keepdims=True)
    log_probs = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
    return -np.mean(log_probs[np.arange(len(labels)), labels])


def init_params(rng, d, classes):
    return {
        "w_qkv": rng.standard_normal((d, 3 * d)) / np.sqrt(d),
        "w_out": rng.standard_normal((d, d)) / np.sqrt(d),
        "cls": 0.1 * rng.standard_normal(d),
        "w_head": rng.standard_normal((d, classes)) / np.sqrt(d),
    }
