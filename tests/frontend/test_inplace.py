"""In-place assignment while tracing (issue 20, items 1 and 2): ``x[key] = v`` and ``x[key] += v``
on traced arrays and on numpy buffers, ``np.add.at``, ``np.put``, ``np.copyto``, ``out=``, numpy
arrays indexed by traced values, and the aliasing that a graph cannot express. Every result is
compared with numpy running the same function."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import graphc
from graphc.core.mesh import Mesh
from graphc.passes.sharding.strategies import block_sets, get_rule, node_strategies
from tests.graphgen import random_graphs, random_inputs
from tests.helpers import fuzz_settings, line_of, numeric_grad, quiet
from tests.passes.sharding.test_dim_rules import PROFILE, _check_node, _node_values

RNG = np.random.default_rng(0)
X = RNG.standard_normal((4, 5))


def traced(fn, *args):
    """fn run by graphc: traced, then evaluated by the reference interpreter."""
    return graphc.evaluate(graphc.trace(fn, *args), *args)


def assert_same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def op_names(graph):
    return [n.op.name for n in graph.nodes]


# --- x[key] = v on a traced array: every index form against numpy --------------------------------

KEYS = [
    (1, ()),
    (-1, (5,)),
    (slice(1, 3), (1, 5)),
    (slice(None, None, 2), (2, 5)),
    (slice(None, None, -1), ()),
    (slice(3, 0, -2), (5,)),
    (slice(-2, None), (2, 1)),
    (slice(2, 2), ()),  # size 0
    ((slice(None), 3), (4,)),
    ((Ellipsis, 1), ()),
    ((Ellipsis,), (5,)),
    ((None, 1), (1, 5)),
    ((0, None), (1, 5)),
    ((1, slice(1, 4)), (3,)),
    ((slice(None), slice(None, None, 3)), (4, 2)),
    ([0, 2], (2, 5)),
    ([0, 0], (2, 5)),  # repeated index: the last write wins, as in numpy
    (np.array([[0, 1], [3, 2]]), (2, 2, 5)),
    ((slice(None), [4, 0, 4]), (4, 3)),
    ((np.arange(4), np.array([1, 0, 4, 4])), (4,)),
    (([1, 2], slice(None), [0, 1])[::2], (2,)),  # (rows, cols): adjacent arrays
    (([1, 2], slice(1, 3)), (2, 2)),  # index arrays and a partial slice
    ((Ellipsis, [0, 3]), (4, 2)),
    ((2, [0, 3]), (2,)),
    (np.array([True, False, True, True]), (3, 5)),
    (X > 0, ()),
    (np.zeros((4,), bool), ()),  # a mask that selects nothing
    (np.array([], np.int64), ()),
]


def _value(shape):
    return np.arange(1, 1 + int(np.prod(shape)), dtype=np.float64).reshape(shape) * 10


@pytest.mark.parametrize("key,vshape", KEYS, ids=[repr(k)[:40] for k, _ in KEYS])
def test_setitem_matches_numpy(key, vshape):
    v = _value(vshape)

    def assign(x, v):
        x[key] = v
        return x

    def augment(x, v):
        x[key] += v
        return x

    for fn in (assign, augment):
        assert_same(traced(fn, X, v), fn(X.copy(), v))


def test_setitem_on_size_one_and_size_zero_dims():
    def fn(x, y):
        x[0, 1:] = y[0]
        x[:, :0] = 5.0
        return x

    x, y = RNG.standard_normal((1, 4)), RNG.standard_normal((1, 3))
    assert_same(traced(fn, x, y), fn(x.copy(), y))
    e = np.zeros((0, 3))
    assert_same(traced(lambda a: (a.__setitem__(Ellipsis, 1.0), a)[1], e), np.ones((0, 3)))


def test_setitem_casts_the_value_like_numpy():
    def fn(x, v):
        x[1] = v  # float64 into int32: truncated (numpy's unsafe cast for assignment)
        x[2] += 3  # int32 += int: stays int32
        return x

    def augment_float(x):
        x[2] += 1.7  # the in-place add itself casts with 'same_kind': numpy raises
        return x

    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    v = np.array([1.9, -2.5, 3.2, 0.0])
    assert_same(traced(fn, x, v), fn(x.copy(), v))
    with pytest.raises(TypeError, match="Cannot cast ufunc 'add' output from dtype"):
        augment_float(x.copy())
    with pytest.raises(graphc.TraceError, match="Cannot cast ufunc 'add' output from float64 to int32"):
        graphc.trace(augment_float, x)


def test_setitem_errors_like_numpy():
    def out_of_bounds(x):
        x[4] = 1.0
        return x

    def bad_shape(x):
        x[0] = np.ones(3)
        return x

    with pytest.raises(graphc.TraceError, match="out of bounds"):
        graphc.trace(out_of_bounds, X)
    with pytest.raises(graphc.TraceError, match=r"could not broadcast input array from shape \(3,\) into shape \(5,\)"):
        graphc.trace(bad_shape, X)


# --- traced positions: dynamic_update_slice and scatter ------------------------------------------


def dynamic_writes(x, v, t):
    x[t] = v[0]
    x[:, t] = 7.0
    x[t : t + 2, 1:3] = v[:2, :2]
    x[-t] += 1.0
    return x


@pytest.mark.parametrize("t", [0, 1, 2])
def test_traced_scalar_starts(t):
    t = np.int64(t)
    v = RNG.standard_normal((4, 5))
    graph = graphc.trace(dynamic_writes, X, v, t)
    assert "dynamic_update_slice" in op_names(graph) and "scatter" not in op_names(graph)
    assert_same(graphc.evaluate(graph, X, v, t), dynamic_writes(X.copy(), v, t))


def negative_traced_index(x, t):
    x[t] = 1.0
    x[-t - 2, 1:] += 2.0
    return x


@pytest.mark.parametrize("t", [-1, -4, 1])
def test_negative_traced_index_counts_from_the_end(t):
    assert_same(traced(negative_traced_index, X, np.int64(t)), negative_traced_index(X.copy(), t))


def traced_index_arrays(x, idx, v):
    x[idx] = v
    x[:, idx] += 1.0
    return x


def test_traced_index_arrays_scatter():
    idx = np.array([3, 0, -1])
    v = RNG.standard_normal((3, 5))
    graph = graphc.trace(traced_index_arrays, X, idx, v)
    assert "scatter" in op_names(graph)
    assert_same(graphc.evaluate(graph, X, idx, v), traced_index_arrays(X.copy(), idx, v))


def test_traced_slice_reads():
    def fn(x, pos):
        return x[:, pos : pos + 2] * 2

    pos = np.int64(2)
    graph = graphc.trace(fn, X, pos)
    assert "dynamic_slice" in op_names(graph)
    assert_same(graphc.evaluate(graph, X, pos), fn(X, 2))


def test_traced_slice_of_unknown_length_is_an_error():
    def fn(x, pos):
        return x[:pos]  # <data-dependent>

    with pytest.raises(graphc.TraceError, match="length of the slice") as err:
        graphc.trace(fn, X, np.int64(2))
    assert f"test_inplace.py:{line_of('<data-dependent>')}" in str(err.value)


# --- numpy buffers filled in loops ---------------------------------------------------------------


def rnn(x, wx, wh):
    """x: [T, B, D] -> all hidden states [T, B, H], written into a preallocated buffer."""
    T, B, _ = x.shape
    H = wh.shape[0]
    h = np.zeros((B, H))
    h_all = np.zeros((T, B, H))
    for t in range(T):
        h = np.tanh(x[t] @ wx + h @ wh)
        h_all[t] = h
    return h_all


def rnn_loss(wx, x, wh):
    return np.sum(rnn(x, wx, wh) ** 2)


def _rnn_args():
    rng = np.random.default_rng(1)
    return rng.standard_normal((3, 2, 4)) * 0.5, rng.standard_normal((4, 3)) * 0.5, rng.standard_normal((3, 3)) * 0.5


def test_rnn_with_preallocated_buffer_jit_and_grad():
    x, wx, wh = _rnn_args()
    assert_same(graphc.jit(rnn)(x, wx, wh), rnn(x, wx, wh))
    grad = graphc.grad(rnn_loss)(wx, x, wh)
    np.testing.assert_allclose(grad, numeric_grad(lambda w: rnn_loss(w, x, wh), wx), rtol=1e-6, atol=1e-8)


def fill_in_traced_loop(x, n):
    out = np.zeros((4, 5))
    for i in range(n):  # n is traced: a fori_loop that carries the buffer
        out[i] = x[i] * i
    return out


def test_buffer_filled_in_a_traced_loop_is_carried():
    graph = graphc.trace(fill_in_traced_loop, X, np.int64(3))
    assert "fori_loop" in op_names(graph)
    for n in (0, 3, 4):
        assert_same(graphc.evaluate(graph, X, np.int64(n)), fill_in_traced_loop(X, n))


def fill_in_traced_while(x, n):
    out = np.zeros(5)
    i = 0
    while i < n:
        out[i] += x[0, i] + i
        i += 1
    return out


def test_buffer_filled_in_a_traced_while_loop():
    graph = graphc.trace(fill_in_traced_while, X, np.int64(2))
    assert "while_loop" in op_names(graph)
    for n in (0, 2, 5):
        assert_same(graphc.evaluate(graph, X, np.int64(n)), fill_in_traced_while(X, n))


def test_zero_dim_targets():
    def fn(s, v):
        s[()] = v[0]
        s[...] += v[1]
        return s

    s, v = np.array(1.5), np.array([2.0, 3.0])
    assert_same(traced(fn, s, v), fn(s.copy(), v))


def fill_in_traced_if(x, flag):
    buf = np.zeros(5)
    if flag > 0:
        buf[1:3] = 4.0  # a static write in one branch only
    else:
        buf[0] = x[0, 0]
    return buf


def test_numpy_buffer_written_in_a_traced_branch():
    graph = graphc.trace(fill_in_traced_if, X, np.float64(1.0))
    for flag in (1.0, -1.0):
        assert_same(graphc.evaluate(graph, X, np.float64(flag)), fill_in_traced_if(X, flag))


def test_untraced_writes_stay_numpy():
    def fn(x):
        table = np.arange(6.0)
        table[2] = 10.0  # nothing traced: numpy's own write, the array stays a numpy array
        table[[0, 0]] += 1.0
        return x + table[2] + table[0]

    x = np.ones(2)
    graph = graphc.trace(fn, x)
    assert "dynamic_update_slice" not in op_names(graph) and "scatter" not in op_names(graph)
    assert_same(graphc.evaluate(graph, x), fn(x))


def test_nested_subscript_writes_through_views():
    def fn(x, v):
        x[1][2] = v[0]  # x[1] is a view: the write reaches x
        x[[0, 1]][0] = 99.0  # x[[0, 1]] is a copy: numpy leaves x alone
        buf = np.zeros((2, 3))
        buf[1][0:2] = v[:2]
        return x, buf

    v = np.array([5.0, 6.0, 7.0])
    got = traced(fn, X, v)
    want = fn(X.copy(), v)
    for g, w in zip(got, want):
        assert_same(g, w)


def test_augmented_nested_subscript_and_dict_of_arrays():
    def fn(x, v):
        x[1][2:4] += v[:2]
        params = {"w": np.zeros((2, 3)), "b": x[0]}
        params["w"][1] = v
        params["b"] = params["b"] * 2
        return x, params

    v = np.array([5.0, 6.0, 7.0])
    got, want = traced(fn, X, v), fn(X.copy(), v)
    assert_same(got[0], want[0])
    assert_same(got[1]["w"], want[1]["w"])
    assert_same(got[1]["b"], want[1]["b"])


def test_gradient_through_traced_index_arrays():
    def loss(x, idx, v):
        y = x * 1.0
        y[idx] = v * 3.0
        y[:, idx] += x[:, :3]
        return np.sum(np.sin(y))

    x, v = RNG.standard_normal((5, 5)), RNG.standard_normal((3, 5))
    idx = np.array([4, 1, 2])
    gx, gv = graphc.grad(loss, argnums=(0, 2))(x, idx, v)
    np.testing.assert_allclose(gx, numeric_grad(lambda a: loss(a, idx, v), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gv, numeric_grad(lambda a: loss(x, idx, a), v), rtol=1e-6, atol=1e-8)


def test_nested_subscript_with_a_traced_first_index():
    def fn(x, t, v):
        x[t][1:3] = v  # x[t] is a view for a traced scalar t too
        return x

    v = np.array([5.0, 6.0])
    assert_same(traced(fn, X, np.int64(2), v), fn(X.copy(), 2, v))


def test_list_values_holding_traced_scalars():
    def fn(x):
        buf = np.zeros((2, 3))
        buf[1] = [x[0, 0], 2.0, x[1, 1]]
        buf[0, :2] = x[2:3, :2]  # a leading size-1 dim of the value is dropped, as numpy does
        return buf

    assert_same(traced(fn, X), fn(X))


def test_tuple_targets_and_chained_assignment():
    def fn(x, v):
        a = np.zeros(3)
        b = np.zeros(3)
        a[0], b[1] = v[0], v[1]
        a[2] = b[2] = v[2]
        return a, b

    v = np.array([1.0, 2.0, 3.0])
    for g, w in zip(traced(fn, X, v), fn(X, v)):
        assert_same(g, w)


# --- a KV cache on an object -----------------------------------------------------------------------


class Attention:
    def __init__(self, layers, heads, max_len, dim):
        self.cache = np.zeros((layers, heads, max_len, dim))

    def write(self, layer, k, pos):
        n = k.shape[1]
        self.cache[layer, :, pos : pos + n] = k
        return self.cache[layer, :, pos : pos + n].sum() + self.cache.sum()


def test_kv_cache_write_at_traced_position():
    def step(cache, k, pos):
        n = k.shape[1]
        cache[:, pos : pos + n] = k
        return cache

    cache = RNG.standard_normal((2, 8, 3))
    k = RNG.standard_normal((2, 2, 3))
    graph = graphc.trace(step, cache, k, np.int64(3))
    assert "dynamic_update_slice" in op_names(graph)
    jitted = graphc.jit(step)
    for pos in (0, 3, 6):
        assert_same(jitted(cache, k, np.int64(pos)), step(cache.copy(), k, pos))


def test_kv_cache_attribute_holds_the_new_value():
    k = RNG.standard_normal((2, 2, 3))
    numpy_model, graphc_model = Attention(2, 2, 6, 3), Attention(2, 2, 6, 3)
    want = numpy_model.write(1, k, 3)
    seen = []

    def fn(model, k, pos):
        out = model.write(1, k, pos)
        seen.append(type(model.cache).__name__)
        return out, model.cache

    graph = graphc.trace(fn, graphc_model, k, np.int64(3))
    assert seen == ["Tracer"]  # obj.attr holds the new value while tracing
    got, cache = graphc.evaluate(graph, graphc_model, k, np.int64(3)).result
    assert_same(got, want)
    assert_same(cache, numpy_model.cache)

    def from_closure(k, pos):  # the object not an argument: its new cache could not be stored
        return graphc_model.write(1, k, pos)

    before = graphc_model.cache
    with pytest.raises(
        graphc.TraceError, match="stores a traced value in the global or closure variable 'graphc_model'"
    ):
        graphc.trace(from_closure, k, np.int64(3))
    assert graphc_model.cache is before  # put back


def test_attribute_write_in_a_traced_loop_is_an_error():
    class Buf:
        def __init__(self):
            self.data = np.zeros(4)

        def fill(self, x, n):
            for i in range(n):
                self.data[i] = x[i]
            return self.data

    buf = Buf()
    with pytest.raises(graphc.TraceError, match="inside a for loop on a traced value"):
        graphc.trace(buf.fill, np.ones(4), np.int64(2))


# --- numpy arrays indexed by traced values (item 2) ------------------------------------------------

TABLE = np.arange(12.0).reshape(6, 2)


class Embedding:
    def __init__(self, weight):
        self.weight = weight

    def __call__(self, tokens):
        return self.weight[tokens]  # a numpy array on self, indexed by traced tokens


EMBEDDING = Embedding(np.random.default_rng(3).standard_normal((6, 4)))


def lookups(tokens, x):
    return EMBEDDING(tokens) * x + TABLE[tokens[0], 0][None, :, None] + TABLE[tokens, 1][..., None]


def test_numpy_tables_indexed_by_traced_values_gather():
    tokens = np.array([[1, 5, 0], [2, 2, 4]])
    x = RNG.standard_normal((2, 3, 4))
    graph = graphc.trace(lookups, tokens, x)
    assert "gather" in op_names(graph)
    assert_same(graphc.evaluate(graph, tokens, x), lookups(tokens, x))
    assert_same(graphc.jit(lookups)(tokens, x), lookups(tokens, x))


# --- np.add.at, np.put, np.copyto, out= --------------------------------------------------------------


def writers(x, idx, v):
    y = np.zeros_like(x)
    np.add.at(y, idx, v)  # repeated indices accumulate
    np.subtract.at(y, (0, slice(1, 3)), 1.0)
    z = x.copy()
    np.put(z, [0, 7, 7], v[0, :3])
    np.put(z, idx, 100.0, mode="clip")
    w = np.empty_like(x)
    np.copyto(w, v[0])
    np.copyto(w, -1.0, where=x > 0)
    u = x.copy()
    np.add(u, 1.0, out=u)
    np.multiply(x, x, out=x)  # an argument rebound: later reads see the square
    return y, z, w, u, x


def test_add_at_put_copyto_and_out_match_numpy():
    idx = np.array([0, 2, 0, 3])
    v = RNG.standard_normal((4, 5))
    got = traced(writers, X, idx, v)
    want = writers(X.copy(), idx, v)
    for g, w in zip(got, want):
        assert_same(g, w)


def numpy_out_buffers(x):
    buf = np.zeros(4)
    np.add(x, 1.0, out=buf)  # the name buf takes the traced result
    acc = np.zeros(4)
    for i in range(2):
        acc += x * i  # ndarray.__iadd__ with a traced operand: acc becomes traced
    y = np.multiply(x, 2.0, out=np.zeros(4))
    return buf * 2, acc, y


def test_numpy_out_buffers_take_the_traced_result():
    x = np.arange(4.0)
    for g, w in zip(traced(numpy_out_buffers, x), numpy_out_buffers(x)):
        assert_same(g, w)


def clip_gradients(dW, db, x):
    # min-char-rnn clips its gradients through another name of each array
    for dparam in [dW, db]:
        np.clip(dparam, -0.5, 0.5, out=dparam)
    buf = np.zeros(5)
    np.clip(x[0], -0.1, 0.1, out=buf)  # a numpy out= buffer takes the traced result
    return dW, db, buf


def test_clip_with_out_writes_every_name_of_the_array():
    db = np.array([-1.0, 0.2, 3.0])
    got = traced(clip_gradients, X.copy(), db, X)  # (X as dW too: refused, it is written in place)
    want = clip_gradients(X.copy(), db.copy(), X)
    for g, w in zip(got, want):
        assert_same(g, w)


def adagrad(params, grads, mems, lr=0.1):
    for param, dparam, mem in zip(params, grads, mems):
        mem += dparam * dparam
        param -= lr * dparam / np.sqrt(mem + 1e-8)  # <- unsaved write


def test_writes_into_argument_arrays_that_are_not_returned_warn_at_the_line():
    params, grads, mems = [X.copy()], [X.copy()], [np.zeros_like(X)]
    with pytest.warns(graphc.GraphcWarning, match=r"argument arrays params\.0, mems\.0 in place") as record:
        graphc.jit(adagrad)(params, grads, mems)
    assert record[0].lineno == line_of("# <- unsaved write") - 1  # (mems.0, the last one, is written there)
    np.testing.assert_array_equal(params[0], X)  # not written, as the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # returned: no warning
        graphc.jit(lambda p, g: (adagrad(p, g, [np.zeros_like(X)]), p)[1])(params, grads)


def test_in_place_writers_into_numpy_arrays_with_traced_values():
    def fn(x):
        buf = np.zeros(4)
        np.copyto(buf, x)  # the name buf takes the Tracer that stands for the buffer now
        return buf

    assert_same(traced(fn, np.arange(4.0)), fn(np.arange(4.0)))


# --- aliasing: views and other names see every write, as in numpy (more in test_views.py) --------------


def view_read_after_write(x):
    row = x[0]
    x[0] = 5.0
    return row * 2


def write_into_view(x):
    row = x[0]
    row[1] = 5.0
    return x


def alias_of_numpy_buffer(x):
    buf = np.zeros(5)
    alias = buf
    buf[0] = x[0, 0]
    return alias + x[0]


def write_into_global(x):
    TABLE[0] = x[0, :2]  # <global-write>
    return x


def reshaped_view_read_after_write(x):
    flat = x.reshape(-1)
    x[1:3] += 1.0
    return flat.sum()


@pytest.mark.parametrize(
    "fn", [view_read_after_write, write_into_view, alias_of_numpy_buffer, reshaped_view_read_after_write]
)
def test_aliases_see_the_write(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphc.GraphcWarning)  # (writes into the argument x)
        assert_same(traced(fn, X), fn(X.copy()))


def test_writing_traced_values_into_a_global_numpy_array_is_an_error():
    with pytest.raises(graphc.TraceError, match="global variable 'TABLE'") as err:
        graphc.trace(write_into_global, X)
    assert f"test_inplace.py:{line_of('<global-write>')}" in str(err.value)


def test_view_taken_after_the_write_is_fine():
    def fn(x):
        x[0] = 5.0
        row = x[0]
        x[1] = row * 2  # row is read before this write, never after
        return x, row

    for g, w in zip(traced(fn, X), fn(X.copy())):
        assert_same(g, w)


# --- gradients, jit and a 2x2 mesh ------------------------------------------------------------------


def update_model(x, w, pos):
    """Every new op on one path: a scatter, a dynamic write at a traced position, a read back."""
    h = x @ w  # [4, 3]
    out = np.zeros((6, 3))
    out[[0, 2, 3, 5]] = h  # scatter
    out[pos : pos + 2] += h[:2] * 3  # dynamic_update_slice of a dynamic_slice
    out[:, 1] = np.tanh(out[:, 1])
    return np.sum(out[pos : pos + 3] ** 2) + np.sum(out**2)


def test_gradients_of_the_new_ops():
    x, w = RNG.standard_normal((4, 5)), RNG.standard_normal((5, 3))
    pos = np.int64(1)
    graph = graphc.trace(update_model, x, w, pos)
    assert {"scatter", "dynamic_update_slice", "dynamic_slice"} <= set(op_names(graph))
    grad = graphc.grad(update_model, argnums=1)(x, w, pos)
    np.testing.assert_allclose(grad, numeric_grad(lambda w_: update_model(x, w_, 1), w), rtol=1e-6, atol=1e-7)

    def of_w(w_):
        return update_model(x, w_, pos)

    _, tangent = graphc.jvp(of_w, (w,), (np.ones_like(w),))
    fd = (update_model(x, w + 1e-6, 1) - update_model(x, w - 1e-6, 1)) / 2e-6
    assert float(tangent) == pytest.approx(fd, rel=1e-5)


def mesh_model(x, w, tokens, pos):
    h = EMBEDDING(tokens) @ w  # a numpy table indexed by traced tokens: [8, 4] @ [4, 4]
    cache = np.zeros((8, 12, 4))
    cache[:, pos : pos + 3] = x  # [8, 3, 4] at a traced position
    cache[:, 0] = h
    buf = np.zeros((8, 4))
    buf[tokens[:2]] = 1.0
    return cache.sum(axis=1) + buf + np.tanh(h)


def test_parallelize_on_a_2x2_mesh_equals_numpy():
    x = RNG.standard_normal((8, 3, 4))
    w = RNG.standard_normal((4, 4))
    tokens = np.array([1, 5, 0, 2, 2, 4, 3, 1])
    pos = np.int64(4)
    want = mesh_model(x, w, tokens, 4)
    got = graphc.parallelize(mesh_model, mesh={"dp": 2, "tp": 2}, cache=False)(x, w, tokens, pos)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-10)
    assert_same(graphc.jit(mesh_model)(x, w, tokens, pos), want)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    random_graphs(max_nodes=3, ops=["dynamic_slice", "dynamic_update_slice", "scatter"]),
    hst.sampled_from([(2,), (2, 2)]),
)
def test_every_strategy_of_the_update_ops_reassembles(graph, mesh_shape):
    """Every strategy of the new ops (their dimension rules, and partial sums through them on a
    1-D mesh: they are linear, ops/dims.py), run on its pieces, gives the node's result."""
    mesh = Mesh({f"a{i}": n for i, n in enumerate(mesh_shape)}, profile=PROFILE)
    env = quiet(_node_values, graph, random_inputs(graph, 0))
    rules = {n: get_rule(n) for n in graph.nodes}
    sets = block_sets(graph, rules)
    for node in graph.nodes:
        for st_ in node_strategies(node, rules[node], mesh, sets):
            quiet(_check_node, node, st_, mesh_shape, env)


