"""Micro-batching a training step of a model held by an object (classes holding weights,
docs/guide/tracing.md): a step that assigns the new weights on the object and returns it writes
them back (a ``StateUpdate``), and those weights are the step's state, tied to the inputs they
replace (``passes.partition.state_ties``), never split into micro-batches. Before, only the
sharding path tied them: micro-batching and pipelines saw the weights as batch inputs and refused
the step as one that "reads the whole batch at once"."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import graphc
from graphc.core.pytree import flatten
from graphc.passes.microbatch import batch_inputs
from graphc.passes.partition import state_ties

# float64 results of another summation order: micro-batches and devices regroup each batch sum and
# matmul contraction (at most 16 x 12 terms here), moving it by at most about n * eps of the sum of
# the terms' magnitudes; one SGD step carries that into the weights. 2**10 * eps bounds it.
TOL = 2**10 * np.finfo(np.float64).eps


class Classifier:
    """Two dense layers held as attributes, one static float."""

    def __init__(self, rng):
        self.w1 = rng.standard_normal((6, 12)) * 0.5
        self.w2 = rng.standard_normal((12, 3)) * 0.5
        self.lr = 0.1

    def loss(self, x, y):
        h = np.tanh(x @ self.w1)  # [B, 6] -> [B, 12]
        return np.mean((h @ self.w2 - y) ** 2)  # [B, 3] -> []


def loss_of(model, x, y):
    return model.loss(x, y)


def train_step(model, x, y):
    loss, g = graphc.value_and_grad(loss_of)(model, x, y)
    model.w1 = model.w1 - model.lr * g.w1  # assigned on the object, which the step returns
    model.w2 = model.w2 - model.lr * g.w2
    return model, loss


def args(batch=16):
    rng = np.random.default_rng(0)
    return Classifier(rng), rng.standard_normal((batch, 6)), rng.standard_normal((batch, 3))


def test_written_weights_are_state_not_batch_inputs():
    model, x, y = args()
    graph = graphc.trace(train_step, model, x, y)
    tied = {i for i, _o in state_ties(graph)}
    names = graph.value_names()
    weights = {k for k, v in enumerate(graph.inputs) if names[v].startswith("model.")}
    assert weights and weights <= tied
    assert {names[graph.inputs[k]] for k in batch_inputs(graph)} == {"x", "y"}


@pytest.mark.parametrize(("mesh", "k"), [({"dp": 2}, 2), ({"dp": 2}, 4), ({"pp": 2}, 2)])
def test_microbatched_object_step_equals_one_device(mesh, k):
    model, x, y = args()
    want_model, want_loss = graphc.jit(train_step)(copy.deepcopy(model), x, y)
    mine = copy.deepcopy(model)
    got_model, got_loss = graphc.parallelize(train_step, mesh=mesh, microbatches=k)(mine, x, y)
    assert type(got_model) is Classifier and got_model.lr == model.lr
    np.testing.assert_allclose(got_loss, want_loss, rtol=TOL, atol=TOL)
    for got, want in zip(flatten(got_model)[0], flatten(want_model)[0]):
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    for got, want in zip((mine.w1, mine.w2), (want_model.w1, want_model.w2)):  # written back to the caller's object
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    assert not np.allclose(mine.w1, model.w1)
