"""A decoder with a KV cache held on its attention objects (the numpy LLaMA-3 port style).

``Attention.__init__`` preallocates ``self.cache_k``/``self.cache_v``; every ``__call__`` writes
the new keys and values at ``start_pos`` and attends over everything cached so far. ``generate``
is the usual greedy loop: the prompt first, then one token per call.
"""

import numpy as np


def softmax(x):
    exp_x = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return exp_x / np.sum(exp_x, axis=-1, keepdims=True)


def silu(x):
    return x * (1 / (1 + np.exp(-x)))


class RMSNorm:
    def __init__(self, weight, eps):
        self.weight = weight
        self.eps = eps

    def __call__(self, x):
        z = (x**2).mean(-1, keepdims=True) + self.eps
        return x / np.sqrt(z) * self.weight


class FeedForward:
    def __init__(self, up_weight, gate_weight, down_weight):
        self.up_weight = up_weight.T
        self.gate_weight = gate_weight.T
        self.down_weight = down_weight.T

    def __call__(self, x):
        swish = silu(x @ self.gate_weight)
        return (swish * (x @ self.up_weight)) @ self.down_weight


class Attention:
    def __init__(self, q_weight, k_weight, v_weight, o_weight, args):
        self.n_heads = args["n_heads"]
        self.n_kv_heads = args["n_kv_heads"]
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args["dim"] // self.n_heads
        self.q_weight = q_weight.T
        self.k_weight = k_weight.T
        self.v_weight = v_weight.T
        self.o_weight = o_weight.T
        cache_shape = (args["max_batch_size"], args["max_seq_len"], self.n_kv_heads, self.head_dim)
        self.cache_k = np.zeros(cache_shape, dtype=np.float32)
        self.cache_v = np.zeros(cache_shape, dtype=np.float32)

    def __call__(self, x, start_pos, mask):
        B, L, _ = x.shape
        xq = (x @ self.q_weight).reshape(B, L, self.n_heads, self.head_dim)
        xk = (x @ self.k_weight).reshape(B, L, self.n_kv_heads, self.head_dim)
        xv = (x @ self.v_weight).reshape(B, L, self.n_kv_heads, self.head_dim)

        self.cache_k[:B, start_pos : start_pos + L] = xk
        self.cache_v[:B, start_pos : start_pos + L] = xv
        ks = self.cache_k[:B, : start_pos + L]
        vs = self.cache_v[:B, : start_pos + L]

        xk = np.repeat(ks, self.n_rep, axis=2)  # [B, T, n_heads, head_dim]
        xv = np.repeat(vs, self.n_rep, axis=2)
        xq = xq.transpose(0, 2, 1, 3)
        xk = xk.transpose(0, 2, 1, 3)
        xv = xv.transpose(0, 2, 1, 3)
        attn = xq @ xk.transpose(0, 1, 3, 2) / np.sqrt(self.head_dim)  # [B, H, L, T]
        if mask is not None:
            attn = attn + mask[None, None, :, :]
        attn = softmax(attn)
        out = (attn @ xv).transpose(0, 2, 1, 3).reshape(B, L, -1)
        return out @ self.o_weight


class TransformerBlock:
    def __init__(self, weight, layer_id, args):
        p = f"model.layers.{layer_id}."
        self.attention = Attention(
            weight[p + "self_attn.q_proj.weight"],
            weight[p + "self_attn.k_proj.weight"],
            weight[p + "self_attn.v_proj.weight"],
            weight[p + "self_attn.o_proj.weight"],
            args,
        )
        self.feed_forward = FeedForward(
            weight[p + "mlp.up_proj.weight"], weight[p + "mlp.gate_proj.weight"], weight[p + "mlp.down_proj.weight"]
        )
        self.input_layernorm = RMSNorm(weight[p + "input_layernorm.weight"], args["norm_eps"])
        self.post_attention_layernorm = RMSNorm(weight[p + "post_attention_layernorm.weight"], args["norm_eps"])

    def __call__(self, x, start_pos, mask):
        h = x + self.attention(self.input_layernorm(x), start_pos, mask)
        return h + self.feed_forward(self.post_attention_layernorm(h))


class Llama:
    def __init__(self, weight, args):
        self.args = args
        self.tok_embedding = weight["model.embed_tokens.weight"]
        self.layers = [TransformerBlock(weight, i, args) for i in range(args["n_layers"])]
        self.norm = RMSNorm(weight["model.norm.weight"], args["norm_eps"])
        self.lm_head_weight = weight["lm_head.weight"].T

    def forward(self, input_ids, start_pos):
        # input_ids [B, L] -> logits of the last position [B, vocab]
        _, L = input_ids.shape
        h = self.tok_embedding[input_ids]
        mask = None
        if L > 1:
            mask = np.full((L, L), float("-inf"))
            mask = np.triu(mask, k=1)
            mask = np.concatenate([np.zeros((L, start_pos)), mask], axis=1)
        for layer in self.layers:
            h = layer(h, start_pos, mask)
        h = self.norm(h)
        return h[:, [-1], :] @ self.lm_head_weight

    def generate(self, input_ids, max_new_tokens, forward=None):
        forward = forward or self.forward
        _, L = input_ids.shape
        tokens = input_ids
        next_id = input_ids
        for i, curr_pos in enumerate(range(L, L + max_new_tokens)):
            inputs = input_ids if i == 0 else next_id
            start_pos = 0 if i == 0 else curr_pos - 1
            logits = forward(inputs, start_pos)
            next_id = logits[:, -1, :].argmax(-1, keepdims=True)
            tokens = np.concatenate([tokens, next_id], axis=1)
        return tokens


def make_weights(args, seed=0):
    """Weights named as in a Hugging Face LLaMA checkpoint, [out, in] as torch stores them."""
    rng = np.random.default_rng(seed)
    d, hd = args["dim"], args["dim"] // args["n_heads"]
    kv, ff, vocab = args["n_kv_heads"] * hd, args["ffn_dim"], args["vocab_size"]

    def w(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    weight = {"model.embed_tokens.weight": w(vocab, d), "model.norm.weight": np.ones(d, np.float32)}
    weight["lm_head.weight"] = w(vocab, d)
    for i in range(args["n_layers"]):
        p = f"model.layers.{i}."
        weight[p + "self_attn.q_proj.weight"] = w(d, d)
        weight[p + "self_attn.k_proj.weight"] = w(kv, d)
        weight[p + "self_attn.v_proj.weight"] = w(kv, d)
        weight[p + "self_attn.o_proj.weight"] = w(d, d)
        weight[p + "mlp.up_proj.weight"] = w(ff, d)
        weight[p + "mlp.gate_proj.weight"] = w(ff, d)
        weight[p + "mlp.down_proj.weight"] = w(d, ff)
        weight[p + "input_layernorm.weight"] = np.ones(d, np.float32)
        weight[p + "post_attention_layernorm.weight"] = np.ones(d, np.float32)
    return weight


ARGS = {
    "dim": 16,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "vocab_size": 23,
    "ffn_dim": 32,
    "norm_eps": 1e-5,
    "max_batch_size": 2,
    "max_seq_len": 16,
}
