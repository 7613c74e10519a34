"""A small vision transformer (ViT) classifier in plain numpy, with an SGD training step.

params = {"patch": {"w": [p*p*C, d], "b": [d]}, "pos": [n_patches, d],
          "blocks": [{"ln_1", "attn": {"c_attn", "c_proj"}, "ln_2", "mlp": {"c_fc", "c_proj"}}, ...],
          "ln_f": {"g", "b"}, "head": {"w": [d, n_classes], "b": [n_classes]}}
"""

import math

import numpy as np

import graphc
from graphc.models.gpt import block_params, ffn, layer_norm, linear, linear_params, ln_params, softmax


def patchify(images, p):
    # [B, C, H, W] -> [B, (H/p)*(W/p), p*p*C]
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // p, p, W // p, p).transpose(0, 2, 4, 3, 5, 1)
    return x.reshape(B, (H // p) * (W // p), p * p * C)


def mha(x, c_attn, c_proj, n_head):
    # [B, T, d] -> [B, T, d]; every patch attends to every patch (no mask)
    B, T, d = x.shape
    qkv = linear(x, **c_attn)  # [B, T, 3d]
    q, k, v = (h.reshape(B, T, n_head, d // n_head).transpose(0, 2, 1, 3) for h in np.split(qkv, 3, axis=-1))
    att = softmax(q @ k.swapaxes(-1, -2) / math.sqrt(d // n_head))  # [B, H, T, T]
    return linear((att @ v).transpose(0, 2, 1, 3).reshape(B, T, d), **c_proj)


def encoder_block(x, mlp, attn, ln_1, ln_2, n_head):
    # [B, T, d] -> [B, T, d]
    x = x + mha(layer_norm(x, **ln_1), **attn, n_head=n_head)
    return x + ffn(layer_norm(x, **ln_2), **mlp)


def vit(params, images, patch, n_head):
    # [B, C, H, W] -> logits [B, n_classes]
    x = linear(patchify(images, patch), **params["patch"]) + params["pos"]  # [B, T, d]
    for block in params["blocks"]:
        x = encoder_block(x, **block, n_head=n_head)
    x = layer_norm(x, **params["ln_f"]).mean(axis=1)  # [B, d]
    return linear(x, **params["head"])


def loss(params, images, labels, patch, n_head):
    # mean cross-entropy; labels [B] int
    z = vit(params, images, patch, n_head)  # [B, n_classes]
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.mean(logp[np.arange(images.shape[0]), labels])


def train_step(params, images, labels, patch, n_head, lr=0.05):
    # one SGD step: returns (new params, loss before the step)
    loss_value, grads = graphc.value_and_grad(loss)(params, images, labels, patch, n_head)
    return graphc.optim.sgd(params, grads, lr), loss_value


def init_params(rng, channels, image, patch, d, n_layer, n_classes, dtype=np.float32):
    def w(*shape, scale=0.02):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    blocks = [block_params(w, d, dtype) for _ in range(n_layer)]
    n_patches = (image // patch) ** 2
    return {
        "patch": linear_params(w, patch * patch * channels, d, dtype),
        "pos": w(n_patches, d),
        "blocks": blocks,
        "ln_f": ln_params(d, dtype),
        "head": linear_params(w, d, n_classes, dtype),
    }


def example_train_args(batch=2, channels=3, image=16, patch=4, d=64, n_layer=2, n_head=4, n_classes=10, seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(rng, channels, image, patch, d, n_layer, n_classes)
    images = rng.standard_normal((batch, channels, image, image)).astype(np.float32)
    labels = rng.integers(0, n_classes, size=batch)
    return (params, images, labels), {"patch": patch, "n_head": n_head, "lr": 0.05}