def test_update_ops_are_linear_where_dims_says():
    """ops/dims.py linear_operands: splitting those operands into two pieces and adding the two
    results gives the result (micro-batching carries partial gradients through them)."""
    from graphc.interpreter import bind_arguments
    from graphc.ops.dims import linear_operands

    x, w = RNG.standard_normal((4, 5)), RNG.standard_normal((5, 3))
    args = (x, w, np.int64(1))
    graph = graphc.trace(update_model, *args)
    env = dict(zip(graph.inputs, bind_arguments(graph, args, {})))
    checked = set()
    for node in graph.nodes:
        xs = [env[v] for v in node.inputs]
        outs = node.op.evaluate(*xs, **node.attrs)
        env.update(zip(node.outputs, outs))
        if node.op.name not in ("scatter", "dynamic_update_slice", "dynamic_slice"):
            continue
        for ops in linear_operands(node):
            a, b = list(xs), list(xs)
            for i in ops:
                noise = RNG.standard_normal(np.shape(xs[i]))
                a[i], b[i] = xs[i] - noise, noise
            for y, p, q in zip(outs, node.op.evaluate(*a, **node.attrs), node.op.evaluate(*b, **node.attrs)):
                np.testing.assert_allclose(p + q, y, rtol=1e-12, atol=1e-12)
            checked.add(node.op.name)
    assert checked == {"scatter", "dynamic_update_slice", "dynamic_slice"}


