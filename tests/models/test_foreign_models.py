"""graphc on numpy models written without graphc in mind (see tests/models/foreign_models.py).

For every model: trace, then check
  * evaluate(graph, ...) returns the same pytree as the eager call: same structure, static leaves,
    shapes, dtypes, and values (allclose);
  * the text IR round-trips: print(parse(print(g))) == print(g);
  * g.verify() passes.
Patterns graphc does not support must raise TraceError at the offending line of this file.
"""

import inspect
import os
import sys

import numpy as np
import pytest

import graphc

sys.path.insert(0, os.path.dirname(__file__))
import foreign_models  # noqa: E402

THIS_FILE = os.path.basename(__file__)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


def _is_array(x):
    return isinstance(x, (np.ndarray, np.generic))


def assert_same_pytree(got, want, rtol, path="result"):
    """Same containers, same static leaves, and for array leaves same shape, dtype and close values."""
    if _is_array(want):
        assert _is_array(got), f"{path}: expected an array, got {type(got).__name__}: {got!r}"
        got_a, want_a = np.asarray(got), np.asarray(want)
        assert got_a.shape == want_a.shape, f"{path}: shape {got_a.shape} != {want_a.shape}"
        assert got_a.dtype == want_a.dtype, f"{path}: dtype {got_a.dtype} != {want_a.dtype}"
        # a numpy scalar stays a scalar, an array stays an array
        assert isinstance(got, np.ndarray) == isinstance(want, np.ndarray) or want_a.ndim == 0, path
        if want_a.dtype.kind in "biu":
            np.testing.assert_array_equal(got_a, want_a, err_msg=path)
        else:
            np.testing.assert_allclose(got_a, want_a, rtol=rtol, atol=rtol * 1e-2, err_msg=path)
        return
    assert type(got) is type(want), f"{path}: type {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got.keys()) == list(want.keys()), f"{path}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same_pytree(got[k], want[k], rtol, f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_pytree(g, w, rtol, f"{path}[{i}]")
    else:  # static python leaf
        assert got == want, f"{path}: {got!r} != {want!r}"


def check_model(fn, args, kwargs, rtol):
    want = fn(*args, **kwargs)
    g = graphc.trace(fn, *args, **kwargs)
    g.verify()
    got = graphc.evaluate(g, *args, **kwargs)
    assert_same_pytree(got, want, rtol)
    text = str(g)
    g2 = graphc.parse(text)
    assert str(g2) == text
    g2.verify()
    assert_same_pytree(graphc.evaluate(g2, *args, **kwargs), want, rtol)
    return g


def marked_line(fn, marker="# <- TraceError"):
    """The line number (in this file) of the statement in ``fn`` carrying ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, line in enumerate(lines) if marker in line]
    assert len(hits) == 1, hits
    return hits[0]


def assert_trace_error_at(fn, *args, **kwargs):
    line = marked_line(fn)
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(fn, *args, **kwargs)
    msg = str(info.value)
    assert f"{THIS_FILE}:{line}:" in msg, f"expected {THIS_FILE}:{line} in {msg!r}"
    return msg


# ------------------------------------------------------------------------------------------------
# the helper itself
# ------------------------------------------------------------------------------------------------


def test_assert_same_pytree_catches_differences():
    a = np.ones(3, np.float32)
    assert_same_pytree({"x": a, "n": 3}, {"x": a.copy(), "n": 3}, 1e-6)
    for got, want in [
        (a, a.astype(np.float64)),  # dtype
        (a, np.ones(4, np.float32)),  # shape
        (a + 1e-3, a),  # value
        ((a,), [a]),  # container type
        ({"x": a, "n": 3}, {"x": a, "n": 4}),  # static leaf
        ({"x": a, "n": 3.0}, {"x": a, "n": 3}),  # static leaf type
        ([a, a], [a]),  # length
        (np.float64(1.0), 1.0),  # array vs python scalar
    ]:
        with pytest.raises(AssertionError):
            assert_same_pytree(got, want, 1e-6)


# ------------------------------------------------------------------------------------------------
# models graphc must handle
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(foreign_models.MODELS))
def test_foreign_model(name):
    fn, args, kwargs, rtol = foreign_models.MODELS[name]()
    check_model(fn, args, kwargs, rtol)


def test_picogpt_gelu_promotes_to_float64():
    # np.sqrt(2 / np.pi) is a float64 numpy scalar: float32 activations become float64 (NEP 50)
    fn, args, kwargs, _ = foreign_models.make_gpt2_token_array()
    assert fn(*args, **kwargs).dtype == np.float64
    g = graphc.trace(fn, *args, **kwargs)
    (out,) = g.outputs
    assert out.type.dtype == np.float64
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    g = graphc.trace(foreign_models.pico_gelu, x)
    assert graphc.evaluate(g, x).dtype == np.float64


def test_text_classifier_accuracy_is_float64_scalar():
    fn, args, kwargs, _ = foreign_models.make_text_classifier()
    loss, acc = graphc.evaluate(graphc.trace(fn, *args, **kwargs), *args, **kwargs)
    assert isinstance(acc, np.float64) and isinstance(loss, np.float32)


def test_static_outputs_survive():
    fn, args, kwargs, _ = foreign_models.make_moe()
    out = graphc.evaluate(graphc.trace(fn, *args, **kwargs), *args, **kwargs)
    assert out["num_experts"] == 3 and type(out["num_experts"]) is int
    fn, args, kwargs, _ = foreign_models.make_autoencoder()
    out = graphc.evaluate(graphc.trace(fn, *args, **kwargs), *args, **kwargs)
    assert out[3:] == (3, "tanh")


def test_static_flags_select_different_graphs():
    fn, args, _, _ = foreign_models.make_encoder()
    g_eval = graphc.trace(fn, *args, training=False)
    g_train = graphc.trace(fn, *args, training=True)
    assert len(g_train.outputs) == 2 and len(g_eval.outputs) == 1
    with pytest.raises(graphc.EvaluationError):
        graphc.evaluate(g_eval, *args, training=True)


# ------------------------------------------------------------------------------------------------
# known unsupported patterns: TraceError at the offending line
# ------------------------------------------------------------------------------------------------


# in-place writes (once TraceErrors here; traced functionally since issue 20, tests/frontend/test_inplace.py)


def zero_padding_embedding(emb, tokens):
    emb[0] = 0.0
    return emb[tokens].mean(axis=1)


def test_inplace_setitem_on_traced_array():
    rng = np.random.default_rng(0)
    emb, tokens = rng.standard_normal((5, 3)), rng.integers(0, 5, (2, 4))
    check_model(zero_padding_embedding, (emb, tokens), {}, 1e-12)


def im2col_inplace(x, w):
    N, C, H, W = x.shape
    F, _, k, _ = w.shape
    oh, ow = H - k + 1, W - k + 1
    col = np.zeros((N, C, k, k, oh, ow), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            col[:, :, i, j, :, :] = x[:, :, i : i + oh, j : j + ow]
    col = col.transpose(0, 4, 5, 1, 2, 3).reshape(N * oh * ow, -1)
    return (col @ w.reshape(F, -1).T).reshape(N, oh, ow, F).transpose(0, 3, 1, 2)


def test_inplace_setitem_on_numpy_buffer():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    check_model(im2col_inplace, (x, w), {}, 1e-5)


def conv_accumulate(x, w):
    N, C, H, W = x.shape
    F, _, k, _ = w.shape
    oh, ow = H - k + 1, W - k + 1
    out = np.zeros((N, F, oh, ow), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            out += np.einsum("nchw,fc->nfhw", x[:, :, i : i + oh, j : j + ow], w[:, :, i, j])
    return out


def test_augmented_assignment_into_numpy_buffer():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    check_model(conv_accumulate, (x, w), {}, 1e-5)


def clip_grad_norm(grads, max_norm=1.0):
    total = np.sqrt(sum(np.sum(g**2) for g in grads))
    if total > max_norm:  # becomes a graph cond (source transform)
        grads = [g * (max_norm / total) for g in grads]
    return grads


@pytest.mark.parametrize("scale", [1.0, 0.01], ids=["clipped", "unclipped"])
def test_python_if_on_traced_value(scale):
    rng = np.random.default_rng(3)
    grads = [scale * rng.standard_normal(3), scale * rng.standard_normal((2, 2))]
    graph = graphc.trace(clip_grad_norm, grads)
    assert any(n.op.name == "cond" for n in graph.nodes)
    assert_same_pytree(graphc.evaluate(graph, grads), clip_grad_norm(grads), rtol=1e-12)


def fit_until_converged(w, X, y, lr=0.1, tol=1e-3):
    loss = np.mean((X @ w - y) ** 2)
    while loss > tol:  # becomes a graph while_loop (source transform)
        w = w - lr * 2 * X.T @ (X @ w - y) / len(y)
        loss = np.mean((X @ w - y) ** 2)
    return w


def test_python_while_on_traced_value():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((5, 2))
    y = X @ np.array([0.5, -1.0])  # exactly solvable: the loop converges
    graph = graphc.trace(fit_until_converged, np.zeros(2), X, y)
    assert any(n.op.name == "while_loop" for n in graph.nodes)
    assert_same_pytree(graphc.evaluate(graph, np.zeros(2), X, y), fit_until_converged(np.zeros(2), X, y), rtol=1e-12)


def greedy_generate(inputs, params, n_tokens_to_generate):
    for _ in range(n_tokens_to_generate):
        logits = foreign_models.gpt2(inputs, **params, n_head=2)
        next_id = int(np.argmax(logits[-1]))  # <- TraceError
        inputs.append(next_id)
    return inputs[len(inputs) - n_tokens_to_generate :]


def test_int_of_traced_value_in_generation_loop():
    _, (inputs,), params, _ = foreign_models.make_gpt2_token_list()
    params = {k: v for k, v in params.items() if k != "n_head"}
    assert_trace_error_at(greedy_generate, list(inputs), params, 2)


def masked_mean_loss(logits, labels, valid):
    losses = np.log(np.exp(logits).sum(-1)) - logits[np.arange(len(labels)), labels]
    return losses[valid > 0].mean()  # <- TraceError


def test_boolean_mask_indexing_with_traced_mask():
    rng = np.random.default_rng(5)
    msg = assert_trace_error_at(
        masked_mean_loss, rng.standard_normal((6, 3)), rng.integers(0, 3, 6), (rng.random(6) > 0.3).astype(np.float64)
    )
    assert "np.where" in msg


def top_p_filter(logits, p=0.9):
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    sorted_probs = np.sort(probs)[::-1]  # (np.sort and np.cumsum are supported since issue 20)
    cutoff = sorted_probs[np.cumsum(sorted_probs) <= p].min()  # <- TraceError
    return np.where(probs >= cutoff, logits, -np.inf)


def test_data_dependent_mask_after_sort():
    msg = assert_trace_error_at(top_p_filter, np.random.default_rng(6).standard_normal(10))
    assert "data-dependent" in msg


def top_p_filter_static(logits, p=0.9):
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    sorted_probs = np.sort(probs)[::-1]
    kept = np.cumsum(sorted_probs) <= p
    cutoff = np.min(np.where(kept, sorted_probs, np.inf))  # the static-shape rewrite of the mask
    return np.where(probs >= cutoff, logits, -np.inf)


def test_np_sort():
    check_model(top_p_filter_static, (np.random.default_rng(6).standard_normal(10),), {}, 1e-12)


def cumulative_returns(rewards, gamma=0.99):
    T = rewards.shape[-1]
    discounts = gamma ** np.arange(T)
    return np.cumsum(rewards * discounts, axis=-1)


def test_np_cumsum():
    check_model(cumulative_returns, (np.random.default_rng(7).standard_normal((2, 5)),), {}, 1e-12)


def running_total(x):
    return x.cumsum(axis=-1)


def test_cumsum_method():
    check_model(running_total, (np.ones((2, 3)),), {}, 0)


def spectrum(x):
    return np.fft.rfft(x, axis=-1)  # <- TraceError


def test_unsupported_function_is_trace_error():
    assert "numpy.fft.rfft is not supported" in assert_trace_error_at(spectrum, np.ones((2, 4)))


def main_diagonal(x):
    return x.diagonal()  # <- TraceError


def test_unsupported_method_is_trace_error():
    assert "ndarray.diagonal is not supported" in assert_trace_error_at(main_diagonal, np.ones((2, 3)))
