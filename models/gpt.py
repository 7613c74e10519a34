"""A GPT-2 style decoder in plain numpy (after picoGPT), batched; the training step uses graphc.grad.

params = {
  "wte": [n_vocab, d], "wpe": [n_ctx, d],
  "blocks": [{"ln_1": {"g", "b"}, "attn": {"c_attn": {"w": [d, 3d], "b"}, "c_proj": {"w": [d, d], "b"}},
              "ln_2": {"g", "b"}, "mlp": {"c_fc": {"w": [d, 4d], "b"}, "c_proj": {"w": [4d, d], "b"}}}, ...],
  "ln_f": {"g", "b"},
}
"""

import math

import numpy as np

import graphc


def gelu(x):
    # Python floats keep float32 activations float32 (a numpy float64 scalar would promote them)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def linear(x, w, b):
    # [..., d_in] @ [d_in, d_out] + [d_out] -> [..., d_out]
    return x @ w + b


def ffn(x, c_fc, c_proj):
    # [B, T, d] -> [B, T, 4d] -> [B, T, d]
    return linear(gelu(linear(x, **c_fc)), **c_proj)


def attention(q, k, v, mask):
    # [B, H, T, dh] x3, [T, T] -> [B, H, T, dh]
    return softmax(q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]) + mask) @ v


def mha(x, c_attn, c_proj, n_head):
    # [B, T, d] -> [B, T, d]
    B, T, d = x.shape
    qkv = linear(x, **c_attn)  # [B, T, 3d]
    q, k, v = (h.reshape(B, T, n_head, d // n_head).transpose(0, 2, 1, 3) for h in np.split(qkv, 3, axis=-1))
    causal_mask = (1 - np.tri(T, dtype=x.dtype)) * -1e10  # [T, T]
    out = attention(q, k, v, causal_mask)  # [B, H, T, dh]
    return linear(out.transpose(0, 2, 1, 3).reshape(B, T, d), **c_proj)


def transformer_block(x, mlp, attn, ln_1, ln_2, n_head):
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)
    return x + ffn(layer_norm(x, **ln_2), **mlp)


def gpt(params, tokens, n_head):
    # tokens [B, T] int -> logits [B, T, n_vocab]
    T = tokens.shape[1]
    x = params["wte"][tokens] + params["wpe"][np.arange(T)]  # [B, T, d]
    for block in params["blocks"]:
        x = transformer_block(x, **block, n_head=n_head)
    x = layer_norm(x, **params["ln_f"])
    return x @ params["wte"].T


def lm_loss(params, tokens, targets, n_head):
    # mean next-token cross-entropy; targets [B, T] int
    logits = gpt(params, tokens, n_head)  # [B, T, V]
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    B, T, V = logits.shape
    flat = logp.reshape(B * T, V)
    return -flat[np.arange(B * T), targets.reshape(-1)].mean()


def train_step(params, opt_state, tokens, targets, n_head, lr=1e-3):
    # one Adam step on the language-model loss: returns (params, opt_state, loss before the step)
    loss, grads = graphc.value_and_grad(lm_loss)(params, tokens, targets, n_head)
    params, opt_state = graphc.optim.adam(params, grads, opt_state, lr=lr)
    return params, opt_state, loss


def ln_params(d, dtype=np.float32):
    return {"g": np.ones(d, dtype), "b": np.zeros(d, dtype)}


def linear_params(w, d_in, d_out, dtype=np.float32):
    # w(*shape) makes a weight; the bias starts at zero
    return {"w": w(d_in, d_out), "b": np.zeros(d_out, dtype)}


def block_params(w, d, dtype=np.float32):
    # one transformer_block's weights, drawn by w in the order c_attn, c_proj, c_fc, c_proj
    return {
        "ln_1": ln_params(d, dtype),
        "attn": {"c_attn": linear_params(w, d, 3 * d, dtype), "c_proj": linear_params(w, d, d, dtype)},
        "ln_2": ln_params(d, dtype),
        "mlp": {"c_fc": linear_params(w, d, 4 * d, dtype), "c_proj": linear_params(w, 4 * d, d, dtype)},
    }


def init_params(rng, n_vocab, n_ctx, d, n_layer, dtype=np.float32, zeros=False):
    """Random weights; ``zeros=True`` gives all-zero weights without touching memory (for
    benchmarks of tracing large models)."""

    def w(*shape, scale=0.02):
        if zeros:
            return np.zeros(shape, dtype)
        return (rng.standard_normal(shape) * scale).astype(dtype)

    blocks = [block_params(w, d, dtype) for _ in range(n_layer)]
    return {"wte": w(n_vocab, d), "wpe": w(n_ctx, d, scale=0.01), "blocks": blocks, "ln_f": ln_params(d, dtype)}


def example_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(rng, n_vocab, seq, d, n_layer)
    tokens = rng.integers(0, n_vocab, size=(batch, seq))
    return (params, tokens), {"n_head": n_head}


def example_loss_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, seed=0):
    (params, tokens), kw = example_args(batch, seq, n_vocab, d, n_layer, n_head, seed)
    targets = np.random.default_rng(seed + 1).integers(0, n_vocab, size=(batch, seq))
    return (params, tokens, targets), kw


