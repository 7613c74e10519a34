"""A multi-layer perceptron classifier in plain numpy (the training step uses graphc.grad).

params = {"layers": [{"w": [d_in, d_out], "b": [d_out]}, ...]}
"""

import numpy as np

import graphc


def init_params(rng, sizes=(784, 256, 256, 10), dtype=np.float32):
    layers = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        w = rng.standard_normal((d_in, d_out)) * np.sqrt(2.0 / d_in)
        layers.append({"w": w.astype(dtype), "b": np.zeros(d_out, dtype)})
    return {"layers": layers}


def relu(x):
    return np.maximum(x, 0)


def mlp(params, x):
    # [batch, d_in] -> [batch, n_classes]
    *hidden, last = params["layers"]
    for layer in hidden:
        x = relu(x @ layer["w"] + layer["b"])  # [batch, d_out]
    return x @ last["w"] + last["b"]


def log_softmax(z):
    # [batch, n] -> [batch, n]
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def loss(params, x, labels):
    # mean cross-entropy; labels [batch] int
    logp = log_softmax(mlp(params, x))  # [batch, n_classes]
    return -np.mean(logp[np.arange(x.shape[0]), labels])


def accuracy(params, x, labels):
    return np.mean(np.argmax(mlp(params, x), axis=-1) == labels)


def train_step(params, x, labels, lr=0.1):
    # one SGD step on the cross-entropy: returns (new params, loss before the step)
    loss_value, grads = graphc.value_and_grad(loss)(params, x, labels)
    return graphc.optim.sgd(params, grads, lr), loss_value


def example_args(batch=64, sizes=(784, 256, 256, 10), seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(rng, sizes)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    return (params, x), {}


def example_loss_args(batch=64, sizes=(784, 256, 256, 10), seed=0):
    (params, x), _ = example_args(batch, sizes, seed)
    labels = np.random.default_rng(seed + 1).integers(0, sizes[-1], size=batch)
    return (params, x, labels), {}


def example_train_args(batch=64, sizes=(784, 256, 256, 10), seed=0):
    (params, x, labels), _ = example_loss_args(batch, sizes, seed)
    return (params, x, labels), {"lr": 0.1}


def example_train_args_bf16(batch=64, sizes=(784, 256, 256, 10), seed=0):
    """The training step on bfloat16 parameters and inputs: every op computes in float32 and
    rounds its result to bfloat16, as XLA's CPU backend does."""
    (params, x, labels), kwargs = example_train_args(batch, sizes, seed)
    layers = [{k: a.astype(graphc.bfloat16) for k, a in layer.items()} for layer in params["layers"]]
    return ({"layers": layers}, x.astype(graphc.bfloat16), labels), kwargs


def example_train_args_bench():
    """A matmul-heavy training step for ``graphc bench --mesh``: 2048 x 1024 inputs, 2048-wide layers."""
    return example_train_args(batch=2048, sizes=(1024, 2048, 2048, 16))


def example_loss_args_bench():
    """The loss alone (a forward pass) at the size of ``example_train_args_bench``."""
    return example_loss_args(batch=2048, sizes=(1024, 2048, 2048, 16))
