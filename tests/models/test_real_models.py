"""The corpus test of issue 20: small numpy models written in other people's styles
(tests/models/real_models/), none of them written for graphc, each traced, jitted, differentiated and run
on a 2x2 mesh, and compared with numpy.

Gradients are checked against the model's own hand-written backward pass where its style has one
(the RNN, the dropout net), else against finite differences. Random draws are checked against
numpy's ``Generator(Philox(key))``, whose ``random`` stream graphc's draws equal (docs/random.md),
and the sharded run against the unsharded one, bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profiles import MachineProfile
from graphc.core.pytree import flatten, tree_map, unflatten
from graphc.frontend.random import philox_state
from tests.models.real_models import (
    conv_col2im,
    dropout_mlp,
    functional_net,
    gnn_scatter,
    gru_stack,
    kv_cache,
    layer_classes,
    llama_args,
    mamba_conv,
    masked_attention,
    relu_backward,
    rnn_buffer,
    softmax_backward,
)

pytestmark = pytest.mark.filterwarnings("ignore::graphc.PromotionWarning")  # numpy's own float64 promotions


def mesh():
    return Mesh({"dp": 2, "tp": 2}, profile=MachineProfile.default())


def in_order(grads, params):
    """A hand-written backward's gradient dict in the order of the params dict."""
    return {k: grads[k] for k in params}


def close(got, want, rtol=1e-9, atol=1e-12):
    """Same pytree structure; every leaf close (equal for integers)."""
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree, (got_tree, want_tree)
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def directional_check(loss, params, grads, eps, rtol, seed=0):
    """<grads, v> equals the central difference of ``loss`` along a random unit direction v."""
    rng = np.random.default_rng(seed)
    leaves, _ = flatten(params)
    norm = np.sqrt(sum(leaf.size for leaf in leaves))  # about the norm of a standard normal direction
    direction = tree_map(lambda p: (rng.standard_normal(p.shape) / norm).astype(p.dtype), params)
    predicted = sum(float(np.sum(g * v)) for g, v in zip(flatten(grads)[0], flatten(direction)[0]))
    plus = tree_map(lambda p, v: p + eps * v, params, direction)
    minus = tree_map(lambda p, v: p - eps * v, params, direction)
    numeric = (float(loss(plus)) - float(loss(minus))) / (2 * eps)
    assert len(leaves) > 0
    np.testing.assert_allclose(predicted, numeric, rtol=rtol)


# --- a class with a forward method: layer objects holding their weights ---------------------------


def test_layer_classes_transformer_block():
    block = layer_classes.TransformerBlock(d_model=8, heads_num=2, d_ff=16)
    r = np.random.default_rng(1)
    x, target = r.standard_normal((4, 5, 8)), r.standard_normal((4, 5, 8))
    want = block.forward(x)

    close(graphc.evaluate(graphc.trace(block.forward, x), x), want)
    close(graphc.jit(block.forward)(x), want)
    close(graphc.parallelize(block.forward, mesh=mesh(), cache=False)(x), want)

    # gradients with respect to the object: the same class, holding the gradient arrays
    loss = graphc.value_and_grad(lambda model, x, t: model.loss(x, t))
    value, grads = loss(block, x, target)
    assert isinstance(grads, layer_classes.TransformerBlock) and grads.attn.heads_num == 2
    np.testing.assert_allclose(value, block.loss(x, target), rtol=1e-12)

    def numpy_loss(model):
        return model.loss(x, target)

    directional_check(numpy_loss, block, grads, eps=1e-6, rtol=1e-6)
    value_mesh, grads_mesh = graphc.parallelize(loss, mesh=mesh(), cache=False)(block, x, target)
    np.testing.assert_allclose(value_mesh, value, rtol=1e-12)
    close(grads_mesh, grads)


# --- a frozen dataclass config passed with a params dict ------------------------------------------


