"""A small CNN classifier in plain numpy (the training step uses graphc.grad): im2col convolutions, 2x2 max pooling, two dense layers.

params = {"conv1": {"w": [F1, C, k, k], "b": [F1]}, "conv2": {...}, "fc1": {"w", "b"}, "fc2": {"w", "b"}}
"""

import numpy as np

import graphc


def im2col(x, kh, kw, stride=1, pad=0):
    # [N, C, H, W] -> [N*OH*OW, C*kh*kw]
    N, C, H, W = x.shape
    oh = (H + 2 * pad - kh) // stride + 1
    ow = (W + 2 * pad - kw) // stride + 1
    x = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    patches = [
        x[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]  # [N, C, OH, OW]
        for i in range(kh)
        for j in range(kw)
    ]
    col = np.stack(patches, axis=2)  # [N, C, kh*kw, OH, OW]
    return col.transpose(0, 3, 4, 1, 2).reshape(N * oh * ow, C * kh * kw), oh, ow


def conv2d(x, w, b, stride=1, pad=0):
    # [N, C, H, W] * [F, C, kh, kw] -> [N, F, OH, OW]
    N = x.shape[0]
    F, C, kh, kw = w.shape
    col, oh, ow = im2col(x, kh, kw, stride, pad)
    out = col @ w.reshape(F, -1).T + b  # [N*OH*OW, F]
    return out.reshape(N, oh, ow, F).transpose(0, 3, 1, 2)


def max_pool_2x2(x):
    # [N, C, H, W] -> [N, C, H/2, W/2]
    N, C, H, W = x.shape
    return x.reshape(N, C, H // 2, 2, W // 2, 2).max(axis=(3, 5))


def relu(x):
    return np.maximum(x, 0.0)


def cnn(params, images):
    # [N, 1, 28, 28] -> [N, 10]
    x = max_pool_2x2(relu(conv2d(images, **params["conv1"], pad=1)))  # [N, 8, 14, 14]
    x = max_pool_2x2(relu(conv2d(x, **params["conv2"], pad=1)))  # [N, 16, 7, 7]
    x = x.reshape(x.shape[0], -1)  # [N, 784]
    x = relu(x @ params["fc1"]["w"] + params["fc1"]["b"])  # [N, 64]
    return x @ params["fc2"]["w"] + params["fc2"]["b"]  # [N, 10]


def loss(params, images, labels):
    logits = cnn(params, images)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))
    return -np.mean(logp[np.arange(len(labels)), labels])


def train_step(params, velocity, images, labels, lr=0.05):
    # one momentum-SGD step: returns (params, velocity, loss before the step)
    loss_value, grads = graphc.value_and_grad(loss)(params, images, labels)
    params, velocity = graphc.optim.momentum(params, grads, velocity, lr=lr)
    return params, velocity, loss_value


def init_params(rng, channels=1, n_classes=10, dtype=np.float32):
    def he(*shape):
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)

    return {
        "conv1": {"w": he(8, channels, 3, 3), "b": np.zeros(8, dtype)},
        "conv2": {"w": he(16, 8, 3, 3), "b": np.zeros(16, dtype)},
        "fc1": {"w": he(16 * 7 * 7, 64), "b": np.zeros(64, dtype)},
        "fc2": {"w": he(64, n_classes), "b": np.zeros(n_classes, dtype)},
    }


def example_args(batch=8, seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(rng)
    images = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    return (params, images), {}


def example_loss_args(batch=8, seed=0):
    (params, images), _ = example_args(batch, seed)
    labels = np.random.default_rng(seed + 1).integers(0, 10, size=batch)
    return (params, images, labels), {}


def example_train_args(batch=8, seed=0):
    (params, images, labels), _ = example_loss_args(batch, seed)
    return (params, graphc.optim.momentum_init(params), images, labels), {"lr": 0.05}
