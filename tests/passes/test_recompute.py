"""passes/recompute/cheap.py: cheap elementwise forward values recomputed inside backward kernels, so a
training step keeps fewer bytes from its forward to its backward, with the same values."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphc
from graphc.core.pytree import flatten
from graphc.models import gpt
from graphc.passes import PASSES, run_passes
from graphc.passes.recompute.cheap import recompute_cheap

BEFORE_RECOMPUTE = ("fold_constants", "simplify", "cse", "dce")


def gelu_mlp_loss(w1, w2, x):
    u = x @ w1  # [B, d] -> [B, h]
    y = 0.5 * u * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u * u * u)))
    return np.mean((y @ w2) ** 2)


def layer_norm_loss(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = g * (x - mean) / np.sqrt(var + 1e-5) + b
    return np.sum(y @ np.ones((y.shape[-1], 3), y.dtype))


def kept_bytes(graph) -> int:
    """Bytes of the forward values that backward nodes read: what a step keeps between the two."""
    used_by_backward = {v for n in graph.nodes if n.part == "backward" for v in n.inputs}
    return sum(v.type.nbytes for n in graph.nodes if n.part == "forward" for v in n.outputs if v in used_by_backward)


def _bitwise_equal(got, want) -> None:
    (g, g_tree), (w, w_tree) = flatten(got), flatten(want)
    assert g_tree == w_tree
    for a, b in zip(g, w):
        np.testing.assert_array_equal(a, b)


def _traced(fn, *args):
    return run_passes(
        graphc.trace(graphc.value_and_grad(fn, argnums=tuple(range(len(args)))), *args), BEFORE_RECOMPUTE
    ).graph


def _args_gelu(rng, b=16, d=8, h=32):
    return (
        rng.standard_normal((d, h)).astype(np.float32),
        rng.standard_normal((h, 3)).astype(np.float32),
        rng.standard_normal((b, d)).astype(np.float32),
    )


def test_gelu_keeps_u_and_tanh_instead_of_four_arrays():
    args = _args_gelu(np.random.default_rng(0))
    graph = _traced(gelu_mlp_loss, *args)
    after = recompute_cheap(graph)
    after.verify()
    hidden = 16 * 32 * 4
    # before: 0.5*u, u*u, tanh, 1 + tanh (and u itself for the weight gradient? no: x is an input)
    # after: u and tanh; the GELU output y is kept for the w2 gradient (a matmul reads it) either way
    assert kept_bytes(graph) - kept_bytes(after) >= 2 * hidden
    recomputed = [n for n in after.nodes if n.part == "backward" and n.op.name in ("mul", "add")]
    assert recomputed, "the backward recomputes the cheap values"
    # the same values, bit for bit: the same ops on the same operands
    _bitwise_equal(graphc.evaluate(after, *args), graphc.evaluate(graph, *args))


def test_layer_norm_recomputes_a_chain_of_two_cheap_ops():
    """g * d / std is read by the backward; d and std are kept anyway, so it is recomputed from
    them (two ops deep) instead of kept."""
    rng = np.random.default_rng(1)
    args = (
        rng.standard_normal((6, 16)).astype(np.float32),
        rng.standard_normal(16).astype(np.float32),
        np.zeros(16, np.float32),
    )
    graph = _traced(layer_norm_loss, *args)
    after = recompute_cheap(graph)
    assert kept_bytes(after) < kept_bytes(graph)
    _bitwise_equal(graphc.evaluate(after, *args), graphc.evaluate(graph, *args))


def test_idempotent_and_unchanged_without_a_backward():
    args = _args_gelu(np.random.default_rng(2))
    graph = _traced(gelu_mlp_loss, *args)
    once = recompute_cheap(graph)
    assert str(recompute_cheap(once)) == str(once)
    forward_only = run_passes(graphc.trace(gelu_mlp_loss, *args), BEFORE_RECOMPUTE).graph
    assert recompute_cheap(forward_only) is forward_only
    assert "recompute_cheap" in PASSES


def test_no_recompute_for_a_matmul_reader():
    """A value a backward matmul reads would be recomputed as a pass of its own, not inside a
    kernel: it stays kept (here u * 2, read by the w2 gradient)."""

    def loss(w1, w2, x):
        y = (x @ w1) * 2.0
        return np.sum(y @ w2)

    args = _args_gelu(np.random.default_rng(3))
    graph = _traced(loss, *args)
    assert recompute_cheap(graph) is graph


@pytest.mark.parametrize("n_layer", [1, 2])
def test_gpt_step_keeps_less_and_equals_numpy(n_layer):
    (params, tokens, targets), kw = gpt.example_loss_args(batch=2, seq=8, d=32, n_layer=n_layer, n_head=4)
    fn = graphc.value_and_grad(gpt.lm_loss)
    traced = graphc.trace(fn, params, tokens, targets, **kw)
    before = run_passes(traced, BEFORE_RECOMPUTE).graph
    after = recompute_cheap(before)
    assert kept_bytes(after) < 0.8 * kept_bytes(before)
    loss, grads = graphc.jit(fn, static_argnames=("n_head",))(params, tokens, targets, **kw)
    want_loss, want_grads = (
        gpt.lm_loss(params, tokens, targets, **kw),
        graphc.evaluate(traced, params, tokens, targets, **kw)[1],
    )
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for a, b in zip(flatten(grads)[0], flatten(want_grads)[0]):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


UNARY = [np.tanh, np.exp, lambda a: a * 0.5, lambda a: -a, lambda a: a * a, np.abs, lambda a: 1.0 + a]
BINARY = [np.add, np.subtract, np.multiply, np.maximum, lambda a, b: a / (1.0 + b * b)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=12
    )
)
def test_random_elementwise_steps_keep_their_values(program):
    """Random chains of cheap and expensive elementwise ops with a matmul at each end, differentiated:
    recomputing never changes a bit of the loss or the gradients, and a second run changes nothing."""

    def loss(w, x):
        vals = [x @ w]
        for binary, op, i, j in program:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            vals.append(BINARY[op % len(BINARY)](a, b) if binary else UNARY[op](a))
        return np.sum(vals[-1] @ w.T)

    rng = np.random.default_rng(len(program))
    args = (rng.standard_normal((4, 4)).astype(np.float32) * 0.3, rng.standard_normal((3, 4)).astype(np.float32))
    graph = _traced(loss, *args)
    after = recompute_cheap(graph)
    after.verify()
    assert kept_bytes(after) <= kept_bytes(graph)
    assert str(recompute_cheap(after)) == str(after)
    with np.errstate(all="ignore"):
        _bitwise_equal(graphc.evaluate(after, *args), graphc.evaluate(graph, *args))