@pytest.mark.slow
def test_llama_with_a_frozen_model_args_dataclass():
    args = llama_args.ModelArgs()
    params = llama_args.init_params(args)
    r = np.random.default_rng(0)
    tokens, targets = r.integers(0, args.vocab_size, (2, 8)), r.integers(0, args.vocab_size, (2, 8))
    want = llama_args.transformer(params, tokens, args)
    assert want.dtype == np.float32

    close(
        graphc.evaluate(graphc.trace(llama_args.transformer, params, tokens, args), params, tokens, args),
        want,
        1e-5,
        1e-6,
    )
    close(graphc.jit(llama_args.transformer)(params, tokens, args), want, 1e-4, 1e-5)
    got_mesh = graphc.parallelize(llama_args.transformer, mesh=mesh(), cache=False)(params, tokens, args)
    close(got_mesh, want, 1e-4, 1e-5)

    loss = graphc.value_and_grad(llama_args.cross_entropy)
    value, grads = loss(params, tokens, targets, args)
    np.testing.assert_allclose(value, llama_args.cross_entropy(params, tokens, targets, args), rtol=1e-5)
    directional_check(lambda p: llama_args.cross_entropy(p, tokens, targets, args), params, grads, 1e-2, 2e-2)
    close(graphc.jit(loss)(params, tokens, targets, args), (value, grads), 1e-4, 1e-6)
    # on the mesh, one layer (planning a training step is the slow part; the layers are alike)
    one = dataclasses.replace(args, n_layers=1)
    small = {**params, "layers": params["layers"][:1]}
    want = loss(small, tokens, targets, one)
    close(graphc.parallelize(loss, mesh=mesh(), cache=False)(small, tokens, targets, one), want, 1e-4, 1e-6)


# --- a KV cache on self, written at start_pos in every call of a generation loop -------------------

PROMPT = np.array([[1, 5, 7], [2, 3, 9]])


@pytest.mark.slow
def test_kv_cache_generation_loop_gives_numpys_tokens():
    weights = kv_cache.make_weights(kv_cache.ARGS)
    theirs, ours = kv_cache.Llama(weights, kv_cache.ARGS), kv_cache.Llama(weights, kv_cache.ARGS)
    cache_k = ours.layers[1].attention.cache_k
    want = theirs.generate(PROMPT, 8)
    got = ours.generate(PROMPT, 8, forward=graphc.jit(ours.forward, static_argnames=("start_pos",)))
    np.testing.assert_array_equal(got, want)
    for mine, numpys in zip(ours.layers, theirs.layers):
        close(mine.attention.cache_k, numpys.attention.cache_k, 1e-4, 1e-5)
        close(mine.attention.cache_v, numpys.attention.cache_v, 1e-4, 1e-5)
    assert ours.layers[1].attention.cache_k is cache_k  # written into, as numpy does

    on_mesh = kv_cache.Llama(weights, kv_cache.ARGS)
    pf = graphc.parallelize(on_mesh.forward, mesh=mesh(), cache=False, static_argnames=("start_pos",))
    np.testing.assert_array_equal(on_mesh.generate(PROMPT, 3, forward=pf), want[:, : PROMPT.shape[1] + 3])
    close(
        on_mesh.layers[0].attention.cache_v,
        theirs.layers[0].attention.cache_v * (np.arange(16) < 5)[None, :, None, None],
        1e-4,
        1e-5,
    )

    # graphc.trace of the bound method: the prompt's logits (the caches are constants of the graph)
    fresh = kv_cache.Llama(weights, kv_cache.ARGS)
    logits = kv_cache.Llama(weights, kv_cache.ARGS).forward(PROMPT, 0)
    close(graphc.evaluate(graphc.trace(fresh.forward, PROMPT, 0), PROMPT, 0), logits, 1e-5, 1e-6)