def example_args_48l():
    """The issue-2 benchmark size: 48 layers, d=1024 (zero weights; 2.4 GB, lazily allocated)."""
    rng = np.random.default_rng(0)
    params = init_params(rng, n_vocab=1024, n_ctx=64, d=1024, n_layer=48, zeros=True)
    tokens = rng.integers(0, 1024, size=(1, 64))
    return (params, tokens), {"n_head": 16}


def example_train_args(batch=2, seq=16, n_vocab=128, d=64, n_layer=2, n_head=4, seed=0):
    (params, tokens, targets), kw = example_loss_args(batch, seq, n_vocab, d, n_layer, n_head, seed)
    return (params, graphc.optim.adam_init(params), tokens, targets), {**kw, "lr": 1e-3}


def example_args_bench():
    """The issue-5 benchmark size: a transformer of d=512, 8 heads, 2 blocks, batch 8 x 256 tokens."""
    return example_args(batch=8, seq=256, n_vocab=1024, d=512, n_layer=2, n_head=8)


def example_train_args_bench():
    return example_train_args(batch=8, seq=256, n_vocab=1024, d=512, n_layer=2, n_head=8)


def example_loss_args_bench():
    """The loss alone (a forward pass) at the benchmark size of ``example_args_bench``."""
    return example_loss_args(batch=8, seq=256, n_vocab=1024, d=512, n_layer=2, n_head=8)


def example_train_specs(n_layer=12, d=768, n_head=12, batch=8, seq=256, n_vocab=1024):
    """A GPT-2-small-shaped training step described by types only (graphc.ArraySpec: no data is
    allocated), for planning benchmarks: ``graphc compile models/gpt.py:train_step
    --example example_train_specs --mesh dp=2,tp=4``."""
    rng = np.random.default_rng(0)
    params = graphc.tree_map(
        lambda a: graphc.ArraySpec(a.shape, a.dtype), init_params(rng, n_vocab, seq, d, n_layer, zeros=True)
    )
    state = {"m": params, "v": params, "t": graphc.ArraySpec((), np.float32)}
    tokens = graphc.ArraySpec((batch, seq), np.int64)
    return (params, state, tokens, tokens), {"n_head": n_head, "lr": 1e-3}


def example_train_specs_24l():
    return example_train_specs(n_layer=24)


def example_train_specs_48l():
    return example_train_specs(n_layer=48)


def example_train_specs_1000l():
    """1,000 layers of d=256 (Aceso's depth): how planning time grows with depth alone."""
    return example_train_specs(n_layer=1000, d=256, n_head=4, batch=8, seq=128)
