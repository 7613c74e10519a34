"""The numpy (and scipy.special) that real numpy model code calls, beyond the core subset: each
function against numpy under graphc.jit (also size-0 and size-1 dims), gradients against finite
differences, and the errors for what a graph cannot hold (data-dependent shapes, .item())."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import graphc
from tests.helpers import line_of, numeric_grad

scipy_special = pytest.importorskip("scipy.special")  # a test-only dependency
RNG = np.random.default_rng(20)
X = RNG.standard_normal((3, 5))


def same(got, want, rtol=1e-12, atol=1e-12):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def check(fn, *args, rtol=1e-12, atol=1e-12):
    """fn on numpy arrays == graphc.jit(fn) (which traces fn)."""
    same(graphc.jit(fn)(*args), fn(*args), rtol, atol)


def check_grad(fn, x, rtol=1e-5, atol=1e-7):
    np.testing.assert_allclose(graphc.grad(fn)(x), numeric_grad(fn, x), rtol=rtol, atol=atol)


# --- scans and products ----------------------------------------------------------------------------

SHAPES = [(3, 5), (0, 4), (4, 0), (1, 1), (1, 7), (6,)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fn", [np.cumsum, np.cumprod], ids=["cumsum", "cumprod"])
def test_cumulative_over_every_axis(fn, shape):
    x = RNG.standard_normal(shape)
    check(lambda a: fn(a), x)
    for axis in range(-len(shape), len(shape)):
        check(lambda a, axis=axis: fn(a, axis=axis), x)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.bool_, np.float32])
def test_cumulative_dtypes_are_numpys(dtype):
    x = RNG.integers(-3, 4, (4, 9)).astype(dtype)
    for fn in (np.cumsum, np.cumprod, np.prod):
        check(lambda a, fn=fn: fn(a, axis=1), x, rtol=1e-6)
    check(lambda a: np.cumsum(a, axis=0, dtype=np.float64), x)


def test_cumulative_methods():
    check(lambda a: a.cumsum(axis=0), X)
    check(lambda a: a.cumprod(1), X)
    check(lambda a: a.prod(axis=(0, 1)), X)
    check(lambda a: a.prod(0, keepdims=True), X)


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), ()])
def test_prod_matches_numpy(axis):
    check(lambda a: np.prod(a, axis=axis), X)
    check(lambda a: np.prod(a, axis=axis, keepdims=True), X)
    check(lambda a: np.prod(a, axis=axis), np.zeros((0, 3)))


def test_scan_gradients():
    x = RNG.uniform(0.5, 1.5, (2, 6))
    weights = np.arange(12.0).reshape(2, 6)
    check_grad(lambda a: np.sum(np.cumsum(a, axis=1) * weights), x)
    check_grad(lambda a: np.sum(np.cumprod(a, axis=1) * weights), x)
    check_grad(lambda a: np.sum(np.prod(a, axis=0) * weights[0]), x)
    with_zero = x.copy()
    with_zero[0, 2] = 0.0  # the product rule without dividing by the element
    check_grad(lambda a: np.sum(np.prod(a, axis=1)), with_zero)


@settings(max_examples=15, deadline=None)
@given(
    hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5), elements=st.integers(-9, 9))
)
def test_integer_scans_are_exact(x):
    for axis in range(x.ndim):
        check(lambda a, axis=axis: np.cumsum(a, axis=axis), x)
        check(lambda a, axis=axis: np.cumprod(a, axis=axis), x)


@pytest.mark.parametrize("fn", [np.floor, np.ceil, np.trunc], ids=["floor", "ceil", "trunc"])
def test_rounding_to_integers(fn):
    x = np.array(
        [-2.5, -0.5, -0.0, 0.0, 0.3, 1.0, 2.5, 1e300, -1e17, np.nan, np.inf, -np.inf, 2.0**52 - 0.5, -7.999999999999999]
    )
    with np.errstate(over="ignore"):  # (1e300 is inf in float32)
        narrow = [x.astype(np.float32), np.concatenate([x[:7], x[9:12]]).astype(np.float16)]
    for a in (x, *narrow, np.arange(-3, 3), np.array([True, False]), x[:0]):
        got, want = graphc.jit(lambda v: fn(v))(a), fn(a)
        same(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))  # (floor(-0.0) and ceil(-0.5) are -0.0)
    check_grad(lambda v: np.sum(fn(v) + v**2), np.array([0.25, 1.5, -2.25]))


def test_append_and_logaddexp():
    check(lambda a: np.append(a, a[0]), X)
    check(lambda a: np.append(a, a[:1], axis=0), X)
    check(lambda a: np.append(a[:0], a[0]), X)
    check_grad(lambda a: np.sum(np.logaddexp(a, 2 * a - 1)), X[:2])


# --- sorting -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 5), (1, 1), (4, 0), (0, 3), (7,)])
def test_sort_and_argsort(shape):
    x = RNG.standard_normal(shape)
    for axis in [None, *range(-len(shape), len(shape))]:
        check(lambda a, axis=axis: np.sort(a, axis=axis), x)
        check(lambda a, axis=axis: np.argsort(a, axis=axis, kind="stable"), x)
    check(lambda a: a.argsort(), x)


def test_sort_ties_and_nan_like_numpy():
    x = np.array([[3.0, np.nan, 1.0, 3.0, -np.inf, 1.0, np.nan, 0.0]])
    check(lambda a: np.sort(a, axis=1), x)
    check(lambda a: np.argsort(a, axis=1, kind="stable"), x)
    ints = RNG.integers(0, 3, (5, 8))
    check(lambda a: np.argsort(a, axis=1, kind="stable"), ints)
    check(lambda a: np.sort(a, axis=0), ints)


def test_sort_gradient_follows_the_permutation():
    x = RNG.standard_normal((2, 6))  # (no ties: the gradient of sort is the permutation's)
    check_grad(lambda a: np.sum(np.sort(a, axis=1) * np.arange(6.0)), x)


def test_sort_in_place_method_names_the_rewrite():
    def f(x):
        x.sort()  # <sort-in-place>
        return x

    with pytest.raises(graphc.TraceError, match=r"np.sort\(x, axis\)") as info:
        graphc.trace(f, X)
    assert info.value.lineno == line_of("<sort-in-place>")


# --- set membership, counting, dtypes, shapes ---------------------------------------------------------


def test_isin_and_count_nonzero():
    x = RNG.integers(0, 6, (4, 5))
    check(lambda a: np.isin(a, [1, 3]), x)
    check(lambda a: np.isin(a, a[0], invert=True), x)
    check(lambda a: np.isin(a, np.zeros(0, np.int64)), x)
    check(lambda a: np.count_nonzero(a > 2, axis=1), x)
    check(lambda a: np.count_nonzero(a), x)


def test_result_type():
    def f(x, y):
        return np.zeros(2, np.result_type(x, y, np.float32)) + x[0, 0]

    for x, y in [(X.astype(np.float32), np.int8(1)), (X, np.float32(1)), (X.astype(np.int16), np.uint16(1))]:
        check(f, x, y)


@pytest.mark.parametrize("fn", [np.atleast_1d, np.atleast_2d, np.atleast_3d])
@pytest.mark.parametrize("shape", [(), (4,), (2, 3), (2, 3, 1), (0,)])
def test_atleast(fn, shape):
    x = RNG.standard_normal(shape)
    check(lambda a: fn(a), x)
    got = graphc.jit(lambda a: fn(a, a[None]))(x)
    want = fn(x, x[None])
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        same(g, w)


def test_ndarray_attributes_people_use():
    check(lambda a: a[0].T, X)  # .T of a 1-d array is the array
    check(lambda a: a.flat[7], X)
    check(lambda a: a.flat[2:9], X)
    check(lambda a: np.stack(list(a[:2].flat)), X)
    check(lambda a: a.astype(np.float64, copy=False) * 2, X)
    check(lambda a: a.astype(np.float32, copy=False), X)

    def same_object(x):
        return x.astype(x.dtype, copy=False) is x

    seen = []
    graphc.trace(lambda x: seen.append(same_object(x)) or x, X)
    assert seen == [True]


def test_item_and_flat_writes_are_clear_errors():
    def item(x):
        return x[0, 0].item()  # <item>

    with pytest.raises(graphc.TraceError, match=r"\.item\(\) of a traced array.*Keep the 0-d array") as info:
        graphc.trace(item, X)
    assert info.value.lineno == line_of("<item>")

    def to_list(x):
        return x.tolist()  # <tolist>

    with pytest.raises(graphc.TraceError, match=r"\.tolist\(\) of a traced array.*Keep the array") as info:
        graphc.trace(to_list, X)
    assert info.value.lineno == line_of("<tolist>")

    def flat_write(x):
        x.flat[0] = 1.0  # <flat-write>
        return x

    with pytest.raises(graphc.TraceError, match="writing through x.flat") as info:
        graphc.trace(flat_write, X)
    assert info.value.lineno == line_of("<flat-write>")


@pytest.mark.parametrize(
    "subscripts, shapes",
    [
        ("...i,ij->...j", [(2, 3, 4), (4, 5)]),
        ("...ij,...jk->...ik", [(2, 3, 4), (4, 2)]),
        ("i...,i...->...", [(3, 2, 2), (3, 1, 2)]),
        ("...,...", [(2, 3), (3,)]),
        ("b...h,bh->b...", [(2, 0, 4), (2, 4)]),
        ("...ii->...i", [(2, 3, 3)]),
    ],
)
def test_einsum_with_ellipsis(subscripts, shapes):
    operands = [RNG.standard_normal(s) for s in shapes]
    check(lambda *xs: np.einsum(subscripts, *xs), *operands)


# --- convolution, signed infinities, column and row stacks (issue 32 item 4) -------------------------

CONVOLVE_LENGTHS = [(1, 1), (5, 1), (1, 5), (6, 3), (3, 6), (4, 4), (7, 2), (2, 7)]


def convolve_bound(a, v):
    """The rounding bound of a sum of m products, elementwise: m eps (|a| * |v|) (numpy's order of
    the additions and graphc's may differ)."""
    a, v = np.atleast_1d(np.abs(np.asarray(a, np.float64))), np.atleast_1d(np.abs(np.asarray(v, np.float64)))
    return min(len(a), len(v)) * np.finfo(np.result_type(a, v)).eps * np.convolve(a, v)


@pytest.mark.parametrize("n, m", CONVOLVE_LENGTHS)
@pytest.mark.parametrize("mode", ["full", "same", "valid", 0, 1, 2])
def test_convolve_matches_numpy(n, m, mode):
    a, v = RNG.standard_normal(n), RNG.standard_normal(m)
    got, want = graphc.jit(lambda a, v: np.convolve(a, v, mode))(a, v), np.convolve(a, v, mode)
    assert got.shape == want.shape and got.dtype == want.dtype
    full = convolve_bound(a, v)
    start = {"full": 0, 2: 0, "same": (min(n, m) - 1) // 2, 1: (min(n, m) - 1) // 2}.get(mode, min(n, m) - 1)
    assert np.all(np.abs(got - want) <= full[start : start + len(want)] + 1e-300)


@pytest.mark.filterwarnings("ignore::graphc.PromotionWarning")  # numpy's own float64 promotions
@pytest.mark.parametrize(
    "a, v",
    [
        (np.arange(6, dtype=np.float32), np.array([0.5, -1.0, 2.0])),  # float32 with float64: float64
        (np.arange(6, dtype=np.float32), np.array([1.5, 2.5], np.float32)),  # float32 stays float32
        (np.arange(-3, 4), np.array([1.0, 2.0], np.float32)),  # int64 with float32: float64
        (np.array([100, 50, -7], np.int8), np.array([100, 3], np.int8)),  # int8 products wrap as numpy's
        (np.array([3, 1, 4, 1, 5]), [1, -1]),  # a list operand is an int64 array
        (np.array([True, False, True, True]), np.array([True, True])),  # bools: or of ands
        (np.array([1.0, 2.0, 3.0]), 2.0),  # a 0-d operand is one sample
    ],
)
def test_convolve_dtypes_are_numpys(a, v):
    for mode in ("full", "same", "valid"):
        check(lambda a, mode=mode: np.convolve(a, v, mode), a, rtol=1e-6)
        check(lambda v, mode=mode: np.convolve(a, v, mode), v, rtol=1e-6)


def test_convolve_as_a_causal_conv1d():
    """Mamba's depthwise causal convolution: each channel's signal convolved with its kernel, cut to
    the signal's length (out[t] depends on x[t - 3 .. t])."""
    x, w = RNG.standard_normal((6, 3)), RNG.standard_normal((4, 3))

    def conv(x, w):
        return np.stack([np.convolve(x[:, c], w[:, c])[: len(x)] for c in range(x.shape[1])], axis=1)

    check(conv, x, w)
    check_grad(lambda x: np.sum(np.sin(conv(x, w))), x)
    check_grad(lambda w: np.sum(np.sin(conv(x, w))), w)


def test_convolve_gradients_in_every_mode():
    a, v = RNG.standard_normal(7), RNG.standard_normal(3)
    for mode in ("full", "same", "valid"):
        check_grad(lambda a, mode=mode: np.sum(np.convolve(a, v, mode) ** 2), a)
        check_grad(lambda v, mode=mode: np.sum(np.convolve(a, v, mode) ** 2), v)  # the shorter one
        check_grad(lambda v, mode=mode: np.sum(np.convolve(v, a, mode) ** 2), v)  # swapped


def test_convolve_errors_are_numpys():
    def bad(a, v, mode="full"):
        with pytest.raises(ValueError) as theirs:
            np.convolve(a, v, mode)
        with pytest.raises(graphc.TraceError) as ours:
            graphc.jit(lambda a: np.convolve(a, v, mode))(a)  # <convolve-error>
        assert isinstance(ours.value, ValueError) and str(theirs.value) in str(ours.value), str(ours.value)
        assert ours.value.lineno == line_of("<convolve-error>")

    bad(np.zeros(0), np.ones(2))  # a cannot be empty
    bad(np.ones(3), np.zeros(0))  # v cannot be empty
    bad(np.ones((2, 2)), np.ones(2))  # object too deep
    bad(np.ones(3), np.ones(2), "middle")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("fn", [np.isneginf, np.isposinf], ids=["isneginf", "isposinf"])
def test_signed_infinities(fn, dtype):
    values = np.array([-np.inf, np.inf, np.nan, -0.0, 0.0, -1.0, 2.0, 1e300, -1e300])
    with np.errstate(invalid="ignore", over="ignore"):
        x = values.astype(dtype)
    check(lambda a: fn(a), x)
    check(lambda a: fn(a), x.reshape(3, 3))
    for shape in [(0,), (1, 1), (0, 4)]:
        check(lambda a: fn(a), np.zeros(shape, dtype))
    got = graphc.jit(lambda a: fn(a[1]))(x)
    assert type(got) is type(fn(x[1])) and got == fn(x[1])  # a numpy bool scalar, as numpy's


def test_signed_infinities_write_out_as_numpy():
    x = np.array([-np.inf, 1.0, np.inf])

    def f(x):
        out = np.zeros(3, np.int64)
        np.isneginf(x, out)
        return out, np.isposinf(x, out=np.ones(3, bool))

    check(lambda x: f(x)[0], x)
    check(lambda x: f(x)[1], x)


def attention_with_isneginf_mask(scores):
    """Rows that are masked out entirely: where every score is -inf, the weights are 0, not nan."""
    dead = np.all(np.isneginf(scores), axis=-1, keepdims=True)
    safe = np.where(np.isneginf(scores), -1e30, scores)
    e = np.exp(safe - np.max(safe, axis=-1, keepdims=True))
    return np.where(dead, 0.0, e / np.sum(e, axis=-1, keepdims=True))


def test_isneginf_masks_have_gradients_through_the_scores():
    scores = RNG.standard_normal((3, 4))
    scores[0] = -np.inf
    scores[1, 2] = -np.inf
    check(attention_with_isneginf_mask, scores)
    weights = RNG.standard_normal((3, 4))
    grads = graphc.grad(lambda s: np.sum(attention_with_isneginf_mask(s) * weights))(scores)
    finite = np.where(np.isneginf(scores), 0.0, scores)
    numeric = numeric_grad(
        lambda s: np.sum(attention_with_isneginf_mask(np.where(np.isneginf(scores), -np.inf, s)) * weights), finite
    )
    np.testing.assert_allclose(np.where(np.isneginf(scores), 0.0, grads), numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    "arrays",
    [
        [np.arange(3.0), np.ones(3)],  # 1-d: columns
        [np.ones((3, 2)), np.arange(3)],  # 2-d joined as it is (not stacked), int with float
        [np.ones((3, 2), np.float32), np.zeros((3, 1), np.float32)],
        [np.float32(2.0), np.ones((1, 2), np.float32)],  # a 0-d array is a (1, 1) column
        [np.zeros(0), np.zeros((0, 2))],  # no rows
        [np.ones((2, 0)), np.arange(2)],  # no columns in one part
        [np.ones((2, 2, 2)), np.zeros((2, 1, 2))],  # 3-d joined along axis 1
        [np.array([True, False]), np.array([1, 2], np.int8)],
    ],
)
def test_column_stack_matches_numpy(arrays):
    first, rest = arrays[0], arrays[1:]
    check(lambda a: np.column_stack([a, *rest]), first)
    check(lambda a: np.column_stack((*rest, a)), first)
    if first.ndim:
        check(lambda a: np.column_stack([list(a), *rest]), first)  # a list holding traced values


def test_column_stack_gradient_and_error():
    a, b = RNG.standard_normal(4), RNG.standard_normal((4, 2))
    check_grad(lambda a: np.sum(np.column_stack([a, b]) ** 3), a)
    check_grad(lambda b: np.sum(np.column_stack([a, b, a]) ** 3), b)
    with pytest.raises(graphc.TraceError) as info:
        graphc.jit(lambda a: np.column_stack([a, np.ones(3)]))(a)  # <rows-differ>
    assert info.value.lineno == line_of("<rows-differ>")


def test_row_stack_is_numpys_deprecated_vstack():
    """numpy 2 deprecates row_stack: the same warning as numpy's, at the user's line, and vstack's result."""
    if np.__dict__.get("row_stack") is None:
        pytest.skip("this numpy has no row_stack")
    x = RNG.standard_normal(3)

    def stacked(x):
        return np.row_stack([x, 2 * x])  # <row-stack>

    with pytest.warns(DeprecationWarning) as theirs:
        want = stacked(x)
    with pytest.warns(DeprecationWarning) as ours:
        got = graphc.jit(stacked)(x)
    same(got, want)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert (ours[0].filename, ours[0].lineno) == (__file__, line_of("<row-stack>"))
    with pytest.warns(DeprecationWarning):
        check(lambda x: np.row_stack((x, np.ones((2, 3)))), x)


# --- linalg -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 4, 4), (0, 2, 2), (2, 0, 0)])
def test_inv_and_solve_match_numpy(shape):
    a = RNG.standard_normal(shape) + 3 * np.eye(shape[-1])
    check(np.linalg.inv, a, rtol=1e-9, atol=1e-10)
    b = RNG.standard_normal(shape[:-1] + (2,))
    check(np.linalg.solve, a, b, rtol=1e-9, atol=1e-10)
    if len(shape) == 2:
        check(np.linalg.solve, a, RNG.standard_normal(shape[-1]), rtol=1e-9, atol=1e-10)


def test_inv_pivots_like_lapack():
    a = np.array([[0.0, 2.0, 1.0], [1e-12, 1.0, 0.0], [3.0, 0.0, 1.0]])  # a zero leading pivot
    check(np.linalg.inv, a, rtol=1e-9, atol=1e-12)
    check(np.linalg.inv, a.astype(np.float32), rtol=1e-4, atol=1e-5)
    check(np.linalg.inv, np.array([[2, 1], [1, 3]]), rtol=1e-12)  # ints are solved in float64


def test_linalg_gradients():
    a = RNG.standard_normal((3, 3)) + 3 * np.eye(3)
    v = RNG.standard_normal(3)
    weights = np.arange(9.0).reshape(3, 3)
    check_grad(lambda m: np.sum(np.linalg.inv(m) * weights), a)
    check_grad(lambda m: np.sum(np.linalg.solve(m, v) ** 2), a)
    check_grad(lambda w: np.sum(np.linalg.solve(a, w) * np.arange(3.0)), v)


def test_linalg_bad_shapes_are_trace_errors():
    with pytest.raises(graphc.TraceError, match="square"):
        graphc.trace(np.linalg.inv, np.ones((2, 3)))
    with pytest.raises(graphc.TraceError, match="at most|up to"):
        graphc.trace(np.linalg.inv, np.eye(65))


# --- scipy.special, through graphc's table ----------------------------------------------------------


def gelu_exact(x):
    return 0.5 * x * (1 + scipy_special.erf(x / np.sqrt(2)))


def log_probs(logits):
    return logits - scipy_special.logsumexp(logits, axis=-1, keepdims=True)


def weighted_lse(x, w):
    return scipy_special.logsumexp(x, axis=(0, 1), b=w)


def signed_lse(x, w):
    return scipy_special.logsumexp(x, axis=1, b=w, return_sign=True)


def probabilities(x):
    return scipy_special.softmax(x, axis=1) + scipy_special.log_softmax(x, axis=0)


def all_axes(x):
    return scipy_special.softmax(x) * scipy_special.logsumexp(x)


@pytest.mark.parametrize("name", ["erf", "erfc", "ndtr", "expit", "log_expit"])
def test_scipy_ufuncs(name):
    fn = getattr(scipy_special, name)
    x = np.concatenate([np.linspace(-30, 30, 241), [0.0, -0.0, 1e-300, 2.0, -2.0, np.inf, -np.inf, np.nan]])
    check(lambda a: fn(a), x, rtol=2e-13, atol=1e-300)
    check(lambda a: fn(a), x.astype(np.float32), rtol=2e-6, atol=1e-30)
    check(lambda a: fn(a), np.arange(-3, 4), rtol=2e-13, atol=1e-300)  # (ints use the float64 loop)
    check(lambda a: fn(a), np.zeros((0, 2)))


def _erf_over_x(t):
    x = math.sqrt(t)
    return math.erf(x) / x if x > 0 else 2 / math.sqrt(math.pi)


def _scaled_erfc(u):
    """erfc(x) exp(x**2) x sqrt(pi) at x = 2 / u; the asymptotic series where exp(x**2) overflows."""
    x = 2 / u if u > 0 else math.inf
    if x < 25:
        return math.erfc(x) * math.exp(x * x) * x * math.sqrt(math.pi)
    total, term = 1.0, 1.0
    for k in range(1, 8):
        term *= -(2 * k - 1) / (2 * x * x)
        total += term
    return total


def test_erf_coefficients_are_the_interpolants():
    from numpy.polynomial import chebyshev

    from graphc.frontend import scipy_table

    for fn, coef, domain in [
        (_erf_over_x, scipy_table.SMALL, scipy_table.SMALL_DOMAIN),
        (_scaled_erfc, scipy_table.LARGE, scipy_table.LARGE_DOMAIN),
    ]:
        fit = chebyshev.Chebyshev.interpolate(np.vectorize(fn), len(coef) - 1, domain=list(domain))
        np.testing.assert_allclose(fit.coef, coef, rtol=0, atol=1e-15)


def test_scipy_binary_and_logit():
    p = np.array([0.0, 1e-9, 0.25, 0.5, 0.99, 1.0])
    check(lambda a: scipy_special.logit(a), p)
    x, y = np.array([0.0, 0.0, 2.0, 1.5, 0.0]), np.array([0.0, 3.0, 0.5, np.nan, np.nan])
    check(lambda a, b: scipy_special.xlogy(a, b), x, y)


def test_scipy_python_functions():
    check(log_probs, X)
    check(weighted_lse, X, RNG.uniform(0, 1, X.shape))
    w = RNG.standard_normal(X.shape)
    got, want = graphc.jit(signed_lse)(X, w), signed_lse(X, w)
    for g, v in zip(got, want):
        same(g, v)
    check(probabilities, X)
    check(all_axes, X)
    with np.errstate(invalid="ignore"):  # (-inf - -inf, in numpy's run as in graphc's)
        check(log_probs, np.array([[-np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf]]))


def gelu_loss(x):
    return np.sum(gelu_exact(x))


def log_probs_loss(x):
    return np.sum(log_probs(x) * np.arange(4.0))


def test_scipy_gradients():
    x = RNG.standard_normal((2, 4)) * 2
    check_grad(gelu_loss, x)
    check_grad(log_probs_loss, x)  # (scipy's Python functions are replaced in converted code: a def, not a lambda)
    check_grad(lambda a: np.sum(scipy_special.expit(a) ** 2), x)
    check_grad(lambda a: np.sum(scipy_special.erfc(a * 2)), x)


def test_graphc_does_not_import_scipy():
    code = (
        "import sys, numpy as np, graphc\n"
        "graphc.jit(lambda x: np.cumsum(np.exp(x)))(np.ones(3))\n"
        "assert not any(m == 'scipy' or m.startswith('scipy.') for m in sys.modules), 'scipy was imported'\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# --- what a graph cannot hold: data-dependent shapes ------------------------------------------------


def test_data_dependent_shapes_name_the_static_rewrite():
    def mask(x):
        return x[x > 0]  # <mask>

    def where1(x):
        return np.where(x > 0)  # <where1>

    def nonzero(x):
        return np.nonzero(x)  # <nonzero>

    def nonzero_method(x):
        return x.nonzero()  # <nonzero-method>

    def unique(x):
        return np.unique(x)  # <unique>

    def argwhere(x):
        return np.argwhere(x > 0)  # <argwhere>

    for fn, marker, rewrite in [
        (mask, "<mask>", "np.where(mask, x, 0)"),
        (where1, "<where1>", "np.where(condition, x, 0)"),
        (nonzero, "<nonzero>", "np.where(x != 0, x, 0)"),
        (nonzero_method, "<nonzero-method>", "np.where(x != 0, x, 0)"),
        (unique, "<unique>", "np.arange(k)"),
        (argwhere, "<argwhere>", "np.where(condition, x, 0)"),
    ]:
        with pytest.raises(graphc.TraceError) as info:
            graphc.jit(fn)(X)
        err = info.value
        assert err.lineno == line_of(marker), (fn.__name__, str(err))
        assert "data-dependent" in str(err) and rewrite in str(err), str(err)
        assert str(err).startswith(f"{err.filename}:{err.lineno}: ")


def test_unsupported_calls_name_the_alternative():
    def fmax(x):
        return np.fmax(x, 0.0)  # <fmax>

    def diff(x):
        return np.diff(x, axis=-1)  # <diff>

    def diagonal(x):
        return x.diagonal()  # <diagonal>

    for fn, marker, text in [
        (fmax, "<fmax>", "numpy.fmax is not supported by graphc; np.maximum"),
        (diff, "<diff>", "numpy.diff is not supported by graphc; use x[..., 1:] - x[..., :-1]"),
        (diagonal, "<diagonal>", "ndarray.diagonal is not supported by graphc; use np.einsum('ii->i', x)"),
    ]:
        with pytest.raises(graphc.TraceError) as info:
            graphc.jit(fn)(X)
        assert info.value.lineno == line_of(marker) and text in str(info.value), str(info.value)


def model_with_new_functions(x, a):
    """cumsum, sort, prod and inv in one step, to run sharded."""
    ranked = np.sort(np.cumsum(x, axis=1), axis=1)
    return ranked @ np.linalg.inv(a) + np.prod(x[:, :2], axis=1, keepdims=True)


def test_new_functions_shard_and_have_jvps():
    x = RNG.uniform(0.5, 1.5, (4, 3))
    a = RNG.standard_normal((3, 3)) + 3 * np.eye(3)
    want = model_with_new_functions(x, a)
    got = graphc.parallelize(model_with_new_functions, mesh={"dp": 2})(x, a)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10)
    tangent = RNG.standard_normal(x.shape)
    _, jvp = graphc.jvp(lambda v: model_with_new_functions(v, a), (x,), (tangent,))
    eps = 1e-6
    numeric = (model_with_new_functions(x + eps * tangent, a) - model_with_new_functions(x - eps * tangent, a)) / (
        2 * eps
    )
    np.testing.assert_allclose(jvp, numeric, rtol=1e-5, atol=1e-7)


# --- the survey tooling ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def numpy_survey():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "docs"))
    try:
        import numpy_survey
    finally:
        sys.path.pop(0)
    return numpy_survey


def test_coverage_probes(numpy_survey):
    """Every function docs/numpy_coverage.md calls supported gives numpy's result under graphc.jit."""
    pytest.importorskip("scipy.stats")
    assert numpy_survey.check_probes() == {}
    assert numpy_survey.status("np.nonzero")[0] == numpy_survey.REWRITE


def test_survey_counts_calls(tmp_path, numpy_survey):
    (tmp_path / "a.py").write_text(
        "import numpy as np\n"
        "from scipy.special import expit as sig\n"
        "def f(x):\n"
        "    return np.sum(np.exp(x).reshape(-1)) + sig(x).T.sum()\n"
        "# --- driver (not traced) ---\n"
        "w = np.random.randn(3) + np.exp(1)\n"
    )
    result = numpy_survey.survey(str(tmp_path))
    table = result["functions"]
    assert result["files"] == ["a.py"]
    assert table["np.exp"] == {"files": 1, "model_calls": 1, "driver_calls": 1}
    assert table["np.sum"]["model_calls"] == 1 and table["ndarray.sum"]["model_calls"] == 1
    assert table["scipy.special.expit"]["model_calls"] == 1
    assert table["ndarray.reshape"]["model_calls"] == 1 and table["ndarray.T"]["model_calls"] == 1
    assert table["np.random.randn"]["driver_calls"] == 1
