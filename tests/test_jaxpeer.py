"""The JAX peer of the benchmarks (graphc/bench/jaxpeer.py): models/gpt.py's own source on
jax.numpy computes what numpy and graphc compute, and importing graphc never imports JAX."""

import os
import subprocess
import sys

import numpy as np
import pytest

import graphc
from graphc.bench import jaxpeer
from graphc.core.pytree import tree_map
from graphc.models import gpt

jax = pytest.importorskip("jax")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_HEAD = 4


def small_train_args():
    """batch 2, seq 8, d 32, 2 layers, 4 heads, vocab 64, random layer-norm gains and biases."""
    (params, opt_state, tokens, targets), kw = gpt.example_train_args(
        batch=2, seq=8, n_vocab=64, d=32, n_layer=2, n_head=N_HEAD
    )
    rng = np.random.default_rng(5)
    params = tree_map(lambda p: p + (0.1 * rng.standard_normal(p.shape)).astype(p.dtype), params)
    return params, opt_state, tokens, targets


def by_path(tree, path=()):
    """{key path: numpy array} of a pytree (JAX rebuilds dicts with sorted keys, so the trees are
    compared by path rather than by flattening order)."""
    if isinstance(tree, dict):
        return {p: a for k in tree for p, a in by_path(tree[k], path + (k,)).items()}
    if isinstance(tree, (list, tuple)):
        return {p: a for i, v in enumerate(tree) for p, a in by_path(v, path + (i,)).items()}
    return {path: np.asarray(tree)}


def test_jax_is_reported_available():
    assert jaxpeer.jax_available()


def test_forward_equals_numpy():
    params, _, tokens, _ = small_train_args()
    forward = jaxpeer.jax_gpt_forward(N_HEAD)
    got = np.asarray(jaxpeer.block(forward(*jaxpeer.to_jax((params, tokens)))))
    want = gpt.gpt(params, tokens, N_HEAD)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_loss_and_gradients_equal_graphc():
    params, _, tokens, targets = small_train_args()
    lm_loss = jaxpeer.jax_gpt_namespace()["lm_loss"]
    loss, grads = jax.jit(jax.value_and_grad(lm_loss), static_argnums=3)(
        jaxpeer.to_jax(params), tokens, targets, N_HEAD
    )
    want_loss, want_grads = graphc.value_and_grad(gpt.lm_loss)(params, tokens, targets, N_HEAD)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    got, want = by_path(grads), by_path(want_grads)
    assert got.keys() == want.keys()
    for path, w in want.items():
        assert got[path].dtype == np.float32, path
        np.testing.assert_allclose(got[path], w, rtol=1e-4, atol=1e-6 * np.abs(w).max(), err_msg=str(path))


@pytest.mark.slow
def test_train_step_equals_numpy():
    params, opt_state, tokens, targets = small_train_args()
    step = jaxpeer.jax_train_step(N_HEAD, lr=1e-3)
    new_params, new_state, loss = jaxpeer.block(step(*jaxpeer.to_jax((params, opt_state, tokens, targets))))
    want_params, want_state, want_loss = gpt.train_step(params, opt_state, tokens, targets, N_HEAD, lr=1e-3)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    assert float(new_state["t"]) == float(want_state["t"]) == 1.0
    got_m, want_m = by_path(new_state["m"]), by_path(want_state["m"])
    got_v, want_v = by_path(new_state["v"]), by_path(want_state["v"])
    got_p, want_p = by_path(new_params), by_path(want_params)
    assert got_p.keys() == want_p.keys() == got_m.keys() == want_m.keys()
    n_stable = 0
    for path in want_p:
        m, v = want_m[path], want_v[path]
        np.testing.assert_allclose(got_m[path], m, rtol=1e-4, atol=1e-6 * np.abs(m).max(), err_msg=str(path))
        np.testing.assert_allclose(got_v[path], v, rtol=1e-3, atol=1e-6 * np.abs(v).max(), err_msg=str(path))
        # Adam's first step moves a weight by about lr * sign(grad): where the gradient is near
        # eps = 1e-8 that sign is rounding noise (the key bias's gradient is zero: softmax ignores
        # a constant added to a row of scores), so the weights are compared where it is not
        stable = np.abs(m) > 1e-7
        n_stable += stable.sum()
        np.testing.assert_allclose(got_p[path][stable], want_p[path][stable], rtol=1e-5, atol=1e-6, err_msg=str(path))
        assert got_p[path].dtype == np.float32, path
    assert n_stable > 0.95 * sum(p.size for p in want_p.values())


def test_importing_graphc_and_its_benchmarks_does_not_import_jax():
    code = (
        "import sys, graphc, graphc.bench.jaxpeer as j, graphc.cli.main; "
        "assert j.jax_available(); assert 'jax' not in sys.modules, 'jax imported'"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