def test_kv_cache_model_gradients():
    weights = kv_cache.make_weights(kv_cache.ARGS)
    model = kv_cache.Llama(weights, kv_cache.ARGS)

    def loss(m, ids):
        return np.sum(m.forward(ids, 0) ** 2)

    value, grads = graphc.value_and_grad(loss)(model, PROMPT)
    assert isinstance(grads, kv_cache.Llama)
    np.testing.assert_allclose(value, loss(copy.deepcopy(model), PROMPT), rtol=1e-5)
    # the weights' gradients against finite differences (the caches are overwritten at 0 anyway)
    step = 1e-2
    for name in ("q_weight", "o_weight"):
        direction = np.random.default_rng(3).standard_normal(getattr(model.layers[0].attention, name).shape)
        direction = direction.astype(np.float32)
        plus, minus = copy.deepcopy(model), copy.deepcopy(model)
        setattr(plus.layers[0].attention, name, getattr(plus.layers[0].attention, name) + step * direction)
        setattr(minus.layers[0].attention, name, getattr(minus.layers[0].attention, name) - step * direction)
        numeric = (float(loss(plus, PROMPT)) - float(loss(minus, PROMPT))) / (2 * step)
        predicted = float(np.sum(getattr(grads.layers[0].attention, name) * direction))
        np.testing.assert_allclose(predicted, numeric, rtol=2e-2)
    value_jit, grads_jit = graphc.jit(graphc.value_and_grad(loss))(model, PROMPT)
    np.testing.assert_allclose(value_jit, value, rtol=1e-4)
    close(grads_jit.lm_head_weight, grads.lm_head_weight, 1e-3, 1e-4)
    close(grads_jit.layers[1].attention.k_weight, grads.layers[1].attention.k_weight, 1e-3, 1e-4)


# --- an RNN with a preallocated buffer of hidden states --------------------------------------------


def rnn_example():
    r = np.random.default_rng(0)
    T, N, D, H, V = 5, 4, 3, 6, 7
    params = {
        "Wx": 0.3 * r.standard_normal((D, H)),
        "Wh": 0.3 * r.standard_normal((H, H)),
        "b": 0.1 * r.standard_normal(H),
        "W_vocab": 0.3 * r.standard_normal((H, V)),
        "b_vocab": np.zeros(V),
    }
    return params, r.standard_normal((T, N, D)), r.integers(0, V, (T, N)), r.standard_normal((N, H))


def test_rnn_with_preallocated_hidden_states():
    params, x, y, h0 = rnn_example()
    want, want_grads = rnn_buffer.loss_and_grads(params, x, y, h0)
    want_grads = in_order(want_grads, params)
    np.testing.assert_allclose(rnn_buffer.loss(params, x, y, h0), want, rtol=1e-13)

    close(graphc.evaluate(graphc.trace(rnn_buffer.loss, params, x, y, h0), params, x, y, h0), want)
    close(graphc.jit(rnn_buffer.loss)(params, x, y, h0), want)
    close(
        graphc.jit(rnn_buffer.rnn_forward)(x, h0, params["Wx"], params["Wh"], params["b"]),
        rnn_buffer.rnn_forward(x, h0, params["Wx"], params["Wh"], params["b"]),
    )
    # graphc's gradient equals the hand-written backpropagation through time
    close(graphc.value_and_grad(rnn_buffer.loss)(params, x, y, h0), (want, want_grads))
    # and the hand-written backward itself (in-place += and -= into its buffers) compiles
    value, grads = graphc.jit(rnn_buffer.loss_and_grads)(params, x, y, h0)
    close((value, in_order(grads, params)), (want, want_grads))
    got_mesh = graphc.parallelize(graphc.value_and_grad(rnn_buffer.loss), mesh=mesh(), cache=False)(params, x, y, h0)
    close(got_mesh, (want, want_grads))


# --- dropout with np.random -----------------------------------------------------------------------


def dropout_example():
    r = np.random.default_rng(0)
    params = dropout_mlp.init_params([6, 10, 8, 3])
    for k in params:  # nonzero biases: no pre-activation is exactly 0 where ReLU's subgradient is a choice
        if k.startswith("b"):
            params[k] = 0.01 * r.standard_normal(params[k].shape)
    return params, r.standard_normal((8, 6)), r.integers(0, 3, 8)


def philox(key):
    return np.random.Generator(np.random.Philox(key=key))


def test_dropout_with_a_generator_draws_numpys_masks():
    params, X, y = dropout_example()
    ours, theirs = philox(7), philox(7)
    fn = graphc.jit(dropout_mlp.loss)
    for _ in range(2):  # the second call draws the next masks, as numpy does
        close(fn(params, X, y, 0.5, ours), dropout_mlp.loss(params, X, y, 0.5, theirs))
    assert ours.random() == theirs.random()  # the Generator advanced as far as numpy's

    # graphc.trace takes the Generator's state as an input
    graph = graphc.trace(dropout_mlp.loss, params, X, y, 0.5, philox(9))
    close(
        graphc.evaluate(graph, params, X, y, 0.5, philox_state(philox(9))),
        dropout_mlp.loss(params, X, y, 0.5, philox(9)),
    )


