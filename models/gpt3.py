"""A GPT-3-style decoder in plain numpy, as Megatron-LM trains it: pre-LayerNorm blocks, one fused
QKV projection split by ``reshape(B, T, 3, H, E).transpose(2, 0, 3, 1, 4)``, GELU, a tied
embedding, bfloat16 parameters with float32 Adam moments (the update runs in float32 and is cast
back to the parameters' dtype), and, given a Generator ``rng`` and ``dropout_p``, Megatron-LM's
dropout: on the embeddings, the attention probabilities and each branch's output.

params = {
  "wte": [n_vocab, d], "wpe": [n_ctx, d],
  "blocks": [{"ln_1": {"g", "b"}, "qkv": {"w": [d, 3d], "b"}, "proj": {"w": [d, d], "b"},
              "ln_2": {"g", "b"}, "fc": {"w": [d, 4d], "b"}, "out": {"w": [4d, d], "b"}}, ...],
  "ln_f": {"g", "b"},
}

The ``example_*`` functions describe steps by types only (graphc.ArraySpec: no memory is
allocated), for planning: the shapes of GPT-3 175B and 13B (Brown et al. 2020, table 2.1) at
the global batch sizes Megatron-LM trained them with (Narayanan et al. 2021, table 1), and a
small one that runs.
"""

import math

import numpy as np

import graphc


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def layer_norm(x, g, b, eps=1e-5):
    # [B, T, d] -> [B, T, d]
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def dropout(x, rng, p):
    # [...] -> [...]: each element kept with probability 1 - p and scaled by 1 / (1 - p), as
    # torch.nn.functional.dropout (Megatron-LM's); none without a generator
    if rng is None or not p:
        return x
    keep = rng.random(x.shape, dtype=np.float32) >= p
    return np.where(keep, x * (1 / (1 - p)), 0)


def attention(x, qkv, proj, mask, n_head, rng=None, p=0.0):
    # [B, T, d] -> [B, T, d]
    B, T, d = x.shape
    E = d // n_head
    fused = (x @ qkv["w"] + qkv["b"]).reshape(B, T, 3, n_head, E).transpose(2, 0, 3, 1, 4)  # [3, B, H, T, E]
    q, k, v = fused[0], fused[1], fused[2]
    scores = q @ k.swapaxes(-1, -2) * (1.0 / math.sqrt(E)) + mask  # [B, H, T, T]
    e = np.exp(scores - np.max(scores, axis=-1, keepdims=True))
    out = dropout(e / np.sum(e, axis=-1, keepdims=True), rng, p) @ v  # [B, H, T, E]
    return out.transpose(0, 2, 1, 3).reshape(B, T, d) @ proj["w"] + proj["b"]


def block(x, p, mask, n_head, rng=None, p_drop=0.0):
    # [B, T, d] -> [B, T, d]; dropout on the attention probabilities and on both branches' outputs
    x = x + dropout(attention(layer_norm(x, **p["ln_1"]), p["qkv"], p["proj"], mask, n_head, rng, p_drop), rng, p_drop)
    h = gelu(layer_norm(x, **p["ln_2"]) @ p["fc"]["w"] + p["fc"]["b"])  # [B, T, 4d]
    return x + dropout(h @ p["out"]["w"] + p["out"]["b"], rng, p_drop)


def loss(params, tokens, targets, n_head, rng=None, dropout_p=0.0):
    # tokens, targets [B, T] int -> mean next-token cross-entropy (in float32); dropout_p with a
    # Generator rng: Megatron-LM's dropout on the embeddings, attention probabilities and branches
    T = tokens.shape[1]
    x = dropout(params["wte"][tokens] + params["wpe"][np.arange(T)], rng, dropout_p)  # [B, T, d]
    mask = ((1 - np.tri(T, dtype=np.float32)) * -1e9).astype(x.dtype)  # [T, T] causal
    for p in params["blocks"]:
        x = block(x, p, mask, n_head, rng, dropout_p)
    logits = (layer_norm(x, **params["ln_f"]) @ params["wte"].T).astype(np.float32)  # [B, T, V]
    B, _T, V = logits.shape
    z = logits.reshape(B * T, V)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -logp[np.arange(B * T), targets.reshape(-1)].mean()