@pytest.mark.fuzz
@fuzz_settings(40)
@given(
    hst.lists(hst.integers(1, 4), min_size=1, max_size=3).map(tuple),
    hst.data(),
)
def test_fuzz_setitem_keys_match_numpy(shape, data):
    """Random basic and advanced keys on random shapes: traced x[key] = v equals numpy's."""
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    key = []
    for n in shape:
        kind = data.draw(hst.sampled_from(["int", "slice", "array", "full"]))
        if kind == "int":
            key.append(data.draw(hst.integers(-n, n - 1)))
        elif kind == "slice":
            key.append(
                slice(
                    data.draw(hst.integers(-n, n)),
                    data.draw(hst.integers(-n, n)),
                    data.draw(hst.sampled_from([1, 2, -1])),
                )
            )
        elif kind == "array":
            key.append(np.array(data.draw(hst.lists(hst.integers(-n, n - 1), min_size=0, max_size=3)), dtype=np.int64))
        else:
            key.append(slice(None))
    key = tuple(key)
    try:
        want_shape = x[key].shape
    except IndexError:
        return
    v = np.arange(int(np.prod(want_shape)), dtype=np.float64).reshape(want_shape) + 100

    def fn(x, v):
        x[key] = v
        return x

    assert_same(traced(fn, x, v), fn(x.copy(), v))