def test_dropout_with_legacy_np_random_under_rng_seed(monkeypatch):
    params, X, y = dropout_example()
    with graphc.rng_seed(3):
        got = graphc.jit(dropout_mlp.loss)(params, X, y)
    stream = philox(3)  # the legacy rand of a rng_seed(3) block is Generator(Philox(key=3)).random
    monkeypatch.setattr(np.random, "rand", lambda *shape: stream.random(shape))
    close(got, dropout_mlp.loss(params, X, y))


def test_dropout_gradients_equal_the_hand_written_backward_and_shard_bit_for_bit():
    params, X, y = dropout_example()
    reg = 0.1

    def step(params, rng):  # the data is a closure, as in a training script
        return graphc.value_and_grad(lambda p: dropout_mlp.loss(p, X, y, 0.5, rng, reg)[0])(params)

    def numpy_step(params, rng):  # numpy's masks from the equal stream, the hand-written backward
        _, masks = dropout_mlp.loss(params, X, y, 0.5, rng, reg)
        value, grads = dropout_mlp.loss_with_masks(params, X, y, masks, 0.5, reg)
        return value, in_order(grads, params)

    theirs = philox(5)
    close(step(params, philox(5)), numpy_step(params, theirs))
    eager, jitted, sharded = philox(5), philox(5), philox(5)
    for generator in (eager, jitted, sharded):
        generator.random(144)  # past the first call's masks (8 x 10 + 8 x 8 words)
    want = numpy_step(params, theirs)
    close(step(params, eager), want)
    close(graphc.jit(step)(params, jitted), want)
    close(graphc.parallelize(step, mesh=mesh(), cache=False)(params, sharded), want)

    # the masks of a sharded run are the unsharded run's bits
    def masks(params, X, rng):
        return dropout_mlp.loss(params, X, y, 0.5, rng)[1]

    sharded_masks = graphc.parallelize(masks, mesh=mesh(), cache=False)(params, X, philox(11))
    for got, one in zip(sharded_masks, graphc.jit(masks)(params, X, philox(11))):
        np.testing.assert_array_equal(got, one)


# --- an autograd-style functional net: a list of (W, b) tuples ------------------------------------


def test_functional_net_of_weight_tuples():
    params = functional_net.init_random_params(0.5, [6, 8, 3], rs=np.random.RandomState(0))
    r = np.random.default_rng(3)
    inputs, targets = r.standard_normal((8, 6)), np.eye(3)[r.integers(0, 3, 8)]
    want = functional_net.objective(params, inputs, targets)

    close(
        graphc.evaluate(graphc.trace(functional_net.objective, params, inputs, targets), params, inputs, targets), want
    )
    close(graphc.jit(functional_net.objective)(params, inputs, targets), want)
    close(
        graphc.jit(functional_net.accuracy)(params, inputs, targets), functional_net.accuracy(params, inputs, targets)
    )

    # autograd's usage: grad of a lambda closing over the data
    objective = lambda params: functional_net.objective(params, inputs, targets)  # noqa: E731
    grads = graphc.grad(objective)(params)
    assert type(grads) is list and all(type(g) is tuple and len(g) == 2 for g in grads)
    flat, tree = flatten(params)
    for i, leaf in enumerate(flat):
        numeric = np.zeros_like(leaf)
        for j in np.ndindex(leaf.shape):
            bumped = [a.copy() for a in flat]
            bumped[i][j] += 1e-6
            up = objective(unflatten(tree, bumped))
            bumped[i][j] -= 2e-6
            numeric[j] = (up - objective(unflatten(tree, bumped))) / 2e-6
        np.testing.assert_allclose(flatten(grads)[0][i], numeric, rtol=1e-5, atol=1e-7)

    def sgd_step(params, inputs, targets, step_size=0.1):
        g = graphc.grad(functional_net.objective)(params, inputs, targets)
        return [(W - step_size * dW, b - step_size * db) for (W, b), (dW, db) in zip(params, g)]

    want_step = [(W - 0.1 * dW, b - 0.1 * db) for (W, b), (dW, db) in zip(params, grads)]
    close(graphc.jit(sgd_step)(params, inputs, targets), want_step)
    close(graphc.parallelize(sgd_step, mesh=mesh(), cache=False)(params, inputs, targets), want_step)


