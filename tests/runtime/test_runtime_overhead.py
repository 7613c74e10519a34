"""The runtime's low-overhead paths (issue 19) keep their meaning: the straight-line code of
small programs (views inlined, dead values deleted), the rewrites of training-step backward
passes (sums of padded slices, batched weight gradients), and the RNN models whose hand-written
backward is the benchmark's peer."""

import numpy as np
import pytest

import graphc
from graphc.core.ir import walk
from graphc.models import rnn
from tests.helpers import assert_arrays_close


def close(got, want, rtol, atol):
    assert_arrays_close([got], [want], rtol, atol)


ELMAN = (rnn.example_args, rnn.elman_loss, rnn.elman_loss_and_grads_numpy)
LSTM = (rnn.example_lstm_args, rnn.lstm_loss, rnn.lstm_loss_and_grads_numpy)


@pytest.mark.parametrize(
    "steps, batch, example, loss, hand",
    [
        (20, 8, *ELMAN),
        # 11 s alone, 21 s loaded: Numba compiles its backward's wide kernels (one of 64 operands and 98
        # results: the 20 steps' independent elementwise ops) on a fresh machine; 3 steps run in the full run
        pytest.param(20, 8, *LSTM, marks=pytest.mark.long),
        (1, 1, *ELMAN),
        (1, 1, *LSTM),
        (3, 2, *ELMAN),
        (3, 2, *LSTM),
    ],
)
def test_rnn_hand_written_gradients_equal_graphc(steps, batch, example, loss, hand):
    (params, xs, ys), _ = example(steps=steps, batch=batch)
    want_loss, want = hand(params, xs, ys)
    got_loss, got = graphc.jit(graphc.value_and_grad(loss))(params, xs, ys)
    assert got_loss.dtype == want_loss.dtype == np.float32
    close(got_loss, want_loss, 1e-5, 1e-6)
    for k in params:
        assert got[k].dtype == np.float32
        close(got[k], want[k], 1e-4, 1e-6)
    close(graphc.jit(loss)(params, xs, ys), loss(params, xs, ys), 1e-5, 1e-6)


def _ops(fn, *args):
    return [n.op.name for n in walk(graphc.jit(fn).compile(*args).graph.nodes)]


@pytest.mark.parametrize("bounds", [(0, 3, 5, 8), (0, 2, 6, 8), (1, 3, 5, 7), (0, 8)])
def test_gradients_of_slices_are_one_concatenate(bounds):
    """d/dx of f(x[:, a:b], x[:, c:d], ...): the sum of the slices' padded cotangents becomes a
    concatenate (zeros in the gaps); values equal the reference interpreter."""
    pieces = list(zip(bounds[::2], bounds[1::2]))

    def loss(x, w):
        return sum(np.sum(np.tanh(x[:, a:b]) * w[: b - a] * (k + 1)) for k, (a, b) in enumerate(pieces))

    x = np.random.default_rng(0).standard_normal((4, 8))
    w = np.linspace(0.5, 1.5, 8)
    g = graphc.grad(loss)
    ops = _ops(g, x, w)
    assert "pad" not in ops or ops.count("pad") == 1
    want = graphc.evaluate(graphc.trace(g, x, w), x, w)
    close(graphc.jit(g)(x, w), want, 1e-12, 1e-12)
    covered = np.zeros(8, bool)
    for a, b in pieces:
        covered[a:b] = True
    assert np.all(graphc.jit(g)(x, w)[:, ~covered] == 0)


def test_overlapping_slices_still_add():
    def loss(x):
        return np.sum(x[:, 0:5] ** 2) + np.sum(np.sin(x[:, 3:8]))

    x = np.random.default_rng(1).standard_normal((3, 8))
    got = graphc.jit(graphc.grad(loss))(x)
    want = 2 * x * (np.arange(8) < 5) + np.cos(x) * (np.arange(8) >= 3)
    close(got, want, 1e-12, 1e-12)


