"""Views and in-place writes while tracing (issue 27 items 2-8, issue 32 items 1-3): numpy's views
see every write into their base and write into it themselves, np.array copies, one numpy buffer
under several names is one array, duplicate indices, ``out=`` tuples, ``ufunc.at`` casting. Each
function runs under numpy, graphc.jit and graphc.trace + graphc.evaluate; gradients are checked
against a hand derivation or finite differences.

The values are small integers in float64, so every result here is exact in both numpy and graphc
and is compared bit for bit.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

import graphc
from graphc.core.pytree import flatten
from tests.helpers import line_of, numeric_grad

RNG = np.random.default_rng(7)
Y = np.arange(12.0).reshape(3, 4)


def _copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def assert_equal_trees(got, want):
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree, (got_tree, want_tree)
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_array_equal(g, w)


def check(fn, *args):
    """fn under graphc.jit and under trace + evaluate equals numpy's fn (on copies of the args)."""
    want = fn(*_copy(args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphc.GraphcWarning)  # (some functions write into their arguments)
        assert_equal_trees(graphc.jit(fn)(*_copy(args)), want)
        assert_equal_trees(graphc.evaluate(graphc.trace(fn, *args), *args), want)


# --- item 1: np.array copies, np.asarray does not ---------------------------------------------------


def array_copies(x):
    y = np.array(x)
    y[0] = 5.0
    z = np.asarray(y)  # the same array
    z[1] = 6.0
    w = np.array(y, copy=False)  # no copy either
    w[2] = 7.0
    c = np.asarray(y, copy=True)
    c[3] = 8.0
    return x, y, z, w, c


def test_np_array_copies_and_np_asarray_does_not():
    check(array_copies, np.arange(4.0))


def test_gradient_through_np_array_copy():
    def loss(x):
        x = x * 1.0
        y = np.array(x)
        y[0] = 0.0  # only the copy loses x[0]
        return np.sum(y * y) + np.sum(x)

    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(graphc.grad(loss)(x), np.array([1.0, 5.0, 7.0]))  # d/dx: [1, 2x + 1, 2x + 1]


# --- item 2: every view form sees a later write into its base, and writes into it ---------------------

VIEWS = {
    "slice": lambda y: y[1:],
    "column": lambda y: y[:, 1],
    "row": lambda y: y[1],
    "strided": lambda y: y[::2, 1::2],
    "reversed": lambda y: y[::-1],
    "none-ellipsis": lambda y: y[None, ..., 1:3],
    "T": lambda y: y.T,
    "transpose": lambda y: np.transpose(y),
    "swapaxes": lambda y: np.swapaxes(y, 0, 1),
    "moveaxis": lambda y: np.moveaxis(y[None], 0, 2),
    "reshape": lambda y: y.reshape(2, 6),
    "reshape-method-of-slice": lambda y: y[1:].reshape(-1),
    "ravel": lambda y: np.ravel(y),
    "ravel-method": lambda y: y.ravel(),
    "expand_dims": lambda y: np.expand_dims(y, 1),
    "squeeze": lambda y: np.squeeze(y[1:2]),
    "atleast_3d": lambda y: np.atleast_3d(y),
    "flip": lambda y: np.flip(y),
    "flip-axis": lambda y: np.flip(y, 1),
    "split-piece": lambda y: np.split(y, 2, axis=1)[1],
    "array_split-piece": lambda y: np.array_split(y, 2, axis=0)[0],
    "asarray": lambda y: np.asarray(y),
    "identity-slice": lambda y: y[:],
    "view-of-view": lambda y: y[1:].T[::-1],
}


def _views(name):
    make = VIEWS[name]

    def base_written(x):
        y = x * 1.0
        w = make(y)
        y[0, 0] = 99.0
        y[1:, -1] += 10.0
        y[:, 1:2] -= 5.0
        y[-1] *= 2.0
        return w

    def view_written(x):
        y = x * 1.0
        w = make(y)
        w[...] = w * 2.0 + 1.0
        if w.ndim and w.shape[0]:
            w[0] = -7.0
        w += 3.0
        return y, w

    return base_written, view_written


@pytest.mark.parametrize("name", list(VIEWS))
def test_view_sees_writes_into_its_base(name):
    base_written, _ = _views(name)
    check(base_written, Y)


@pytest.mark.parametrize("name", list(VIEWS))
def test_writes_into_a_view_reach_its_base(name):
    _, view_written = _views(name)
    check(view_written, Y)


@pytest.mark.parametrize("shape", [(0, 4), (1, 4), (3, 1), (1, 1), (3, 0)])
def test_views_of_size_zero_and_size_one_dims(shape):
    x = np.arange(float(np.prod(shape))).reshape(shape)
    for name in ("slice", "column", "T", "reshape-method-of-slice", "flip", "squeeze", "view-of-view"):
        if name == "column" and shape[1] < 2:
            continue
        base_written, view_written = _views(name)
        if shape[0] and shape[1]:
            check(base_written, x)
        check(view_written, x)


def views_at_traced_positions(x, t):
    y = x * 1.0
    row = y[t]  # a traced integer: still a view
    block = y[:, t : t + 2]  # a slice with traced bounds
    row[0] = -1.0
    y[1, 3] = 50.0
    block[...] += 100.0
    return y, row, block


def test_views_taken_with_traced_integers_and_slice_bounds():
    for t in (0, 1, 2):
        check(views_at_traced_positions, Y, np.int64(t))


def index_variable_moves_later(x, t):
    y = x * 1.0
    row = y[t]
    t += 1  # the view stays where it was taken
    y[0] += 1.0
    return row


def test_a_view_stays_where_it_was_taken():
    check(index_variable_moves_later, Y, np.int64(0))


def test_copies_are_not_views():
    def fn(x):
        y = x * 1.0
        a = y[[0, 2]]  # advanced indexing: a copy
        b = y.T.reshape(-1)  # numpy must copy a transposed array to flatten it
        c = y.T.ravel()
        d = y.flatten()
        e = y.copy()
        f = y[0, 1]  # a numpy scalar
        y[...] = -1.0
        f += 1.0
        return a, b, c, d, e, f

    check(fn, Y)


def test_reshape_of_a_contiguous_slice_is_a_view_and_of_a_strided_one_a_copy():
    def fn(x):
        y = x * 1.0
        a = y[1:].reshape(-1)  # rows: contiguous, a view
        b = y[:, 1:3].reshape(-1)  # columns: a copy
        c = y[:, 1:2].reshape(-1)  # one column: strided, but numpy can still view it
        y += 1.0
        return a, b, c

    check(fn, Y)


def test_writing_into_a_broadcast_view_raises_as_numpy_does():
    def fn(x):
        w = np.broadcast_to(x[0], (2, 4))
        w[0, 0] = 1.0  # <broadcast-write>
        return w

    with pytest.raises(ValueError, match="read-only"):
        fn(Y.copy())
    with pytest.raises(graphc.TraceError, match="read-only") as err:
        graphc.trace(fn, Y)
    assert f"test_views.py:{line_of('<broadcast-write>')}" in str(err.value)


def test_broadcast_views_see_writes_into_their_base():
    def fn(x):
        y = x * 1.0
        w = np.broadcast_to(y[0], (2, 4))
        a, b = np.broadcast_arrays(y[:, :1], y[0])
        y[0, 0] = 42.0
        return w, a, b

    check(fn, Y)


def view_writers(x, idx):
    y = x * 1.0
    w = y.T
    np.add.at(w, (idx, 0), 1.0)  # np.add.at into a view
    np.multiply(w[1], 2.0, out=w[1])  # out= a view of a view
    np.copyto(w[2], -3.0)
    np.put(w[3], [0, 2], [9.0, 8.0])
    w[1:3, 1] -= 0.5
    return y


def test_in_place_writers_into_views():
    check(view_writers, Y, np.array([0, 3, 0]))


def test_gradients_through_views_match_finite_differences():
    def loss(x):
        y = x * 1.0
        w = y.T
        w[1] = np.tanh(x[0, :3])  # a row of the transpose: a column of y
        flat = y.reshape(-1)
        flat[:2] *= 3.0
        return np.sum(np.sin(y) * np.arange(12.0).reshape(3, 4))

    x = RNG.standard_normal((3, 4))
    g = graphc.grad(loss)(x)
    np.testing.assert_allclose(g, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)  # (central differences, eps 1e-6)


# --- views through traced control flow ----------------------------------------------------------------


def view_of_root_written_in_branch(x, c):
    y = x * 1.0
    w = y.T
    if c > 0:
        y[0, 0] = 99.0
    return w


def write_through_view_in_branch(x, c):
    y = x * 1.0
    w = y.T
    if c > 0:
        w[0, 1] = 5.0
    else:
        w[1] += 1.0
    return y


def view_read_inside_branch(x, c):
    y = x * 1.0
    w = y[:, 0]
    if c > 0:
        y[1, 0] = 7.0
        s = w * 2.0  # the branch's write shows in the view
    else:
        s = w * 3.0
    return s, w


def alias_of_root_in_branch(x, c):
    y = x * 1.0
    z = y  # another name of the same array
    if c > 0:
        y[0] = -1.0
    return z


def bump(a):
    a[0] += 1.0  # a helper that writes into its argument


def helper_writes_in_branch(x, c):
    y = x * 1.0
    if c > 0:
        bump(y)
    return y


def rebound_in_one_branch(x, c):
    y = x * 1.0
    z = y
    if c > 0:
        y = y * 2.0  # a new array: z keeps the old one
    else:
        y[0] = 5.0  # the same array: z sees it
    return y, z


@pytest.mark.parametrize(
    "fn",
    [
        view_of_root_written_in_branch,
        write_through_view_in_branch,
        view_read_inside_branch,
        alias_of_root_in_branch,
        helper_writes_in_branch,
    ],
)
def test_views_and_aliases_through_a_traced_if(fn):
    graph = graphc.trace(fn, Y, np.float64(1.0))
    assert "cond" in [n.op.name for n in graph.nodes]
    for c in (1.0, -1.0):
        check(fn, Y, np.float64(c))


def test_a_name_rebound_in_one_branch_only_is_a_new_array():
    graph = graphc.trace(rebound_in_one_branch, Y, np.float64(1.0))
    for c in (1.0, -1.0):
        assert_equal_trees(graphc.evaluate(graph, Y, np.float64(c)), rebound_in_one_branch(Y.copy(), c))


def view_of_root_written_in_loop(x, n):
    y = x * 1.0
    w = y[:, 0]
    for i in range(n):  # n is traced: a fori_loop
        y[i, 0] += 10.0
    return w, y


def write_through_view_in_loop(x, n):
    y = x * 1.0
    w = y.T
    for i in range(n):
        w[0, i] = i * 2.0
    return y


def view_in_while_loop(x, n):
    y = x * 1.0
    col = y[:, 3]
    i = 0
    while i < n:
        col[i] = -1.0 * i
        i += 1
    return y


def helper_writes_in_loop(x, n):
    y = x * 1.0
    for _ in range(n):
        bump(y)
    return y


def buffer_and_alias_in_loop(x, n):
    buf = np.zeros(3)
    alias = buf
    for i in range(n):
        buf[i] = x[i, 0] + i
    return alias * 2.0


def numpy_view_and_alias_in_loop_and_if(x, n):
    buf = np.zeros((3, 4))
    alias = buf
    col = buf[:, 1]  # a numpy view of the buffer
    for i in range(n):
        if x[i, 0] > 0:  # a traced if inside the traced loop
            col[i] = x[i, 1]
        else:
            buf[i] += x[i]
    return alias, col


@pytest.mark.parametrize(
    "fn",
    [
        view_of_root_written_in_loop,
        write_through_view_in_loop,
        view_in_while_loop,
        helper_writes_in_loop,
        buffer_and_alias_in_loop,
        numpy_view_and_alias_in_loop_and_if,
    ],
)
def test_views_and_aliases_through_a_traced_loop(fn):
    graph = graphc.trace(fn, Y, np.int64(2))
    assert {"fori_loop", "while_loop"} & {n.op.name for n in graph.nodes}
    for n in (0, 1, 3):
        check(fn, Y, np.int64(n))


def test_gradient_through_a_view_written_in_a_graph_loop():
    def loss(x):
        y = x * 1.0
        w = y.T

        def body(i, count):
            w[0, i] = w[0, i] * x[i, 1]  # a view from outside the body, written at a traced position
            return [count + 1]

        graphc.fori_loop(0, 3, body, [0])
        return np.sum(y * y)

    def numpy_loss(x):
        y = x * 1.0
        y[:, 0] *= x[:, 1]
        return np.sum(y * y)

    x = RNG.standard_normal((3, 4))
    graph = graphc.trace(loss, x)
    assert "fori_loop" in [n.op.name for n in graph.nodes]
    np.testing.assert_allclose(graphc.evaluate(graph, x), numpy_loss(x), rtol=1e-15)
    g = graphc.grad(loss)(x)
    np.testing.assert_allclose(g, numeric_grad(numpy_loss, x), rtol=1e-6, atol=1e-8)  # (central differences)


# --- item 4: one numpy buffer under several names -----------------------------------------------------


def two_names(x):
    b = np.zeros(3)
    c = b
    c[0] = x[0]
    b[1] = 7.0
    return c


def two_names_pure_numpy_read(x):
    b = np.zeros(3)
    c = b
    v = b[1:]  # a numpy view of the buffer, taken before the write
    c[0] = x[0]
    c[2] = x[1]
    return b * 2.0, v + 1.0, b.sum(), np.sum(v)


def list_holds_the_buffer(x):
    b = np.zeros(3)
    bufs = [b, np.ones(2)]
    b[1] = x[0]
    return bufs, np.stack([bufs[0], b]), bufs[0] * 2.0


def numpy_view_written(x):
    b = np.zeros((2, 3))
    row = b[1]  # a numpy view
    row[0] = x[0]  # the write goes into b too
    b[0, 1] = x[1]
    return b, row


def writers_into_one_buffer(x, idx):
    b = np.zeros(4)
    c = b
    np.add.at(c, idx, x[:3])
    np.tanh(x[:4], out=(b,))
    np.add(b, 1.0, out=c)
    return b, c


def static_loop_over_buffer(x):
    b = np.zeros(3)
    alias = b
    for i in range(3):  # a Python int range: unrolled
        b[i] = x[i]
        alias[i] += 1.0
    return b, alias


@pytest.mark.parametrize(
    "fn", [two_names, two_names_pure_numpy_read, list_holds_the_buffer, numpy_view_written, static_loop_over_buffer]
)
def test_one_numpy_buffer_under_several_names(fn):
    check(fn, np.array([1.0, 2.0, 3.0, 4.0]))


def test_writers_into_one_buffer_under_two_names():
    check(writers_into_one_buffer, np.array([0.5, 2.0, 3.0, 4.0]), np.array([0, 2, 0]))


def buffer_with_a_different_dtype_view(x):
    b = np.zeros(4)
    bits = b.view(np.int64)  # the same memory as another dtype
    b[0] = x[0]  # <dtype-view-write>
    return bits


def test_a_view_of_the_buffer_with_another_dtype_is_a_located_error():
    with pytest.raises(graphc.TraceError, match="another dtype or layout") as err:
        graphc.trace(buffer_with_a_different_dtype_view, np.ones(4))
    assert "test_views.py" in str(err.value)


# --- item 5: duplicate indices ---------------------------------------------------------------------------


def test_duplicate_indices_give_the_last_write_the_gradient():
    def loss(v):
        y = np.zeros(3)
        y[[0, 0]] = v  # numpy: the last write wins
        return np.sum(y * np.array([1.0, 2.0, 3.0]))

    np.testing.assert_array_equal(graphc.grad(loss)(np.array([1.0, 2.0])), [0.0, 1.0])

    def scalar(v):
        y = np.zeros(3)
        y[[0, 0]] = v  # both writes are v: one reaches the result
        return np.sum(y)

    assert graphc.grad(scalar)(np.float64(2.0)) == 1.0

    def traced_indices(v, idx):
        y = np.zeros((3, 2))
        y[idx] = v
        return np.sum(y * np.arange(6.0).reshape(3, 2))

    v, idx = np.arange(8.0).reshape(4, 2), np.array([2, 0, 2, 1])
    want = np.array([[0.0, 0.0], [0.0, 1.0], [4.0, 5.0], [2.0, 3.0]])  # the first write to row 2 is lost
    np.testing.assert_array_equal(graphc.grad(traced_indices)(v, idx), want)
    _, tangent = graphc.jvp(traced_indices, (v, idx), (np.ones_like(v), np.zeros_like(idx)))
    assert tangent == np.sum(np.arange(6.0))  # every position written once in the end


def test_augmented_assignment_with_duplicate_indices_adds_once():
    def fn(y, v):
        y = y * 1.0
        y[[0, 0, 2]] += v  # buffered: y[0] gets only the last of its two updates
        return y

    def loss(y, v):
        return np.sum(fn(y, v) * np.array([1.0, 2.0, 3.0]))

    y, v = np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])
    check(fn, y, v)
    gy, gv = graphc.grad(loss, argnums=(0, 1))(y, v)
    np.testing.assert_array_equal(gy, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(gv, [0.0, 1.0, 3.0])

    def add_at(y, v):
        y = y * 1.0
        np.add.at(y, [0, 0, 2], v)  # unbuffered: y[0] gets both
        return np.sum(y * np.array([1.0, 2.0, 3.0]))

    check(lambda y, v: add_at(y, v), y, v)
    np.testing.assert_array_equal(graphc.grad(add_at, argnums=1)(y, v), [1.0, 1.0, 3.0])


# --- item 6: out= as an array or a tuple -------------------------------------------------------------


def out_tuples(x, k):
    b = np.zeros(4)
    np.tanh(x, out=(b,))
    y = np.zeros(4)
    np.clip(x, 0.0, 1.5, out=(y,))
    q, r = np.zeros(4, np.int64), np.zeros(4, np.int64)
    np.divmod(k * 3, 2, out=(q, r))  # two outputs
    t = x * 1.0
    np.multiply(t, 2.0, out=(t,))
    u = np.zeros(4)
    np.add(x, 1.0, out=(None,))  # (no out array: the result is returned)
    np.divmod(k, 3, out=(None, q))
    return b, y, q, r, t, u


def test_out_as_a_tuple_of_arrays():
    check(out_tuples, np.array([0.0, 0.5, 1.0, 2.0]), np.array([0, 1, 5, -7]))


# --- items 7 and 8: ufunc.at and augmented assignment across dtypes ------------------------------------

DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint8, np.float32, np.float64]
AT_UFUNCS = [np.add, np.subtract, np.multiply, np.maximum, np.minimum]
AT_VALUES = [True, 3, -0.6, 2.5, np.float32(1.5), np.array([1.25, -2.0, 0.5]), np.array([7, -1, 300])]