# --- writes through views, boolean masks and np.add.at into buffers (issue 32 items 1-3) -----------


def check_hand_written_backward(module, params, *data):
    """``module.loss`` traced, jitted, differentiated and sharded equals numpy; graphc's gradient
    equals ``module.loss_and_grads`` (the hand-written backward), which itself compiles."""
    want, want_grads = module.loss_and_grads(params, *data)[:2]
    want_grads = in_order(want_grads, params)
    np.testing.assert_allclose(module.loss(params, *data), want, rtol=1e-13)
    close(graphc.evaluate(graphc.trace(module.loss, params, *data), params, *data), want)
    close(graphc.jit(module.loss)(params, *data), want)
    close(graphc.value_and_grad(module.loss)(params, *data), (want, want_grads))
    value, grads = graphc.jit(module.loss_and_grads)(params, *data)[:2]
    close((value, in_order(grads, params)), (want, want_grads))
    got_mesh = graphc.parallelize(graphc.value_and_grad(module.loss), mesh=mesh(), cache=False)(params, *data)
    close(got_mesh, (want, want_grads))


def test_softmax_cross_entropy_backward_through_a_transpose():
    r = np.random.default_rng(11)
    params = softmax_backward.init_params(r, 5, 8, 4)
    X, y = r.standard_normal((5, 6)), r.integers(0, 4, 6)
    check_hand_written_backward(softmax_backward, params, X, y)
    # the write through grad_y = probs.T lands in probs, as in numpy
    probs = softmax_backward.softmax(r.standard_normal((4, 6)))
    close(
        graphc.jit(softmax_backward.softmax_cross_entropy_backward)(probs, y),
        softmax_backward.softmax_cross_entropy_backward(probs.copy(), y),
    )


def test_relu_backward_through_boolean_masks():
    r = np.random.default_rng(12)
    params = relu_backward.init_params(r, [5, 8, 6, 3])
    X, y = r.standard_normal((7, 5)), r.integers(0, 3, 7)
    check_hand_written_backward(relu_backward, params, X, y)


def test_col2im_with_add_at_into_a_zeros_buffer():
    r = np.random.default_rng(13)
    params = {"w": 0.3 * r.standard_normal((3, 2, 3, 3)), "b": 0.1 * r.standard_normal(3)}
    x, target = r.standard_normal((2, 2, 5, 5)), 0.5 * r.standard_normal((2, 3, 5, 5))
    check_hand_written_backward(conv_col2im, params, x, target)
    _, _, want_dx = conv_col2im.loss_and_grads(params, x, target)
    close(graphc.grad(conv_col2im.loss, argnums=1)(params, x, target), want_dx)
    # col2im is im2col's adjoint: its gradient is im2col of the cotangent
    cols, weights = r.standard_normal((18, 50)), r.standard_normal(x.shape)
    spread = lambda c: np.sum(conv_col2im.col2im_indices(c, x.shape) * weights)  # noqa: E731
    close(graphc.jit(spread)(cols), spread(cols))
    close(graphc.grad(spread)(cols), conv_col2im.im2col_indices(weights, 3, 3))


def test_gnn_scatter_add_into_a_zeros_buffer():
    r = np.random.default_rng(14)
    params = gnn_scatter.init_params(r, [4, 5, 3])
    h, edges, target = r.standard_normal((6, 4)), r.integers(0, 6, (2, 15)), r.standard_normal((6, 3))
    want = gnn_scatter.loss(params, h, edges, target)
    close(graphc.evaluate(graphc.trace(gnn_scatter.loss, params, h, edges, target), params, h, edges, target), want)
    close(graphc.jit(gnn_scatter.loss)(params, h, edges, target), want)
    value, grads = graphc.value_and_grad(gnn_scatter.loss)(params, h, edges, target)
    close(value, want)
    directional_check(lambda p: gnn_scatter.loss(p, h, edges, target), params, grads, eps=1e-6, rtol=1e-6)
    got_mesh = graphc.parallelize(graphc.value_and_grad(gnn_scatter.loss), mesh=mesh(), cache=False)(
        params, h, edges, target
    )
    close(got_mesh, (value, grads))


