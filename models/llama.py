"""A LLaMA-style decoder in plain numpy: RMSNorm, rotary position embeddings, grouped-query
attention and a SwiGLU MLP, with an Adam training step on the next-token cross-entropy.

params = {
  "embed": [n_vocab, d],
  "layers": [{"attn_norm": [d], "wq": [d, H*E], "wk": [d, K*E], "wv": [d, K*E], "wo": [H*E, d],
              "mlp_norm": [d], "w1": [d, F], "w3": [d, F], "w2": [F, d]}, ...],
  "norm": [d], "lm_head": [d, n_vocab],
}
H heads of size E = d / H share K key/value heads (grouped-query attention, H % K == 0).

``example_train_specs_8b()`` describes a LLaMA-3-8B-shaped step by types only (32 layers,
d = 4096, 32 heads, 8 key/value heads, F = 14336, a 128256-token vocabulary): what
``graphc compile`` plans without any data.
"""

import numpy as np

import graphc


def rms_norm(x, g, eps=1e-5):
    # [B, T, d] -> [B, T, d]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_tables(T, E, theta=500000.0, dtype=np.float32):
    # -> cos, sin [T, E]: the angle of position t for the pair (i, i + E/2)
    inv = 1.0 / theta ** (np.arange(0, E, 2) / E)  # [E/2]
    angles = np.outer(np.arange(T), inv)  # [T, E/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, E]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def rotate(x, cos, sin):
    # [B, T, h, E], [T, E] -> [B, T, h, E]: the rotate-half form of rotary embeddings
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def attention(x, layer, cos, sin, mask, n_head, n_kv_head):
    # [B, T, d] -> [B, T, d]; mask [T, T] adds -1e9 above the diagonal
    B, T, d = x.shape
    E = d // n_head
    q = (x @ layer["wq"]).reshape(B, T, n_head, E)
    k = (x @ layer["wk"]).reshape(B, T, n_kv_head, E)
    v = (x @ layer["wv"]).reshape(B, T, n_kv_head, E)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    k = np.repeat(k, n_head // n_kv_head, axis=2)  # [B, T, H, E]
    v = np.repeat(v, n_head // n_kv_head, axis=2)
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # [B, H, T, E]
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(E).astype(x.dtype) + mask  # [B, H, T, T]
    out = softmax(scores) @ v  # [B, H, T, E]
    return out.transpose(0, 2, 1, 3).reshape(B, T, n_head * E) @ layer["wo"]


def mlp(x, layer):
    # [B, T, d] -> [B, T, F] -> [B, T, d]
    gate = x @ layer["w1"]
    silu = gate / (1 + np.exp(-gate))
    return (silu * (x @ layer["w3"])) @ layer["w2"]


def llama(params, tokens, n_head, n_kv_head):
    # tokens [B, T] int -> logits [B, T, n_vocab]
    T = tokens.shape[1]
    x = params["embed"][tokens]  # [B, T, d]
    cos, sin = rope_tables(T, x.shape[-1] // n_head, dtype=x.dtype)
    mask = ((1 - np.tri(T, dtype=x.dtype)) * -1e9).astype(x.dtype)  # [T, T]: causal (numpy: bfloat16 * -1e9 is float32)
    for layer in params["layers"]:
        x = x + attention(rms_norm(x, layer["attn_norm"]), layer, cos, sin, mask, n_head, n_kv_head)
        x = x + mlp(rms_norm(x, layer["mlp_norm"]), layer)
    return rms_norm(x, params["norm"]) @ params["lm_head"]


def loss(params, tokens, targets, n_head, n_kv_head):
    # mean next-token cross-entropy; targets [B, T] int
    logits = llama(params, tokens, n_head, n_kv_head)  # [B, T, V]
    B, T, V = logits.shape
    z = logits.reshape(B * T, V)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -logp[np.arange(B * T), targets.reshape(-1)].mean()


def train_step(params, opt_state, tokens, targets, n_head, n_kv_head, lr=3e-4):
    # one Adam step: returns (params, opt_state, loss before the step)
    value, grads = graphc.value_and_grad(loss)(params, tokens, targets, n_head, n_kv_head)
    params, opt_state = graphc.optim.adam(params, grads, opt_state, lr=lr)
    return params, opt_state, value


def init_params(rng, n_vocab, d, n_layer, n_head, n_kv_head, ffn, dtype=np.float32, spec=False):
    """Random weights, or (``spec=True``) graphc.ArraySpecs of their shapes: no memory at all."""

    def w(*shape, scale=0.02):
        if spec:
            return graphc.ArraySpec(shape, dtype)
        return (rng.standard_normal(shape) * scale).astype(dtype)

    def ones(n):
        return graphc.ArraySpec((n,), dtype) if spec else np.ones(n, dtype)

    E = d // n_head
    layers = [
        {
            "attn_norm": ones(d),
            "wq": w(d, n_head * E),
            "wk": w(d, n_kv_head * E),
            "wv": w(d, n_kv_head * E),
            "wo": w(n_head * E, d),
            "mlp_norm": ones(d),
            "w1": w(d, ffn),
            "w3": w(d, ffn),
            "w2": w(ffn, d),
        }
        for _ in range(n_layer)
    ]
    return {"embed": w(n_vocab, d), "layers": layers, "norm": ones(d), "lm_head": w(d, n_vocab)}


def _adam_state(params, spec):
    if spec:
        return {"m": params, "v": params, "t": graphc.ArraySpec((), np.float32)}
    return graphc.optim.adam_init(params)


def example_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, n_kv_head=2, ffn=160, seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(rng, n_vocab, d, n_layer, n_head, n_kv_head, ffn)
    return (params, rng.integers(0, n_vocab, (batch, seq))), {"n_head": n_head, "n_kv_head": n_kv_head}


def example_loss_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, n_kv_head=2, ffn=160, seed=0):
    (params, tokens), kw = example_args(batch, seq, n_vocab, d, n_layer, n_head, n_kv_head, ffn, seed)
    targets = np.random.default_rng(seed + 1).integers(0, n_vocab, (batch, seq))
    return (params, tokens, targets), kw


def example_train_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, n_kv_head=2, ffn=160, seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(rng, n_vocab, d, n_layer, n_head, n_kv_head, ffn)
    tokens = rng.integers(0, n_vocab, (batch, seq))
    targets = rng.integers(0, n_vocab, (batch, seq))
    kw = {"n_head": n_head, "n_kv_head": n_kv_head, "lr": 3e-4}
    return (params, _adam_state(params, False), tokens, targets), kw


def example_train_specs(
    n_layer=32, d=4096, n_head=32, n_kv_head=8, ffn=14336, n_vocab=128256, batch=8, seq=2048, dtype=np.float32
):
    """A training step described by types only (graphc.ArraySpec): LLaMA-3-8B's shape by default."""
    params = init_params(None, n_vocab, d, n_layer, n_head, n_kv_head, ffn, dtype, spec=True)
    tokens = graphc.ArraySpec((batch, seq), np.int64)
    kw = {"n_head": n_head, "n_kv_head": n_kv_head, "lr": 3e-4}
    return (params, _adam_state(params, True), tokens, tokens), kw


def example_train_specs_8b():
    return example_train_specs()


def example_train_specs_8b_12l():
    """LLaMA-3-8B's layer shapes at 12 layers: with ``_48l``, how compile time grows with depth."""
    return example_train_specs(n_layer=12)


def example_train_specs_8b_48l():
    return example_train_specs(n_layer=48)


def example_train_specs_8b_bf16():
    """LLaMA-3-8B's step in bfloat16 on 64 sequences of 2048 tokens (131K tokens, 8 sequences per
    replica on dp=8): ``graphc compile ... --mesh dp=8,tp=8 --profile h100-sxm`` predicts its MFU."""
    return example_train_specs(batch=64, dtype=graphc.bfloat16)
