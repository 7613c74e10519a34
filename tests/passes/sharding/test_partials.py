"""Partial sums carried (strategies._linear_partials): P + P stays P, and so do -P, P * R, sum(P),
P.T and reshape(P), so a sum of per-step losses or of per-step gradients pays one collective
in total, not one per step. Plans are run against numpy."""

from collections import Counter

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.spec import P, R
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning

STEPS = 5


def rnn_loss(w, u, xs):
    """An Elman RNN whose loss is the sum of per-step losses."""
    h = np.zeros((xs.shape[1], w.shape[1]), dtype=xs.dtype)
    total = 0.0
    for t in range(STEPS):
        h = np.tanh(xs[t] @ w + h @ u)
        total = total + 0.5 * (h * h).sum() - h.mean()
    return total


def rnn_step(w, u, xs):
    loss, (gw, gu) = graphc.value_and_grad(rnn_loss, argnums=(0, 1))(w, u, xs)
    return w - 0.05 * gw, u - 0.05 * gu, loss


def _args(batch=48, n_in=96, hidden=640, seed=3):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32)
    u = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    xs = rng.standard_normal((STEPS, batch, n_in)).astype(np.float32)
    return w, u, xs


def _collectives(fn, mesh, args, carry: bool) -> Counter:
    f = graphc.parallelize(fn, mesh=mesh, cache=False)
    f.options = PlanOptions(linear_partials=carry, zero=0)
    plan = f.plan(*args)
    return Counter((c.kind, c.axes) for c in plan.collectives if c.kind != "zero")


def test_a_sum_of_per_step_losses_is_reduced_once():
    args = _args()
    carried = _collectives(rnn_loss, "tp=2", args, carry=True)
    assert carried == Counter({("all_reduce", ("tp",)): 1}), carried
    reduced_each_step = _collectives(rnn_loss, "tp=2", args, carry=False)
    assert reduced_each_step[("all_reduce", ("tp",))] >= STEPS  # what it cost before
    f = graphc.parallelize(rnn_loss, mesh="tp=2", cache=False)
    np.testing.assert_allclose(f(*args), rnn_loss(*args), rtol=1e-4)


@pytest.mark.parametrize("mesh", ["dp=2", "dp=2,tp=2"])
def test_per_step_gradients_meet_once_per_parameter(mesh):
    args = _args(batch=64, n_in=80, hidden=512, seed=4)
    carried = _collectives(rnn_step, mesh, args, carry=True)
    # one all-reduce per parameter gradient and one for the loss, however many steps
    assert carried[("all_reduce", ("dp",))] <= 3, carried
    assert _collectives(rnn_step, mesh, args, carry=False)[("all_reduce", ("dp",))] > 3 * STEPS // 2
    f = graphc.parallelize(rnn_step, mesh=mesh, cache=False)
    for got, want in zip(f(*args), rnn_step(*args)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * float(np.abs(want).max()))


def _strategies(fn, *arrays, mesh="dp=2,tp=2"):
    graph = optimize_for_planning(graphc.trace(fn, *arrays))
    problem = build_problem(graph, Mesh(mesh, profile=MachineProfile.default()), PlanOptions(zero=0))
    return {it.node.op.name: it.strategies for it in problem.items if it.kind == "node"}


def _has(strategies, ins, outs) -> bool:
    return any(st.in_specs == ins and st.out_specs == outs for st in strategies)


def test_linear_ops_keep_partial_sums_on_each_axis_and_on_both():
    x = np.ones((4, 6, 8), np.float32)

    def f(x, y, z):
        # sums over two dims split on two axes leave partial sums on either axis or on both
        a, b = np.einsum("bsd,bse->de", x, y), np.einsum("bsd,bse->de", x, z)
        return np.tanh(-(a + b) * 2.0).sum(axis=0), (a - b).T.reshape(64)

    by_op = _strategies(f, x, x, x)
    for pp in [(P, R), (R, P), (P, P)]:
        assert _has(by_op["add"], (pp, pp), (pp,))
        assert _has(by_op["sub"], (pp, pp), (pp,))
        assert _has(by_op["neg"], (pp,), (pp,))
        assert _has(by_op["transpose"], (pp,), (pp,))
        assert _has(by_op["reshape"], (pp,), (pp,))
    assert _has(by_op["mul"], ((P, R), (R, R)), ((P, R),))  # scaling by a replicated value
    assert not any(P in spec for st in by_op["tanh"] for spec in st.in_specs + st.out_specs)
    assert not _has(by_op["add"], ((P, R), (R, R)), ((P, R),))  # P + R would count R twice
    # where no partial sum can arrive (graph inputs), no partial variants are made
    assert not any(P in spec for st in _strategies(lambda a, b: a + b, x, x)["add"] for spec in st.out_specs)
