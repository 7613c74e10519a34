"""Whole-model gradients against finite differences on random coordinates, and training that works."""

import numpy as np
import pytest

import graphc
from graphc.core.pytree import flatten, unflatten
from graphc.models import cnn, gpt, mlp


def to_float64(tree):
    leaves, treedef = flatten(tree)
    return unflatten(treedef, [x.astype(np.float64) if x.dtype.kind == "f" else x for x in leaves])


def model_cases():
    (p, x, y), _ = mlp.example_loss_args(batch=6, sizes=(5, 7, 3))
    yield "mlp", mlp.loss, to_float64(p), (to_float64(x), y), {}
    (p, t, tg), kw = gpt.example_loss_args(batch=2, seq=5, n_vocab=11, d=8, n_layer=2, n_head=2)
    p = to_float64(p)
    p["wte"] = p["wte"] * 20  # larger weights: gradients far from zero in every block
    yield "gpt", gpt.lm_loss, p, (t, tg), kw
    (p, im, lab), _ = cnn.example_loss_args(batch=2)
    yield "cnn", cnn.loss, to_float64(p), (to_float64(im), lab), {}


@pytest.mark.parametrize(
    "name, loss, params, data, kwargs", list(model_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_model_gradient_matches_finite_differences(name, loss, params, data, kwargs):
    grads = graphc.grad(loss)(params, *data, **kwargs)
    leaves, treedef = flatten(params)
    grad_leaves = flatten(grads)[0]
    rng = np.random.default_rng(1)
    eps = 1e-6
    checked = 0
    for i, (leaf, g) in enumerate(zip(leaves, grad_leaves)):
        for _ in range(2):  # two random coordinates of every parameter
            idx = tuple(int(rng.integers(0, n)) for n in leaf.shape)

            def loss_at(delta, i=i, leaf=leaf, idx=idx):
                moved = list(leaves)
                moved[i] = leaf.copy()
                moved[i][idx] += delta
                return float(loss(unflatten(treedef, moved), *data, **kwargs))

            fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
            assert g[idx] == pytest.approx(fd, rel=1e-4, abs=1e-7), (name, i, idx)
            checked += 1
    assert checked == 2 * len(leaves)


@pytest.mark.parametrize("model", [mlp, gpt, cnn], ids=["mlp", "gpt", "cnn"])
def test_a_few_training_steps_lower_the_loss(model):
    args, kwargs = model.example_train_args()
    step = graphc.trace(model.train_step, *args, **kwargs)
    state = list(args)
    losses = []
    for _ in range(4):
        *new_state, loss = graphc.evaluate(step, *state, **kwargs)
        losses.append(float(loss))
        state[: len(new_state)] = new_state
    assert losses[-1] < losses[0], losses
