"""A GPT-3-style decoder in plain numpy, as a Megatron user writes it for mixed precision:
bfloat16 parameters and activations, a fused QKV projection split with one reshape and
transpose, learned position embeddings, GELU MLP, tied input/output embedding, and an Adam step
whose moments are float32 (the update is computed in float32 and cast back to the parameters'
dtype).

params = {
  "wte": [n_vocab, d], "wpe": [n_ctx, d],
  "blocks": [{"ln_1": {"g": [d], "b": [d]}, "qkv": {"w": [d, 3d], "b": [3d]}, "proj": {"w": [d, d], "b": [d]},
              "ln_2": {"g": [d], "b": [d]}, "fc": {"w": [d, 4d], "b": [4d]}, "out": {"w": [4d, d], "b": [d]}}, ...],
  "ln_f": {"g": [d], "b": [d]},
}

``example_train_specs_175b(n_layer)`` describes GPT-3 175B's shapes by types only (d = 12288,
96 heads, sequence 2048, vocabulary 51200; 8 sequences per data-parallel rank of ``dp=8``):
what ``graphc compile`` plans without any data. Slices of a few layers are the planning
benchmarks of ``graphc bench plantime``.
"""

import math

import numpy as np

import graphc


def gelu(x):
    # tanh approximation, elementwise
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def layer_norm(x, g, b, eps=1e-5):
    # [B, T, d] -> [B, T, d]
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def attention(x, qkv, proj, n_head):
    # [B, T, d] -> [B, T, d]
    B, T, d = x.shape
    E = d // n_head
    q, k, v = (x @ qkv["w"] + qkv["b"]).reshape(B, T, 3, n_head, E).transpose(2, 0, 3, 1, 4)  # 3 x [B, H, T, E]
    mask = ((1 - np.tri(T, dtype=np.float32)) * -1e9).astype(x.dtype)  # [T, T]: causal
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(E).astype(x.dtype) + mask  # [B, H, T, T]
    e = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    out = (e / np.sum(e, axis=-1, keepdims=True)) @ v  # [B, H, T, E]
    return out.transpose(0, 2, 1, 3).reshape(B, T, d) @ proj["w"] + proj["b"]


def block(x, blk, n_head):
    # [B, T, d] -> [B, T, d]
    x = x + attention(layer_norm(x, **blk["ln_1"]), blk["qkv"], blk["proj"], n_head)
    h = gelu(layer_norm(x, **blk["ln_2"]) @ blk["fc"]["w"] + blk["fc"]["b"])  # [B, T, 4d]
    return x + h @ blk["out"]["w"] + blk["out"]["b"]


def loss(params, tokens, targets, n_head):
    # mean next-token cross-entropy (in float32); tokens, targets [B, T] int
    B, T = tokens.shape
    x = params["wte"][tokens] + params["wpe"][:T]  # [B, T, d]
    for blk in params["blocks"]:
        x = block(x, blk, n_head)
    logits = (layer_norm(x, **params["ln_f"]) @ params["wte"].T).astype(np.float32)  # [B, T, V]
    z = logits.reshape(B * T, -1)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -logp[np.arange(B * T), targets.reshape(-1)].mean()


def train_step(params, opt_state, tokens, targets, n_head, lr=6e-5, b1=0.9, b2=0.95, eps=1e-8):
    # one Adam step, moments and update in float32: returns (params, opt_state, loss before the step)
    value, grads = graphc.value_and_grad(loss)(params, tokens, targets, n_head)
    t = opt_state["t"] + 1
    g32 = graphc.tree_map(lambda g: g.astype(np.float32), grads)
    m = graphc.tree_map(lambda m, g: b1 * m + (1 - b1) * g, opt_state["m"], g32)
    v = graphc.tree_map(lambda v, g: b2 * v + (1 - b2) * (g * g), opt_state["v"], g32)
    c1, c2 = 1 - b1**t, 1 - b2**t  # bias corrections

    def update(p, m_, v_):
        return (p.astype(np.float32) - lr * (m_ / c1) / (np.sqrt(v_ / c2) + eps)).astype(p.dtype)

    return graphc.tree_map(update, params, m, v), {"m": m, "v": v, "t": t}, value


def init_params(rng, n_vocab, n_ctx, d, n_layer, dtype=graphc.bfloat16, spec=False):
    """Random weights, or (``spec=True``) graphc.ArraySpecs of their shapes: no memory at all."""

    def w(*shape, scale=0.02):
        if spec:
            return graphc.ArraySpec(shape, dtype)
        return (rng.standard_normal(shape) * scale).astype(dtype)

    def zeros(n):
        return graphc.ArraySpec((n,), dtype) if spec else np.zeros(n, dtype)

    def ln():
        return {"g": graphc.ArraySpec((d,), dtype) if spec else np.ones(d, dtype), "b": zeros(d)}

    def lin(d_in, d_out):
        return {"w": w(d_in, d_out), "b": zeros(d_out)}

    blocks = [
        {"ln_1": ln(), "qkv": lin(d, 3 * d), "proj": lin(d, d), "ln_2": ln(), "fc": lin(d, 4 * d), "out": lin(4 * d, d)}
        for _ in range(n_layer)
    ]
    return {"wte": w(n_vocab, d), "wpe": w(n_ctx, d, scale=0.01), "blocks": blocks, "ln_f": ln()}


def adam_state(params, spec=False):
    """float32 moments shaped like ``params``, and the step count."""
    if spec:
        m = graphc.tree_map(lambda a: graphc.ArraySpec(a.shape, np.float32), params)
        return {"m": m, "v": m, "t": graphc.ArraySpec((), np.float32)}
    zeros = graphc.tree_map(lambda a: np.zeros(a.shape, np.float32), params)
    return {"m": zeros, "v": graphc.tree_map(np.copy, zeros), "t": np.zeros((), np.float32)}


def example_train_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, dtype=np.float32, seed=0):
    """Small and runnable (float32 by default, so numpy can check it)."""
    rng = np.random.default_rng(seed)
    params = init_params(rng, n_vocab, seq, d, n_layer, dtype)
    tokens = rng.integers(0, n_vocab, (batch, seq))
    targets = rng.integers(0, n_vocab, (batch, seq))
    return (params, adam_state(params), tokens, targets), {"n_head": n_head}


def example_train_specs(n_layer=96, d=12288, n_head=96, seq=2048, n_vocab=51200, batch=64):
    """A training step described by types only (graphc.ArraySpec): GPT-3 175B's shapes by
    default, bfloat16 parameters and float32 Adam moments."""
    params = init_params(None, n_vocab, seq, d, n_layer, spec=True)
    tokens = graphc.ArraySpec((batch, seq), np.int64)
    return (params, adam_state(params, spec=True), tokens, tokens), {"n_head": n_head}


def example_train_specs_175b_4l():
    """A 4-layer slice of GPT-3 175B, 64 sequences (8 per data-parallel rank of dp=8)."""
    return example_train_specs(n_layer=4)


def example_train_specs_175b_12l():
    return example_train_specs(n_layer=12)