@pytest.mark.parametrize("shape", [(8, 16, 32), (2, 3, 5, 7), (1, 1, 4), (3, 0, 4)])
def test_batched_weight_gradient_is_one_matmul(shape):
    """sum_b x_b^T g_b over the batch dims is one matmul on the flattened rows."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[-1], 6)).astype(np.float32)

    def loss(w, x):
        return np.sum(np.tanh(x @ w))

    g = graphc.grad(loss)
    graph = graphc.jit(g).compile(w, x).graph
    sums_of_products = [
        n
        for n in graph.nodes
        if n.op.name == "reduce_sum" and n.inputs[0].producer is not None and n.inputs[0].producer.op.name == "matmul"
    ]
    assert not sums_of_products
    x64 = x.astype(np.float64).reshape(-1, shape[-1])
    want = x64.T @ (1 - np.tanh(x64 @ w) ** 2)
    got = graphc.jit(g)(w, x)
    assert got.shape == w.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_straight_line_program_views_and_dead_values():
    """A small program runs as generated code: views used once are inlined into their user, views
    used twice or returned stay values, and the results equal the interpreter's."""

    def f(x, w):
        a = x[1:3].reshape(1, 4)  # slice -> reshape -> matmul: one line
        b = x.T[::2]  # a transposed view used twice
        c = a @ w + 1
        return c, b * 2, b.sum(), x.reshape(-1)  # a returned view

    x = np.arange(12.0).reshape(4, 3)[:, :2].copy()
    w = np.ones((4, 5))
    compiled = graphc.jit(f).compile(x, w)
    program = compiled.executable.program
    assert program._straight is not None
    want = graphc.evaluate(compiled.traced, x, w)
    got = compiled(x, w)
    assert_arrays_close(got, want, 0, 0)
    assert not np.shares_memory(got[3], x)  # a result is the caller's own array, never a view of an argument


def test_straight_line_errors_name_the_step():
    def f(t, i):
        y = t * 2
        return y[i] + 1

    with pytest.raises(IndexError) as info:
        graphc.jit(f)(np.ones(3), np.array([9]))
    assert any("graphc: in gather at tests/runtime/test_runtime_overhead.py:" in n for n in info.value.__notes__)


@pytest.mark.parametrize("n, straight", [(256, True), (1024, False)])
def test_large_programs_keep_the_accounted_loop(n, straight):
    """Values under STRAIGHT_BYTES (1 MiB) run straight-line, fresh and unpooled; a larger one
    makes the program count its bytes and pool its buffers."""
    x = np.ones((n, n), np.float32)
    ex = graphc.jit(lambda a: np.tanh(a * 2) + 1).compile(x).executable  # one fused kernel
    assert (ex.program._straight is not None) == straight
    for _ in range(2):
        close(ex.run_flat([x])[0], np.tanh(x * 2) + 1, 1e-6, 1e-6)
    assert (ex.pool.allocated > 0) != straight


def _kernel_fn(x, y):
    return np.tanh(x * y + x) - y


@pytest.mark.filterwarnings("ignore:.*became float64")
@pytest.mark.parametrize("shape", [(8, 8), (1, 5), (0, 3), (3, 1)])
def test_fast_entry_checks_every_call(shape):
    """After a warm call, the generated entry takes arguments of the same shapes and dtypes; any
    other arguments (a transposed view, another dtype or shape, another count) still give numpy's
    answer, through the kernel's copy or the full path."""
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    f = graphc.jit(_kernel_fn)
    for _ in range(3):  # the first call compiles, the second sets the entry, the third takes it
        close(f(x, y), _kernel_fn(x, y), 1e-6, 1e-6)
    wide = rng.standard_normal((shape[1], shape[0])).astype(np.float32)
    close(f(wide.T, y), _kernel_fn(wide.T, y), 1e-6, 1e-6)  # same shape and dtype, not contiguous
    strided = rng.standard_normal((2 * shape[0], 2 * shape[1])).astype(np.float32)[::2, ::2]
    close(f(strided, y), _kernel_fn(strided, y), 1e-6, 1e-6)
    close(f(x.astype(np.float64), y), _kernel_fn(x.astype(np.float64), y), 1e-12, 1e-12)
    close(f(x, y[:, :1]), _kernel_fn(x, y[:, :1]), 1e-6, 1e-6)  # a broadcast operand
    close(f(x, y), _kernel_fn(x, y), 1e-6, 1e-6)  # back to the first specialization
    with pytest.raises(TypeError):
        f(x)