def adam_mixed(params, grads, state, lr, b1=0.9, b2=0.95, eps=1e-8):
    """Adam with float32 moments for low-precision parameters: the update is computed in float32
    and cast back to each parameter's dtype (Megatron-LM's mixed precision keeps a float32 master
    copy as well; this step keeps the moments only)."""
    t = state["t"] + 1
    m = graphc.tree_map(lambda m, g: b1 * m + (1 - b1) * g.astype(np.float32), state["m"], grads)
    v = graphc.tree_map(lambda v, g: b2 * v + (1 - b2) * np.square(g.astype(np.float32)), state["v"], grads)
    c1, c2 = 1 - b1**t, 1 - b2**t

    def update(p, m_, v_):
        return (p.astype(np.float32) - lr * (m_ / c1) / (np.sqrt(v_ / c2) + eps)).astype(p.dtype)

    return graphc.tree_map(update, params, m, v), {"m": m, "v": v, "t": t}


def train_step(params, opt_state, tokens, targets, n_head, lr=6e-5, rng=None, dropout_p=0.0):
    # one mixed-precision Adam step: returns (params, opt_state, loss before the step)
    value, grads = graphc.value_and_grad(loss)(params, tokens, targets, n_head, rng, dropout_p)
    params, opt_state = adam_mixed(params, grads, opt_state, lr)
    return params, opt_state, value


def init_params(rng, n_vocab, n_ctx, d, n_layer, dtype=np.float32, spec=False):
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


def _state(params, spec):
    if spec:
        f32 = graphc.tree_map(lambda a: graphc.ArraySpec(a.shape, np.float32), params)
        return {"m": f32, "v": f32, "t": graphc.ArraySpec((), np.float32)}
    zeros = graphc.tree_map(lambda a: np.zeros(a.shape, np.float32), params)
    return {"m": zeros, "v": graphc.tree_map(np.copy, zeros), "t": np.zeros((), np.float32)}


def example_train_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, seed=0):
    """A small float32 step with data, that runs."""
    rng = np.random.default_rng(seed)
    params = init_params(rng, n_vocab, seq, d, n_layer)
    tokens = rng.integers(0, n_vocab, (batch, seq))
    targets = rng.integers(0, n_vocab, (batch, seq))
    return (params, _state(params, False), tokens, targets), {"n_head": n_head, "lr": 6e-5}


def example_loss_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, seed=0):
    """The loss's arguments: small float32 weights with data."""
    (params, _state, tokens, targets), kw = example_train_args(batch, seq, n_vocab, d, n_layer, n_head, seed)
    return (params, tokens, targets), {"n_head": kw["n_head"]}


def example_train_specs(n_layer=96, d=12288, n_head=96, seq=2048, n_vocab=51200, batch=1536, dtype=None, dropout_p=0.1):
    """A training step by types only: GPT-3 175B's shape at Megatron-LM's global batch by default,
    bfloat16 parameters and float32 Adam moments, and Megatron-LM's dropout (its defaults,
    ``--hidden-dropout 0.1 --attention-dropout 0.1``, which its GPT-3 175B example script keeps:
    megatron/arguments.py, examples/pretrain_gpt3_175B.sh) drawn from a Philox Generator."""
    dtype = graphc.bfloat16 if dtype is None else dtype
    params = init_params(None, n_vocab, seq, d, n_layer, dtype, spec=True)
    tokens = graphc.ArraySpec((batch, seq), np.int64)
    kw = {"n_head": n_head, "lr": 6e-5}
    if dropout_p:
        kw |= {"rng": np.random.Generator(np.random.Philox(0)), "dropout_p": dropout_p}
    return (params, _state(params, True), tokens, tokens), kw


def example_train_specs_small():
    """Four small layers in bfloat16 on 32 sequences of 16 tokens: the block search in seconds."""
    return example_train_specs(n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=32)


def example_train_specs_175b():
    """GPT-3 175B (96 layers, d = 12288, 96 heads, 2048 tokens, 51200-token vocabulary) on
    Megatron-LM's global batch of 1,536 sequences."""
    return example_train_specs()


def example_train_specs_175b_4l():
    """Four layers of the 175B shapes, 64 sequences (8 per replica on dp=8)."""
    return example_train_specs(n_layer=4, batch=64)


def example_train_specs_175b_12l():
    return example_train_specs(n_layer=12, batch=64)


def example_train_specs_13b():
    """GPT-3 13B (40 layers, d = 5120, 40 heads) on 512 sequences of 2048 tokens: the 1M-token
    batch Brown et al. 2020 (table 2.1) trained 13B with."""
    return example_train_specs(n_layer=40, d=5120, n_head=40, batch=512)
