"""A hand-written numpy forward and backward of the GPT language-model loss of models/gpt.py
(``lm_loss``): the "hand-written numpy forward plus backward" peer of the training-step figures.

It computes what ``graphc.value_and_grad(gpt.lm_loss)`` computes, written the way a numpy user
who wants speed writes a backward by hand:

* the forward keeps what the backward needs (normalized activations and inverse deviations of
  each layer norm, the attention probabilities, the GELU's input and tanh);
* a weight gradient is one matmul on the flattened batch (``X.reshape(-1, d).T @ G.reshape(-1, n)``),
  a bias gradient one sum over the flattened batch;
* the q/k/v gradients are written into one [B, T, 3d] buffer, the gradient of the fused
  ``c_attn`` projection's output;
* the token embedding gets its rows with one ``np.add.at``, plus the tied output projection's
  ``dlogits^T @ x``;
* constants are Python floats, so float32 models stay float32 (numpy's promotion, NEP 50).

    loss, grads = gpt_loss_and_grads_numpy(params, tokens, targets, n_head)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

GELU_C = math.sqrt(2 / math.pi)  # a Python float: float32 stays float32
GELU_A = 0.044715
LN_EPS = 1e-5
MASK_VALUE = -1e10  # the additive causal mask of models/gpt.py


# --- layer norm -----------------------------------------------------------------------------------


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, tuple]:
    # [N, d] -> [N, d]; keeps the normalized input and 1 / std for the backward
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + LN_EPS)
    xhat = xc * rstd
    return xhat * g + b, (xhat, rstd, g)


def _layer_norm_back(dout: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # dout [N, d] -> dx [N, d], dg [d], db [d]
    xhat, rstd, g = cache
    dg = (dout * xhat).sum(axis=0)
    db = dout.sum(axis=0)
    dxhat = dout * g
    # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    dx = dxhat - dxhat.mean(axis=-1, keepdims=True)
    dx -= xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    dx *= rstd
    return dx, dg, db


# --- linear layers --------------------------------------------------------------------------------


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    # [N, n_in] @ [n_in, n_out] + [n_out] -> [N, n_out]: one matmul over the flattened batch
    out = x @ w
    out += b
    return out


def _linear_back(x: np.ndarray, w: np.ndarray, dout: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    # x [N, n_in], dout [N, n_out] -> dx [N, n_in], {"w": [n_in, n_out], "b": [n_out]}
    return dout @ w.T, {"w": x.T @ dout, "b": dout.sum(axis=0)}


# --- one transformer block ------------------------------------------------------------------------
# Activations are [N, d] with N = B * T rows (the flattened batch); attention views them as
# [B, H, T, dh] heads.


def _block_forward(
    x: np.ndarray, block: dict, shape: tuple[int, int, int], mask: np.ndarray
) -> tuple[np.ndarray, dict]:
    # [N, d] -> [N, d], and what the backward needs
    B, T, n_head = shape
    N, d = x.shape
    dh = d // n_head
    attn, mlp = block["attn"], block["mlp"]

    h1, ln1 = _layer_norm(x, **block["ln_1"])
    qkv = _linear(h1, **attn["c_attn"])  # [N, 3d]
    heads = qkv.reshape(B, T, 3, n_head, dh).transpose(2, 0, 3, 1, 4)  # [3, B, H, T, dh]
    q, k, v = heads[0], heads[1], heads[2]
    scores = q @ k.swapaxes(-1, -2)  # [B, H, T, T]
    scores *= 1 / math.sqrt(dh)
    scores += mask
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores, out=scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    o = (probs @ v).transpose(0, 2, 1, 3).reshape(N, d)  # [B, H, T, dh] -> [N, d]
    x = x + _linear(o, **attn["c_proj"])

    h2, ln2 = _layer_norm(x, **block["ln_2"])
    u = _linear(h2, **mlp["c_fc"])  # [N, 4d]
    th = np.tanh(GELU_C * (u + GELU_A * (u * u * u)))
    y = 0.5 * u * (1 + th)  # GELU, tanh form
    x = x + _linear(y, **mlp["c_proj"])
    cache = {"ln1": ln1, "h1": h1, "q": q, "k": k, "v": v, "probs": probs, "o": o}
    cache |= {"ln2": ln2, "h2": h2, "u": u, "th": th, "y": y}
    return x, cache


def _block_backward(dx: np.ndarray, block: dict, cache: dict) -> tuple[np.ndarray, dict]:
    # dx [N, d] (the gradient of the block's output) -> the gradient of its input, and of its weights
    N, d = dx.shape
    attn, mlp = block["attn"], block["mlp"]
    B, n_head, T, dh = cache["q"].shape

    # MLP: x + c_proj(gelu(c_fc(ln_2(x))))
    dy, g_mlp_proj = _linear_back(cache["y"], mlp["c_proj"]["w"], dx)  # [N, 4d]
    u, th = cache["u"], cache["th"]
    # d gelu / du = 0.5 (1 + th) + 0.5 c u (1 - th^2) (1 + 3 a u^2)
    du = dy * (0.5 * (1 + th) + (0.5 * GELU_C) * u * (1 - th * th) * (1 + (3 * GELU_A) * (u * u)))
    dh2, g_fc = _linear_back(cache["h2"], mlp["c_fc"]["w"], du)
    dln, g_ln2, b_ln2 = _layer_norm_back(dh2, cache["ln2"])
    dx = dx + dln

    # attention: x + c_proj(attention(split(c_attn(ln_1(x)))))
    do, g_attn_proj = _linear_back(cache["o"], attn["c_proj"]["w"], dx)
    do = do.reshape(B, T, n_head, dh).transpose(0, 2, 1, 3)  # [B, H, T, dh]
    q, k, v, probs = cache["q"], cache["k"], cache["v"], cache["probs"]
    dqkv = np.empty((3, B, n_head, T, dh), dx.dtype)  # the q, k, v gradients in one buffer
    np.matmul(probs.swapaxes(-1, -2), do, out=dqkv[2])  # dv
    dprobs = do @ v.swapaxes(-1, -2)  # [B, H, T, T]
    # softmax: ds = p * (dp - sum(dp * p)); the masked entries have p == 0
    dscores = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))
    dscores *= 1 / math.sqrt(dh)
    np.matmul(dscores, k, out=dqkv[0])  # dq
    np.matmul(dscores.swapaxes(-1, -2), q, out=dqkv[1])  # dk
    dqkv_rows = dqkv.transpose(1, 3, 0, 2, 4).reshape(N, 3 * d)  # [N, 3d], as c_attn's output
    dh1, g_c_attn = _linear_back(cache["h1"], attn["c_attn"]["w"], dqkv_rows)
    dln, g_ln1, b_ln1 = _layer_norm_back(dh1, cache["ln1"])
    dx = dx + dln

    grads = {
        "ln_1": {"g": g_ln1, "b": b_ln1},
        "attn": {"c_attn": g_c_attn, "c_proj": g_attn_proj},
        "ln_2": {"g": g_ln2, "b": b_ln2},
        "mlp": {"c_fc": g_fc, "c_proj": g_mlp_proj},
    }
    return dx, grads


# --- the whole model ------------------------------------------------------------------------------


def gpt_loss_and_grads_numpy(
    params: dict[str, Any], tokens: np.ndarray, targets: np.ndarray, n_head: int
) -> tuple[np.floating, dict[str, Any]]:
    """``gpt.lm_loss(params, tokens, targets, n_head)`` and its gradient with respect to ``params``
    (same structure), by a hand-written backward. tokens, targets: [B, T] ints."""
    wte, wpe = params["wte"], params["wpe"]
    B, T = tokens.shape
    d = wte.shape[1]
    N = B * T

    # forward
    x = (wte[tokens] + wpe[:T]).reshape(N, d)  # [N, d]
    mask = (1 - np.tri(T, dtype=wte.dtype)) * MASK_VALUE  # [T, T], as models/gpt.py builds it
    caches = []
    for block in params["blocks"]:
        x, cache = _block_forward(x, block, (B, T, n_head), mask)
        caches.append(cache)
    xf, ln_f = _layer_norm(x, **params["ln_f"])
    z = xf @ wte.T  # [N, V] logits
    z -= z.max(axis=-1, keepdims=True)
    sum_exp = np.exp(z).sum(axis=-1, keepdims=True)
    rows, flat_targets = np.arange(N), targets.reshape(-1)
    loss = -(z[rows, flat_targets] - np.log(sum_exp[:, 0])).mean()

    # backward of the mean cross-entropy: (softmax - onehot) / N
    dlogits = np.exp(z, out=z)
    dlogits *= 1 / sum_exp
    dlogits[rows, flat_targets] -= 1
    dlogits *= 1 / N
    dwte = dlogits.T @ xf  # [V, d], the tied output projection
    dx, g_lnf, b_lnf = _layer_norm_back(dlogits @ wte, ln_f)

    block_grads = []
    for block, cache in zip(reversed(params["blocks"]), reversed(caches)):
        dx, grads = _block_backward(dx, block, cache)
        block_grads.append(grads)
    block_grads.reverse()

    np.add.at(dwte, tokens.reshape(-1), dx)  # the embedding rows
    dwpe = np.zeros_like(wpe)
    dwpe[:T] = dx.reshape(B, T, d).sum(axis=0)
    grads = {"wte": dwte, "wpe": dwpe, "blocks": block_grads, "ln_f": {"g": g_lnf, "b": b_lnf}}
    return loss, grads