def test_fast_entry_results_are_numpy_s():
    """0-d results come back as numpy scalars, constant results as the caller's own copies."""

    def f(x):
        return (x * 2).sum(), np.arange(3.0), x * 3

    x = np.ones((4, 4), np.float32)
    g = graphc.jit(f)
    for _ in range(3):
        total, ramp, triple = g(x)
        assert type(total) is np.float32 and total == 32
        assert ramp.flags.writeable and triple.flags.writeable
        ramp[0] = 99.0  # the next call's constant is untouched
        assert triple.dtype == np.float32
    single = graphc.jit(lambda x: (x * 2).sum())
    for _ in range(3):
        got = single(x)
        assert type(got) is np.float32 and got == 32
    assert g(x)[1][0] == 0.0


def _tree_fn(params, xs):
    first = list(params.values())[0]  # depends on the dict's order, as Python code may
    return np.tanh(xs[0] @ params["w"] + params["b"]) * np.sum(first), [xs[1] * 2]


def test_tree_entry_checks_structure_and_leaves():
    """A warm call with a dict and a tuple of arrays takes the generated entry; any change of
    structure (dict order or keys, tuple length, a leaf that is a number or another shape) is a
    miss that the full path answers as numpy does."""
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    xs = (rng.standard_normal((2, 3)), rng.standard_normal(5))
    f = graphc.jit(_tree_fn)

    def check(params, xs):
        got, want = f(params, xs), _tree_fn(params, xs)
        close(got[0], want[0], 1e-12, 1e-12)
        close(got[1][0], want[1][0], 1e-12, 1e-12)
        assert type(got[1]) is list

    for _ in range(3):
        check({"w": w, "b": b}, xs)
    check({"b": b, "w": w}, xs)  # the other order: a different first value
    check({"w": w, "b": b, "c": w}, xs)
    check({"w": w, "b": b}, (xs[0], rng.standard_normal(7)))
    check({"w": w, "b": b}, [xs[0], xs[1]])
    check({"w": w, "b": 2.0}, xs)
    check({"w": w, "b": b[:1]}, xs)
    check({"w": w.astype(np.float32), "b": b}, xs)
    check({"w": w, "b": b}, xs)
    with pytest.raises(TypeError):
        f({"w": w, "b": b})


def test_dict_keys_equal_across_types_are_different_arguments():
    """1 == 1.0 == True, but a dict keyed by each traces differently (as the cache key says)."""

    def f(d):
        return {str(k): v * k for k, v in d.items()}

    x = np.arange(3)
    g = graphc.jit(f)
    for d in ({1: x}, {1: x}, {1.0: x}, {True: x}, {1: x}):
        got, want = g(d), f(d)
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype
            np.testing.assert_array_equal(got[k], want[k])


def test_alternating_specializations_keep_their_entries():
    """Calls that alternate between two specializations (a last partial batch) switch between
    two generated entries, made once each, for dicts of arrays and for plain arrays."""
    p = {"w": np.ones((3, 2))}
    cases = [
        (graphc.jit(lambda p, x: np.tanh(x @ p["w"])), lambda g, x: g(p, x), lambda x: np.tanh(x @ p["w"])),
        (graphc.jit(lambda x: np.tanh(x) * 2), lambda g, x: g(x), lambda x: np.tanh(x) * 2),
    ]
    for g, call, want in cases:
        for _ in range(3):
            for x in (np.ones((4, 3)), np.ones((5, 3))):
                call(g, x)
        entries = [c._entry for c in g._cache._entries.values()]
        assert len(entries) == 2 and None not in entries
        for x in (np.ones((4, 3)), np.ones((5, 3))) * 2:
            np.testing.assert_allclose(call(g, x), want(x))
            assert any(g._last_fast is e for e in entries)


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 0), (0, 4)), ((0, 3, 5), (5, 2)), ((2, 1, 4), (4, 0))])
def test_batched_matmul_with_empty_dims(a_shape, b_shape):
    a, b = np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)
    got = graphc.jit(lambda a, b: a @ b)(a, b)
    assert got.shape == (a @ b).shape
    np.testing.assert_array_equal(got, a @ b)
