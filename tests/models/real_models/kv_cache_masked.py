"""A decoder whose KV cache is read at its full length under a mask (the style of JAX / Flax
decoders and of numpy ports of them): ``start_pos`` only places the new keys and values
(``cache[:, pos:pos + L] = k``) and masks the positions not written yet, so every decode step
has the same shapes. The model, weights and greedy loop are kv_cache.py's (llama3.np's layout).
"""

import numpy as np

from tests.models.real_models.kv_cache import FeedForward, RMSNorm, make_weights, softmax

__all__ = ["Llama", "make_weights"]


class Attention:
    def __init__(self, q_weight, k_weight, v_weight, o_weight, args):
        self.n_heads = args["n_heads"]
        self.n_kv_heads = args["n_kv_heads"]
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args["dim"] // self.n_heads
        self.max_seq_len = args["max_seq_len"]
        self.q_weight = q_weight.T
        self.k_weight = k_weight.T
        self.v_weight = v_weight.T
        self.o_weight = o_weight.T
        cache_shape = (args["max_batch_size"], args["max_seq_len"], self.n_kv_heads, self.head_dim)
        self.cache_k = np.zeros(cache_shape, dtype=np.float32)
        self.cache_v = np.zeros(cache_shape, dtype=np.float32)

    def __call__(self, x, start_pos):
        B, L, _ = x.shape
        xq = (x @ self.q_weight).reshape(B, L, self.n_heads, self.head_dim)
        xk = (x @ self.k_weight).reshape(B, L, self.n_kv_heads, self.head_dim)
        xv = (x @ self.v_weight).reshape(B, L, self.n_kv_heads, self.head_dim)

        self.cache_k[:B, start_pos : start_pos + L] = xk
        self.cache_v[:B, start_pos : start_pos + L] = xv
        ks = np.repeat(self.cache_k[:B], self.n_rep, axis=2).transpose(0, 2, 1, 3)  # [B, H, T_max, hd]
        vs = np.repeat(self.cache_v[:B], self.n_rep, axis=2).transpose(0, 2, 1, 3)

        # query i sits at start_pos + i and sees the cached positions up to it
        query_pos = start_pos + np.arange(L)
        visible = np.arange(self.max_seq_len)[None, :] <= query_pos[:, None]  # [L, T_max]
        attn = xq.transpose(0, 2, 1, 3) @ ks.transpose(0, 1, 3, 2) / np.sqrt(self.head_dim)
        attn = np.where(visible[None, None], attn, -np.inf)
        attn = softmax(attn)
        out = (attn @ vs).transpose(0, 2, 1, 3).reshape(B, L, -1)
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

    def __call__(self, x, start_pos):
        h = x + self.attention(self.input_layernorm(x), start_pos)
        return h + self.feed_forward(self.post_attention_layernorm(h))


class Llama:
    def __init__(self, weight, args):
        self.args = args
        self.tok_embedding = weight["model.embed_tokens.weight"]
        self.layers = [TransformerBlock(weight, i, args) for i in range(args["n_layers"])]
        self.norm = RMSNorm(weight["model.norm.weight"], args["norm_eps"])
        self.lm_head_weight = weight["lm_head.weight"].T

    def forward(self, input_ids, start_pos):
        h = self.tok_embedding[input_ids]
        for layer in self.layers:
            h = layer(h, start_pos)
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
