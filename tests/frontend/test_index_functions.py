"""np.nanargmax / np.nanargmin and np.unravel_index on traced arrays, against numpy: NaN in
every position, all-NaN slices (numpy's ValueError: a run-time error here, never a wrong index),
size-0 and size-1 dims, keepdims, C and F order, and out-of-range indices."""

import numpy as np
import pytest

import graphc
from tests.helpers import line_of

RNG = np.random.default_rng(32)


def same(got, want):
    got_leaves = got if isinstance(got, tuple) else (got,)
    want_leaves = want if isinstance(want, tuple) else (want,)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_array_equal(g, w)


def with_nans(shape, dtype=np.float64, share=0.4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(dtype)  # ties too: the first one wins, as in numpy
    x[rng.random(shape) < share] = np.nan
    return x


NAN_ARG = [np.nanargmax, np.nanargmin]


@pytest.mark.parametrize("fn", NAN_ARG, ids=["nanargmax", "nanargmin"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "shape,axis",
    [((4, 5), None), ((4, 5), 0), ((4, 5), 1), ((4, 5), -1), ((3, 1, 4), 1), ((1, 6), 1), ((7,), 0), ((), None)],
)
def test_nan_arg_reductions_match_numpy(fn, dtype, shape, axis):
    for seed in range(3):
        x = with_nans(shape, dtype, share=0.3, seed=seed)
        if x.ndim and axis is not None:  # no all-NaN slice here (that is numpy's ValueError)
            first = [slice(None)] * x.ndim
            first[axis] = 0
            x[tuple(first)] = 1.0
        elif np.all(np.isnan(x)):
            x.flat[0] = 1.0
        for keepdims in (False, True):
            same(graphc.jit(lambda a, k=keepdims: fn(a, axis=axis, keepdims=k))(x), fn(x, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("fn", NAN_ARG, ids=["nanargmax", "nanargmin"])
def test_nan_arg_with_infinities_and_ints(fn):
    x = np.array(
        [[np.nan, -np.inf, np.inf, np.nan], [np.nan, np.inf, np.nan, -np.inf], [-np.inf, np.nan, np.nan, np.nan]]
    )
    same(graphc.jit(lambda a: fn(a, axis=1))(x), fn(x, axis=1))
    same(graphc.jit(lambda a: fn(a))(x), fn(x))
    ints = RNG.integers(-5, 5, (3, 4))
    same(graphc.jit(lambda a: fn(a, axis=0))(ints), fn(ints, axis=0))
    same(graphc.jit(lambda a: fn(a, axis=1))(ints.astype(bool)), fn(ints.astype(bool), axis=1))


@pytest.mark.parametrize("fn", NAN_ARG, ids=["nanargmax", "nanargmin"])
def test_all_nan_slice_raises_at_run_time_where_numpy_raises(fn):
    x = np.array([[1.0, np.nan], [np.nan, np.nan]])
    with pytest.raises(ValueError, match="All-NaN slice"):
        fn(x, axis=1)
    f = graphc.jit(lambda a: fn(a, axis=1))  # <all-nan>
    with pytest.raises(IndexError) as info:
        f(x)
    assert f"test_index_functions.py:{line_of('<all-nan>')}" in " ".join(info.value.__notes__)
    same(f(x[[0, 0]]), fn(x[[0, 0]], axis=1))  # the same compiled function, no all-NaN row: numpy's answer
    with pytest.raises(IndexError):
        graphc.jit(fn)(np.full((2, 3), np.nan))  # the whole array


@pytest.mark.parametrize("fn", NAN_ARG, ids=["nanargmax", "nanargmin"])
def test_nan_arg_of_an_empty_axis_is_numpys_error(fn):
    with pytest.raises(ValueError):
        fn(np.zeros((3, 0)), axis=1)
    with pytest.raises(graphc.TraceError, match="empty sequence"):
        graphc.jit(lambda a: fn(a, axis=1))(np.zeros((3, 0)))
    same(graphc.jit(lambda a: fn(a, axis=0))(np.zeros((3, 0))), fn(np.zeros((3, 0)), axis=0))  # nothing to reduce
    with pytest.raises(graphc.TraceError, match="out="):
        graphc.jit(lambda a: fn(a, out=np.zeros((), np.int64)))(np.ones(3))


@pytest.mark.parametrize(
    "dims", [(3, 4), (3, 1, 4), (1, 1), (12,), (2, 3, 2), 7, (5, 1)], ids=lambda d: "x".join(map(str, np.atleast_1d(d)))
)
@pytest.mark.parametrize("order", ["C", "F"])
def test_unravel_index_matches_numpy(dims, order):
    size = int(np.prod(dims))
    for indices in [np.arange(size), np.arange(size).reshape(-1, 1)[::-1], np.int64(size - 1), np.zeros(0, np.int64)]:
        same(
            graphc.jit(lambda i: np.unravel_index(i, dims, order=order))(indices),
            np.unravel_index(indices, dims, order=order),
        )
    small = np.arange(size, dtype=np.int32)
    same(graphc.jit(lambda i: np.unravel_index(i, dims))(small), np.unravel_index(small, dims))


def test_unravel_index_of_nanargmax_and_of_a_shape_of_zero_size():
    x = with_nans((3, 4, 5))
    same(
        graphc.jit(lambda a: np.unravel_index(np.nanargmax(a), a.shape))(x), np.unravel_index(np.nanargmax(x), x.shape)
    )
    empty = np.zeros(0, np.int64)
    same(graphc.jit(lambda i: np.unravel_index(i, (2, 0)))(empty), np.unravel_index(empty, (2, 0)))
    with pytest.raises(ValueError):
        np.unravel_index(np.array([0]), (2, 0))
    with pytest.raises(graphc.TraceError, match="size 0"):
        graphc.jit(lambda i: np.unravel_index(i, (2, 0)))(np.array([0]))


def test_unravel_index_out_of_range_and_bad_arguments():
    f = graphc.jit(lambda i: np.unravel_index(i, (2, 3)))  # <unravel>
    for bad in (np.array([0, 6]), np.array([-1, 2])):
        with pytest.raises(ValueError):
            np.unravel_index(bad, (2, 3))
        with pytest.raises(IndexError) as info:
            f(bad)
        assert f"test_index_functions.py:{line_of('<unravel>')}" in " ".join(info.value.__notes__)
    with pytest.raises(TypeError):
        np.unravel_index(np.array([1.0]), (2, 3))
    with pytest.raises(graphc.TraceError, match="only int indices"):
        graphc.jit(lambda i: np.unravel_index(i, (2, 3)))(np.array([1.0]))
    with pytest.raises(graphc.TraceError, match="order"):
        graphc.jit(lambda i: np.unravel_index(i, (2, 3), order="K"))(np.array([1]))
    with pytest.raises(graphc.TraceError, match="non-negative"):
        graphc.jit(lambda i: np.unravel_index(i, (2, -3)))(np.array([1]))