# --- np.convolve, np.isneginf, np.column_stack and einops (issue 32 items 4 and 6) -----------------


def check_model(loss, params, *data, eps=1e-6, grad_rtol=1e-6):
    """``loss`` traced, jitted, differentiated and run on a 2x2 mesh equals numpy; its gradient
    equals central differences along a random direction. Returns the gradient."""
    want = loss(params, *data)
    close(graphc.evaluate(graphc.trace(loss, params, *data), params, *data), want)
    close(graphc.jit(loss)(params, *data), want)
    value, grads = graphc.value_and_grad(loss)(params, *data)
    close(value, want)
    directional_check(lambda p: loss(p, *data), params, grads, eps, grad_rtol)
    got_mesh = graphc.parallelize(graphc.value_and_grad(loss), mesh=mesh(), cache=False)(params, *data)
    close(got_mesh, (value, grads))
    return grads


def test_mamba_causal_conv_with_np_convolve():
    r = np.random.default_rng(15)
    params = mamba_conv.init_params(r)
    x, target = r.standard_normal((2, 6, 4)), r.standard_normal((2, 6, 4))
    check_model(mamba_conv.loss, params, x, target)
    # the conv alone: out[t] depends on x[t - 3 .. t] only
    conv = graphc.jit(mamba_conv.causal_conv1d)
    u = r.standard_normal((2, 6, 6))
    later = u.copy()
    later[:, 4:] += 1.0
    close(conv(u, params["conv_w"], params["conv_b"]), mamba_conv.causal_conv1d(u, params["conv_w"], params["conv_b"]))
    close(conv(later, params["conv_w"], params["conv_b"])[:, :4], conv(u, params["conv_w"], params["conv_b"])[:, :4])


def test_attention_with_isneginf_masks():
    r = np.random.default_rng(16)
    params = masked_attention.init_params(r, 4)
    x, target = r.standard_normal((4, 4, 4)), r.standard_normal((4, 4, 4))
    mask = masked_attention.padding_mask(np.array([4, 2, 1, 3]), 4)  # left padding: some queries see no key
    out = masked_attention.self_attention(params, x, mask, 2)
    assert np.all(out[1, :2] == 0) and np.all(np.isfinite(out))
    close(graphc.jit(masked_attention.self_attention, static_argnames=("num_heads",))(params, x, mask, 2), out)
    grads = check_model(masked_attention.loss, params, x, mask, target)
    assert all(np.all(np.isfinite(g)) for g in grads.values())
    # a boolean mask takes the other branch of compute_attention
    q, k, v = (r.standard_normal((2, 2, 3, 2)) for _ in range(3))
    keep = r.standard_normal((2, 1, 3, 3)) > 0
    close(
        graphc.jit(masked_attention.compute_attention)(q, k, v, keep),
        masked_attention.compute_attention(q, k, v, keep),
    )


def test_gru_step_with_column_stack():
    r = np.random.default_rng(17)
    params = gru_stack.init_params(r, 3, 4, 5)
    xs, h0, labels = r.standard_normal((4, 2, 3)), 0.1 * r.standard_normal((2, 4)), r.integers(0, 5, (4, 2))
    check_model(gru_stack.loss, params, xs, h0, labels)
    close(graphc.jit(gru_stack.gru_step)(xs[0], h0, params), gru_stack.gru_step(xs[0], h0, params))


def test_einops_classifier():
    pytest.importorskip("einops")  # a test dependency (the test extra)
    from tests.models.real_models import einops_classifier

    r = np.random.default_rng(18)
    params = einops_classifier.init_params(r, 4, 3)
    x, labels = r.standard_normal((2, 4, 4)), r.integers(0, 3, 2)
    check_model(einops_classifier.loss, params, x, labels)
    close(graphc.jit(einops_classifier.classify)(params, x), einops_classifier.classify(params, x))