def _same_outcome(fn, *args):
    """fn traced and run by graphc's interpreter gives numpy's result, or both raise. (Not jit: the
    many small graphs here would each compile.)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = fn(*_copy(args))
    except (TypeError, ValueError, IndexError, OverflowError):
        with pytest.raises((TypeError, ValueError, IndexError, OverflowError, graphc.TraceError)):
            graphc.trace(fn, *args)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_equal_trees(graphc.evaluate(graphc.trace(fn, *args), *args), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_ufunc_at_casts_like_numpy(dtype):
    for ufunc, value in itertools.product(AT_UFUNCS, AT_VALUES):

        def fn(x, ufunc=ufunc, value=value):
            y = np.array(x)  # a traced array
            ufunc.at(y, [0, 2, 0], value)  # 0 twice: applied twice, cast after each
            return y

        _same_outcome(fn, np.array([1, 0, 5, 2], dtype=dtype))


def test_add_at_into_an_int_array_casts_the_sum_not_the_value():
    def fn(x):
        y = np.ones(1, np.int64)
        np.add.at(y, [0], -0.6)  # numpy: int(1 - 0.6) = 0
        np.subtract.at(x, [0, 1], True)
        return y, x

    check(fn, np.array([1.0, 2.0, 3.0]))


def test_ufunc_at_with_traced_indices():
    def fn(x, idx):
        y = np.zeros(3)
        np.add.at(y, idx, x)
        np.subtract.at(y, idx[:1], 1)
        return y

    check(fn, np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2]))

    def needs_a_cast(x, idx):
        y = np.zeros(3, np.int64)
        np.add.at(y, idx, x)  # <traced-at>
        return y

    with pytest.raises(graphc.TraceError, match="astype") as err:
        graphc.trace(needs_a_cast, np.array([0.5, 1.5]), np.array([0, 0]))
    assert f"test_views.py:{line_of('<traced-at>')}" in str(err.value)


KEYS = [2, -1, np.int64(1), (slice(1, 3),), slice(1, 2), [1, 3], [1], slice(None), (Ellipsis, 0)]
KEYS_0D = [(), Ellipsis]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_augmented_assignment_raises_exactly_where_numpy_does(dtype):
    vector, scalar = np.array([1, 0, 5, 2], dtype=dtype), np.array(3, dtype=dtype)
    cases = [(k, vector) for k in KEYS] + [(k, scalar) for k in KEYS_0D]
    # (not a numpy integer out of the element's range: numpy raises OverflowError storing it into one
    # element, which depends on the value, and graphc cannot see a traced value)
    for (key, base), value in itertools.product(cases, [2.5, -1, True, np.float32(0.5), np.int16(3)]):

        def fn(x, key=key, value=value):
            i = np.array(x)
            i[key] -= value  # a numpy scalar element: fine; an array: the in-place subtract may raise
            return i

        _same_outcome(fn, base)


def test_full_like_fills_as_numpy_casts():
    def fn(i, u):
        return np.full_like(i, np.inf), np.full_like(u, -1.5), np.full_like(i, [2.7, -3.2, 0.5])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (numpy warns about the cast of inf)
        check(fn, np.arange(3), np.arange(3, dtype=np.uint8))


# --- issue 32 item 2: assignment through a traced boolean mask ------------------------------------------


def masked_writes(x, v):
    y = x * 1.0
    y[x <= 2.0] = 0.0  # a scalar
    y[x > 9.0] *= 0.5  # augmented
    y[x[:, 0] > 4.0] = v  # a row for each selected row
    y[:, x[0] > 1.0] -= np.array([1.0, 2.0, 3.0])[:, None]  # a mask after a whole slice
    y[..., x[1] < 6.0] += np.array([10.0])  # one value
    i = np.array(x, dtype=np.int64)
    i[x > 5.0] = 2.7  # cast as numpy casts an assigned value (unsafely)
    return y, i


@pytest.mark.parametrize("shape", [(3, 4), (0, 4), (1, 1)])
def test_assignment_through_traced_masks(shape):
    x = np.arange(float(np.prod(shape))).reshape(shape)
    if shape == (3, 4):
        check(masked_writes, x, np.array([-1.0, -2.0, -3.0, -4.0]))
    check(lambda a: masked_writes_small(a), x)


def masked_writes_small(x):
    y = x * 1.0
    y[x > 1.0] = -1.0
    y[y < 0.0] *= 3.0
    return y


def test_masked_write_errors_like_numpy_and_at_the_line():
    def per_element(x):
        y = x * 1.0
        y[x > 0] = np.arange(12.0)  # <per-element>
        return y

    with pytest.raises(graphc.TraceError, match="number of True elements") as err:
        graphc.trace(per_element, Y)
    assert f"test_views.py:{line_of('<per-element>')}" in str(err.value)

    def int_times_float(x):
        i = np.array(x, dtype=np.int64)
        i[x > 3] *= 0.1  # numpy raises: the in-place multiply into an int array
        return i

    with pytest.raises(TypeError):
        int_times_float(Y)
    with pytest.raises(graphc.TraceError, match="Cannot cast ufunc 'multiply'"):
        graphc.trace(int_times_float, Y)

    def read(x):
        return x[x > 0]  # still a data-dependent shape

    with pytest.raises(graphc.TraceError, match="data-dependent"):
        graphc.trace(read, Y)


def test_masked_augmented_assignment_follows_numpys_in_place_rules():
    """``y[mask] += 2`` on a uint8 array stays uint8 and ``y[mask] += 300`` on int8 raises numpy's
    OverflowError, as without a mask: a Python number takes the array's dtype (NEP 50), a numpy
    scalar keeps its own; a value with more dims than the selection raises numpy's ValueError (an
    in-place op cannot grow its target) where ``y[mask] = v`` would drop them (found by tests/fuzz)."""

    def small_ints(x):
        y = x.copy()
        y[y > 0] += 2
        y[y > 4] *= 0
        y[y < 3] -= True
        return y

    check(small_ints, np.array([3, 0, 7], np.uint8))
    check(small_ints, np.array([[3, -1], [0, 9]], np.int8))

    def out_of_range(x):
        y = x.copy()
        y[y > 1] += 300
        return y

    with pytest.raises(OverflowError):
        out_of_range(np.array([1, 2], np.int8))
    with pytest.raises(OverflowError) as err:
        graphc.trace(out_of_range, np.array([1, 2], np.int8))
    assert isinstance(err.value, graphc.TraceError)

    def numpy_scalar(x):
        y = x.copy()
        y[y > 0] += np.int64(2)  # a numpy scalar is not weak: numpy's in-place add raises
        return y

    with pytest.raises(TypeError):
        numpy_scalar(np.array([3, 0], np.uint8))
    with pytest.raises(graphc.TraceError, match="Cannot cast ufunc 'add'"):
        graphc.trace(numpy_scalar, np.array([3, 0], np.uint8))

    def more_dims(x, v):
        y = x.copy()
        y[y < 0] *= v  # numpy: the in-place multiply of the selected (count,) by v (1, 1, 1) raises
        return y

    x, v = np.array([-4, 0], np.int16), np.array([[[-2]]], np.int8)
    with pytest.raises(ValueError, match="non-broadcastable output operand"):
        more_dims(x.copy(), v)
    with pytest.raises(ValueError, match="non-broadcastable output operand") as err:
        graphc.trace(more_dims, x, v)
    assert isinstance(err.value, graphc.TraceError)


def test_an_einsum_that_only_permutes_is_a_view():
    """numpy's einsum of one operand that sums nothing returns a view: a write into it reaches the
    operand, and a later write into the operand shows in it (graphc computed a copy: found by
    tests/fuzz); of a 0-d operand it is a numpy scalar."""

    def fn(x):
        y = x.copy()
        t = np.einsum("ab->ba", y)
        r = np.einsum("a", y[0])
        s = np.einsum("->", y[0, 0])
        t[0, 1] = 99.0  # y[1, 0]
        y[0, 2] = -1.0
        return y, t, r, s

    check(fn, np.arange(6.0).reshape(2, 3))


def test_an_einsum_diagonal_is_a_view():
    """numpy's einsum of one operand that repeats a letter and sums nothing ('ii->i', 'aab->ba')
    returns a writeable view of the diagonal: a write into it reaches the operand (graphc's copy
    lost it, silently: found by the long fuzz run), and a later write into the operand shows in
    it; of bools too, of a view, with a size-0 diagonal; its ravel is a copy (the diagonal is not
    contiguous), as numpy's."""

    def fn(x, m):
        y = x.copy()
        d = np.einsum("ii->i", y[:, :, 0])  # (a diagonal of a view)
        d += 10.0
        t = np.einsum("aab->ba", y)
        t[1, 0] = -1.0  # y[0, 0, 1]
        y[2, 2, 1] = 99.0  # shows in t
        r = t.ravel()  # a copy
        r[0] = 7.0
        b = m.copy()
        np.einsum("ii->i", b)[...] = True
        e = np.zeros((0, 0))
        np.einsum("ii->i", e)[...] = 1.0
        return y, d, t, r, b, e

    check(fn, np.arange(18.0).reshape(3, 3, 2), np.zeros((2, 2), bool))


