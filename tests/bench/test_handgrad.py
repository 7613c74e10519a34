"""The hand-written numpy backward of the GPT loss (graphc/bench/handgrad.py) against graphc's
autodiff of models/gpt.py's lm_loss: the loss and the gradient of every parameter."""

import numpy as np

import graphc
from graphc.bench.handgrad import gpt_loss_and_grads_numpy
from graphc.core.pytree import flatten, leaf_paths, tree_map
from graphc.models import gpt
from tests.helpers import assert_same_pytree

N_HEAD = 4


def small_case(dtype=np.float32):
    """batch 2, seq 8, d 32, 2 layers, 4 heads, vocab 64; 12 positions in wpe, so that rows 8-11
    get no gradient. Every weight (layer-norm gains and all biases included) is random, so that
    no gradient path hides behind a one or a zero."""
    rng = np.random.default_rng(3)
    params = gpt.init_params(rng, n_vocab=64, n_ctx=12, d=32, n_layer=2, dtype=dtype)
    params = tree_map(lambda p: p + (0.1 * rng.standard_normal(p.shape)).astype(dtype), params)
    tokens = rng.integers(0, 64, size=(2, 8))
    targets = rng.integers(0, 64, size=(2, 8))
    return params, tokens, targets


def test_loss_and_every_gradient_match_graphc_float32():
    params, tokens, targets = small_case(np.float32)
    want_loss, want = graphc.value_and_grad(gpt.lm_loss)(params, tokens, targets, N_HEAD)
    loss, got = gpt_loss_and_grads_numpy(params, tokens, targets, N_HEAD)
    assert np.asarray(loss).dtype == np.float32
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    assert_same_pytree(got, want)  # structure, dtypes (float32 throughout), values
    assert not np.any(got["wpe"][8:]), "positions past the sequence get no gradient"
    assert np.all(np.abs(got["wpe"][:8]).sum(axis=1) > 0)


def test_loss_and_every_gradient_match_graphc_float64_tightly():
    params, tokens, targets = small_case(np.float64)
    want_loss, want = graphc.value_and_grad(gpt.lm_loss)(params, tokens, targets, N_HEAD)
    loss, got = gpt_loss_and_grads_numpy(params, tokens, targets, N_HEAD)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree
    for path, g, w in zip(leaf_paths(want_tree), got_leaves, want_leaves):
        assert g.dtype == np.float64, path
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12 * np.abs(w).max(), err_msg=str(path))
