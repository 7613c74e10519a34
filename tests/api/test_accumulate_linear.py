"""Micro-batches of a step whose loss is linear in (some of) its weights: ``np.sum(x @ w)`` has the
gradient ``x.T @ 1``, which needs no forward value, so once optimized the step may have no
forward pass left (the loss not returned), or no micro-batch work at all (a gradient folded to a
constant). ``microbatches=k`` with and without a pp axis runs them as one device does
(passes/pipeline_stages.py ``_cut_order``), checked against numpy's closed forms; where a
pipeline has nothing to cut, the error names the step's line and why."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import graphc
from graphc.core.errors import PlanError
from graphc.core.pytree import flatten
from tests.helpers import cache_of_its_own
from tests.helpers import graphc_cli as call

LR = 0.1
EPS = np.finfo(np.float64).eps


def tol(x, *weights) -> float:
    """A bound on how far regrouping moves a float64 result here: every sum these steps compute
    (the loss ``sum(x @ w)``, the gradients ``x.T @ 1``, their tanh-scaled kin) has at most
    ``x.size * w.size`` terms, each under ``|x|.sum() * |w|.sum()``; regrouping n terms moves a sum
    by at most ``n * eps * sum|terms|`` (micro-batches and devices regroup them)."""
    return max(x.size * w.size * EPS * np.abs(x).sum() * np.abs(w).sum() for w in weights)


def linear_step(w, x):
    # the loss is linear in w and not returned: once optimized the step has no forward pass
    g = graphc.grad(lambda w: np.sum(x @ w))(w)
    return w - LR * g


def linear_step_with_loss(w, x):
    loss, g = graphc.value_and_grad(lambda w: np.sum(x @ w))(w)
    return w - LR * g, loss


def linear_mean_step(w, x):
    # a mean's 1/(B n) is a constant of the whole batch's shape: each micro-batch takes its slice
    g = graphc.grad(lambda w: np.mean(x @ w))(w)
    return w - LR * g


def partly_linear_step(w, v, x, y):
    # w enters linearly, v through tanh: the forward keeps only v's part
    def loss(w, v):
        return np.sum(x @ w) + np.mean((np.tanh(x @ v) - y) ** 2)

    gw, gv = graphc.grad(loss, (0, 1))(w, v)
    return w - LR * gw, v - LR * gv


def short_forward_step(w, v, x):
    # both weights linear: the forward keeps one node (tanh(x), read by v's gradient), fewer than
    # two pipeline stages can cut, so they cut the forward and backward nodes together
    gw, gv = graphc.grad(lambda w, v: np.sum(x @ w) + np.sum(np.tanh(x) @ v), (0, 1))(w, v)
    return w - LR * gw, v - LR * gv


def constant_gradient_step(w, x):
    # d/dw (3 sum(w) + mean(x)) = 3: the gradient folds to a constant, nothing runs per micro-batch
    g = graphc.grad(lambda w: 3.0 * np.sum(w) + np.mean(x))(w)
    return w - LR * g


def constant_gradient_step_with_loss(w, x):
    loss, g = graphc.value_and_grad(lambda w: 3.0 * np.sum(w) + np.mean(x))(w)
    return w - LR * g, loss


def numpy_partly_linear(w, v, x, y):
    h = np.tanh(x @ v)
    dh = 2.0 * (h - y) / h.size
    gv = x.T @ (dh * (1.0 - h * h))
    gw = np.broadcast_to(x.sum(0)[:, None], w.shape)
    return w - LR * gw, v - LR * gv


def data(batch, d_in, d_out, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((d_in, d_out)), rng.standard_normal((batch, d_in))


def run(step, mesh, k, *args):
    return flatten(graphc.parallelize(step, mesh=mesh, microbatches=k, cache=False)(*args))[0]


def assert_close(got, want, atol):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)


MESHES = [pytest.param({"dp": 2}, id="dp2"), pytest.param({"pp": 2}, id="pp2")]
# (batch, d_in, d_out): a column of one, and with k=4 a micro-batch of one sample
SHAPES = [pytest.param((8, 4, 3), id="8x4x3"), pytest.param((4, 4, 1), id="4x4x1")]


# a micro-batch of one sample on dp=2 warns that dp has no batch to split
@pytest.mark.filterwarnings("ignore:.*replicates the work:graphc.core.errors.PlanWarning")
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("mesh", MESHES)
def test_a_loss_linear_in_the_weights_and_not_returned_micro_batches_as_one_device(mesh, k, shape):
    w, x = data(*shape)
    want = w - LR * x.sum(0)[:, None]  # d/dw sum(x @ w) = x.T @ 1
    assert_close(run(linear_step, mesh, k, w, x), [want], tol(x, w))
    assert_close(flatten(linear_step(w, x))[0], [want], tol(x, w))  # so does the eager step


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("mesh", MESHES)
def test_a_linear_loss_returned_or_averaged_micro_batches_as_one_device(mesh, k):
    w, x = data(8, 4, 3, seed=1)
    want = [w - LR * x.sum(0)[:, None], np.sum(x @ w)]
    assert_close(run(linear_step_with_loss, mesh, k, w, x), want, tol(x, w))
    want = [w - LR * x.sum(0)[:, None] / (x.shape[0] * w.shape[1])]
    assert_close(run(linear_mean_step, mesh, k, w, x), want, tol(x, w))


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("mesh", MESHES)
def test_a_step_with_only_some_weights_linear_micro_batches_as_one_device(mesh, k):
    w, x = data(8, 4, 3, seed=2)
    v = np.random.default_rng(3).standard_normal(w.shape)
    y = np.random.default_rng(4).standard_normal((8, 3))
    want = numpy_partly_linear(w, v, x, y)
    assert_close(run(partly_linear_step, mesh, k, w, v, x, y), want, tol(x, w, v))


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("mesh", [*MESHES, pytest.param({"pp": 4}, id="pp4")])
def test_a_forward_shorter_than_the_stages_is_cut_with_the_backward(mesh, k):
    w, x = data(8, 4, 3, seed=7)
    v = np.random.default_rng(8).standard_normal(w.shape)
    want = [w - LR * x.sum(0)[:, None], v - LR * np.tanh(x).sum(0)[:, None]]
    assert_close(run(short_forward_step, mesh, k, w, v, x), want, tol(x, w, v))


def adam_linear_step(w, m, v, t, x):
    # Adam on a linear mean loss: the moments read the gradient twice, the update runs once per step
    g = graphc.grad(lambda w: np.mean(x @ w))(w)
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    t = t + 1
    step = 0.01 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return w - step, m, v, t


@pytest.mark.parametrize("mesh", [*MESHES, pytest.param({"pp": 2, "dp": 2}, id="pp2dp2")])
def test_adam_on_a_linear_loss_takes_three_steps_as_one_device(mesh):
    """The state fed back for three steps, against the eager step (graphc's interpreter). Adam's
    m / sqrt(v) does not grow a gradient's relative error, so ``tol`` bounds the parameters too."""
    w, x = data(8, 4, 3, seed=9)
    state = (w, np.zeros_like(w), np.zeros_like(w), np.float64(0.0))
    fast = graphc.parallelize(adam_linear_step, mesh=mesh, microbatches=2, cache=False)
    got, want = state, state
    for _ in range(3):
        got, want = tuple(fast(*got, x)), tuple(adam_linear_step(*want, x))
        assert_close(got, want, tol(x, w))
    assert float(got[3]) == 3.0


@pytest.mark.parametrize("k", [2, 4])
def test_a_gradient_folded_to_a_constant_micro_batches_without_pipeline_stages(k):
    """Nothing of the step depends on the batch: every micro-batch is empty, the update runs once."""
    w, x = data(8, 4, 3, seed=5)
    with pytest.warns(graphc.PlanWarning, match="replicates the work"):  # dp has no batch dim to split
        got = run(constant_gradient_step, {"dp": 2}, k, w, x)
    assert_close(got, [w - 3.0 * LR], tol(x, w))
    want = [w - 3.0 * LR, 3.0 * np.sum(w) + np.mean(x)]
    assert_close(run(constant_gradient_step_with_loss, {"dp": 2}, k, w, x), want, tol(x, w))


def line_of(fn, text: str) -> str:
    lines, first = inspect.getsourcelines(fn)
    return f"test_accumulate_linear.py:{first + next(i for i, t in enumerate(lines) if text in t)}"


def test_pipeline_stages_with_nothing_to_cut_are_errors_naming_the_line():
    """A pipeline cuts one micro-batch's work into stages: a gradient folded to a constant leaves
    none, and a forward of one node too little for two stages; each error says so, with the line."""
    w, x = data(8, 4, 3, seed=6)
    with pytest.raises(PlanError, match="reads a gradient folded to a constant") as info:
        run(constant_gradient_step, {"pp": 2}, 2, w, x)
    message = str(info.value)
    assert "@constant_gradient_step" in message and line_of(constant_gradient_step, "return w - LR") in message
    assert "micro-batch it on a mesh without a pp axis" in message
    with pytest.raises(PlanError, match="too few to cut into 2 pipeline stages") as info:
        run(constant_gradient_step_with_loss, {"pp": 2}, 2, w, x)
    assert line_of(constant_gradient_step_with_loss, "loss, g =") in str(info.value)


LINEAR_FILE = """
import numpy as np
import graphc


def train_step(w, x):
    g = graphc.grad(lambda w: np.sum(x @ w))(w)
    return w - 0.1 * g


def example_args():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((4, 3)), rng.standard_normal((8, 4))), {}
"""


@pytest.mark.parametrize("mesh", ["dp=2", "pp=2"])
def test_the_cli_compiles_and_runs_a_linear_loss_in_micro_batches(tmp_path, monkeypatch, mesh):
    """``graphc compile/run --microbatches`` on the step with no forward pass left: planned, and
    run equal to graphc's interpreter (it said the step "has no forward pass")."""
    (tmp_path / "linear.py").write_text(LINEAR_FILE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    target = f"{tmp_path}/linear.py:train_step"
    code, _out, err = call("compile", target, "--mesh", mesh, "--microbatches", "2", "-o", "plan.json", "--quiet")
    assert code == 0, err
    code, out, err = call("run", target, "--mesh", mesh, "--microbatches", "4")
    assert code == 0, err
    assert "result equals graphc's interpreter: yes" in out