def test_gradient_through_an_einsum_diagonal_view():
    def loss(x):
        y = x * 1.0
        np.einsum("ii->i", y)[...] = np.tanh(x[0])
        return np.sum(np.sin(y) * np.arange(9.0).reshape(3, 3))

    x = RNG.standard_normal((3, 3))
    np.testing.assert_allclose(graphc.grad(loss)(x), numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


def test_a_numpy_scalar_has_no_views():
    """numpy's reshape, ravel, atleast_1d, expand_dims or ``[...]`` of a numpy scalar (the sum of
    an array, ``x + x`` of 0-d arrays, a copy of one) is a new array: a write into it leaves the
    scalar as it was (graphc wrote through to the scalar: found by tests/fuzz)."""

    def fn(x):
        s = np.sum(x)
        t = (x[0] + x[0]).copy()
        a, b, c, d, e = s.reshape(1), np.ravel(s), np.atleast_1d(t), np.expand_dims(t, 0), s[...]
        a[0] = 7.0
        b[0] = 8.0
        c[0] = 9.0
        d[0] = 10.0
        e[...] = 11.0
        return s, t, a, b, c, d, e

    check(fn, np.array([1.5, 2.0]))


def test_a_0d_out_buffer_stays_an_array():
    """``np.clip(x, lo, hi, out=b)`` into a 0-d ``b`` leaves ``b`` a 0-d array, which a later
    write may write into (numpy returns the out array; graphc held a numpy scalar: found by
    tests/fuzz)."""

    def fn(x):
        b = np.zeros(())
        np.clip(x, 0.0, 3.0, out=b)
        c = b.copy()
        c[()] *= x
        r = np.clip(x, 0.0, 1.0, out=np.zeros(()))
        r[()] += 1.0
        return c, r

    check(fn, np.array(1.9))


def test_gradient_through_masked_writes():
    def loss(x):
        y = x * 1.0
        y[x < 0] *= 0.1
        y[x > 1.0] = 1.0
        return np.sum(y * y)

    x = RNG.standard_normal((4, 5)) * 2.0
    want = np.where(x < 0, 2 * 0.01 * x, np.where(x > 1.0, 0.0, 2 * x))  # (no element sits at a kink)
    np.testing.assert_allclose(graphc.grad(loss)(x), want, rtol=1e-15)


def test_python_numbers_are_assigned_as_numpy_converts_them():
    def fn(x, value):
        y = np.array(x)
        y[()] = value  # <assign-number>
        return y

    for x, value in ((np.array(-128, np.int8), 300), (np.array(2, np.uint8), -1), (np.array(3), float("nan"))):
        with pytest.raises((OverflowError, ValueError)):
            fn(x.copy(), value)
        with pytest.raises((OverflowError, ValueError)) as err:
            graphc.trace(lambda a, v=value: fn(a, v), x)
        assert isinstance(err.value, graphc.TraceError)
    check(lambda a: fn(a, 2.7), np.array(1, np.int8))  # a float is truncated


def test_gradient_of_a_function_that_writes_into_its_argument():
    def loss(x):
        w = x.T
        w[0] *= 3.0  # the first column of the argument itself
        return np.sum(x * x)

    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    want = np.array([[18.0, 4.0], [54.0, 8.0]])  # d/dx of (3 x[:, 0])^2 + x[:, 1]^2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphc.GraphcWarning)
        np.testing.assert_array_equal(graphc.grad(loss)(x), want)
        value, tangent = graphc.jvp(loss, (x,), (np.array([[1.0, 0.0], [0.0, 0.0]]),))
    assert (value, tangent) == (loss(x.copy()), 18.0)
