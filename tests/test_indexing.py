"""Property tests: ``x[key]`` traced by graphc gives exactly numpy's result.

Random keys (basic: ints, slices, ``...``, ``None``; advanced: int arrays, lists, ranges, static bool masks,
traced integer arrays passed as arguments) on arrays of rank 0-4 with dims of size 0-5. numpy runs first:
if it accepts the key, the traced graph must evaluate to the same value, shape and dtype (and the graph must
verify and round-trip through the text IR); if numpy raises IndexError, ``graphc.trace`` must raise
``graphc.TraceError``. Keys numpy rejects with other exceptions are not generated (or are discarded).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import graphc

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# --- helpers -----------------------------------------------------------------------------------


def assert_same(got, expected):
    assert isinstance(got, (np.ndarray, np.generic)), f"expected an array, got {type(got).__name__}"
    g, e = np.asarray(got), np.asarray(expected)
    assert g.shape == e.shape, f"shape {g.shape} != numpy's {e.shape}"
    assert g.dtype == e.dtype, f"dtype {g.dtype} != numpy's {e.dtype}"
    np.testing.assert_array_equal(g, e, strict=True)


def check_index(x, key_fn, *traced):
    """``key_fn(*traced)`` builds the key; ``traced`` (index arrays) are graph inputs, the rest is static."""

    def fn(x, *idx):
        return x[key_fn(*idx)]

    try:
        expected = fn(x, *traced)
    except IndexError:
        with pytest.raises(graphc.TraceError):
            graphc.trace(fn, x, *traced)
        return "error"
    expected = np.array(expected, copy=True)
    g = graphc.trace(fn, x, *traced)
    g.verify()
    text = str(g)
    parsed = graphc.parse(text)
    assert str(parsed) == text, "text IR does not round-trip"
    assert_same(graphc.evaluate(g, x, *traced), expected)
    assert_same(graphc.evaluate(parsed, x, *traced), expected)
    return "ok"


def make_array(shape, dtype):
    base = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    if dtype == np.bool_:
        return np.asarray(base % 3 == 1)
    return np.asarray((base * 7 % 23 - 5).astype(dtype))


DTYPES = [np.float32, np.float64, np.int64, np.int32, np.bool_]
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


class Traced:
    """Placeholder in a key template: the i-th traced index array."""

    def __init__(self, i):
        self.i = i

    def __repr__(self):
        return f"<traced {self.i}>"


def substitute(template, traced):
    def sub(k):
        return traced[k.i] if isinstance(k, Traced) else k

    if isinstance(template, tuple):
        return tuple(sub(k) for k in template)
    return sub(template)


# --- key strategies -----------------------------------------------------------------------------

BASIC = ["int", "slice", "slice", "none", "ellipsis"]
ADVANCED = ["array", "list", "range", "mask"]


@st.composite
def int_index(draw, n):
    if n and draw(st.integers(0, 9)):  # mostly in bounds
        return draw(st.integers(-n, n - 1))
    return draw(st.integers(-n - 2, n + 1))


@st.composite
def slice_index(draw, n):
    bound = st.none() | st.integers(-n - 3, n + 3)
    step = st.none() | st.integers(-3, 3).filter(lambda s: s != 0)
    return slice(draw(bound), draw(bound), draw(step))


@st.composite
def index_shape(draw, bshape):
    """Mostly a shape that broadcasts to bshape (a suffix, some dims set to 1); sometimes anything."""
    if draw(st.integers(0, 14)) == 0:
        return tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    k = draw(st.integers(0, len(bshape)))
    return tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in bshape[len(bshape) - k :])


@st.composite
def int_array(draw, n, shape, in_bounds, dtype=np.int64):
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0:
        return np.zeros(shape, dtype)
    if n == 0:  # no valid index exists: keep it empty when it must be valid
        if in_bounds:
            return np.zeros((0,) + tuple(shape[1:]), dtype)
        lo, hi = -2, 1
    elif in_bounds or draw(st.integers(0, 9)):
        lo, hi = (0 if np.dtype(dtype).kind == "u" else -n), n - 1
    else:
        lo, hi = -n - 2, n + 1
    vals = draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size))
    return np.array(vals, dtype=np.int64).reshape(shape).astype(dtype)


@st.composite
def key_template(draw, kinds, require=None, max_extra=2, min_rank=0):
    """(x, key template, traced index arrays). A key template is a tuple of components or, sometimes, one
    bare component (numpy's non-tuple key)."""
    x, shape = draw_indexed_array(draw, min_rank)
    ndim = len(shape)
    comp_kinds = draw_component_kinds(draw, kinds, ndim, require, max_extra)
    mask_nd = {i: draw(st.sampled_from([1, 1, 2])) for i, k in enumerate(comp_kinds) if k == "mask"}
    dims = component_dims(comp_kinds, mask_nd, ndim)

    def size_at(dim):
        """The size of x's dim ``dim``; a random size past x's dims (a key with too many indices)."""
        return shape[dim] if 0 <= dim < ndim else draw(st.integers(0, 5))

    bshape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))  # the shape index arrays mostly broadcast to
    traced = []
    comps = []
    for i, (k, dim) in enumerate(zip(comp_kinds, dims)):
        n = size_at(dim)
        if k == "mask":
            comps.append(draw_mask(draw, tuple(size_at(dim + j) for j in range(mask_nd[i]))))
        elif k == "traced":
            dt = draw(st.sampled_from([np.int64, np.int32, np.uint8]))
            traced.append(draw(int_array(n, draw(index_shape(bshape)), in_bounds=True, dtype=dt)))
            comps.append(Traced(len(traced) - 1))
        else:
            comps.append(draw_static_component(draw, k, n, bshape))
    if len(comps) == 1 and draw(st.booleans()):
        template = comps[0]  # bare key, not a 1-tuple
    else:
        template = tuple(comps)
    return x, template, traced


def draw_indexed_array(draw, min_rank):
    """(x, shape): the array to index, of a random shape of rank >= min_rank and a random dtype; a rank-0
    array is sometimes a numpy scalar."""
    shape = draw(shapes.filter(lambda s: len(s) >= min_rank))
    dtype = draw(st.sampled_from(DTYPES))
    x = make_array(shape, dtype)
    if not shape and draw(st.booleans()):
        x = x[()]  # a numpy scalar (also a graph input)
    return x, shape


def draw_component_kinds(draw, kinds, ndim, require, max_extra):
    """The kind of each key component: mostly at most ndim components, sometimes up to max_extra more
    (too many indices); ``require`` is always one of them; two ellipses only rarely."""
    ncomp = draw(st.integers(0, ndim)) if draw(st.integers(0, 4)) else ndim + draw(st.integers(1, max_extra))
    comp_kinds = [draw(st.sampled_from(kinds)) for _ in range(ncomp)]
    if require and require not in comp_kinds:
        if comp_kinds:
            comp_kinds[draw(st.integers(0, len(comp_kinds) - 1))] = require
        else:
            comp_kinds.append(require)
    if comp_kinds.count("ellipsis") > 1 and draw(st.integers(0, 4)):  # two ellipses: rarely (an IndexError)
        first = comp_kinds.index("ellipsis")
        comp_kinds = [k for i, k in enumerate(comp_kinds) if k != "ellipsis" or i == first]
    return comp_kinds


def component_dims(comp_kinds, mask_nd, ndim):
    """Which dim each component indexes (after '...' the dims count from the end); a mask covers
    ``mask_nd[i]`` dims, None and '...' none, every other component one."""

    def consumes(i, k):
        return mask_nd[i] if k == "mask" else 0 if k in ("none", "ellipsis") else 1

    dims, d = [], 0
    if "ellipsis" in comp_kinds:
        e = comp_kinds.index("ellipsis")
        after = sum(consumes(i, k) for i, k in enumerate(comp_kinds) if i > e)
    for i, k in enumerate(comp_kinds):
        if k == "ellipsis" and i == comp_kinds.index("ellipsis"):
            d = ndim - after
        dims.append(d)
        d += consumes(i, k)
    return dims


def draw_static_component(draw, k, n, bshape):
    """A static component of kind k (neither a mask nor a traced array) for a dim of size n: an int, a
    slice, None, '...', an int array, a list or a range (index arrays mostly broadcast to bshape)."""
    if k == "int":
        return draw(int_index(n))
    if k == "slice":
        return draw(slice_index(n))
    if k == "none":
        return None
    if k == "ellipsis":
        return Ellipsis
    if k == "array":
        dt = draw(st.sampled_from([np.int64, np.int32, np.intp, np.uint8, np.int8]))
        return draw(int_array(n, draw(index_shape(bshape)), in_bounds=False, dtype=dt))
    if k == "list":
        arr = draw(int_array(n, draw(index_shape(bshape)), in_bounds=False))
        return arr.tolist() if arr.ndim else [int(arr)]
    if k == "range":
        return draw_range(draw, n, bshape)
    raise AssertionError(k)


def draw_range(draw, n, bshape):
    """A range index for a dim of size n: sometimes in bounds and of bshape's length (it broadcasts),
    else with random bounds and step."""
    if len(bshape) == 1 and 0 < bshape[0] <= n and draw(st.booleans()):  # in bounds, broadcasts
        length, step = bshape[0], draw(st.sampled_from([1, -1]))
        start = draw(st.integers(-n, n - length) if step == 1 else st.integers(length - 1 - n, n - 1))
        return range(start, start + step * length, step)
    return range(draw(st.integers(-n, n)), draw(st.integers(-n, n + 1)), draw(st.sampled_from([1, 2, -1, 3])))


def draw_mask(draw, covered):
    """A static bool mask over dims of sizes ``covered`` (sometimes of a wrong shape: numpy raises
    IndexError); a non-empty 1-d mask is sometimes a list."""
    if draw(st.integers(0, 9)) == 0:  # wrong mask shape: numpy raises IndexError
        covered = tuple(draw(st.integers(0, 5)) for _ in covered)
    m = np.array(
        draw(st.lists(st.booleans(), min_size=int(np.prod(covered)), max_size=int(np.prod(covered)))),
        dtype=bool,
    ).reshape(covered)
    return m.tolist() if m.ndim == 1 and m.size and draw(st.booleans()) else m


def run(x, template, traced):
    key_fn = lambda *idx: substitute(template, idx)  # noqa: E731
    key = substitute(template, traced)
    try:  # keys numpy rejects with something other than IndexError are not generated on purpose
        x[key]
    except IndexError as exc:
        event(f"numpy IndexError: {str(exc).split(':')[0][:40]}")
    except (TypeError, ValueError):
        assume(False)
    outcome = check_index(x, key_fn, *traced)
    event(f"numpy {'accepts' if outcome == 'ok' else 'raises IndexError'}")
    return outcome


# --- property tests ------------------------------------------------------------------------------


@settings(max_examples=200, **SETTINGS)
@given(key_template(BASIC))
def test_basic_indexing(case):
    run(*case)


@pytest.mark.slow
@settings(max_examples=200, **SETTINGS)
@given(key_template(BASIC + ADVANCED + ADVANCED))
def test_advanced_indexing_static(case):
    run(*case)


@pytest.mark.slow
@settings(max_examples=150, **SETTINGS)
@given(key_template(BASIC + ["traced", "traced", "array", "list", "mask"], require="traced", min_rank=1))
def test_advanced_indexing_traced(case):
    run(*case)


@pytest.mark.slow
@settings(max_examples=100, **SETTINGS)
@given(
    st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple),
    st.data(),
)
def test_non_adjacent_advanced_moves_to_front(shape, data):
    """Advanced indices separated by a slice: numpy puts the broadcast index dims first."""
    x = make_array(shape, np.float32)
    ndim = len(shape)
    i, j = sorted(data.draw(st.lists(st.integers(0, ndim - 1), min_size=2, max_size=2, unique=True)))
    assume(j > i + 1 or data.draw(st.booleans()))  # mostly non-adjacent; adjacent too for contrast
    bshape = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    a = data.draw(int_array(shape[i], bshape, in_bounds=True))
    b = data.draw(int_array(shape[j], bshape, in_bounds=True))
    traced_a = data.draw(st.booleans())
    template = [slice(None)] * ndim
    template[i] = Traced(0) if traced_a else a
    template[j] = b
    if data.draw(st.booleans()):  # a slice with a step in between / around
        k = data.draw(st.sampled_from([d for d in range(ndim) if d not in (i, j)] or [None]))
        if k is not None:
            template[k] = slice(None, None, -2)
    assert run(x, tuple(template), [a] if traced_a else []) == "ok"


# --- explicit examples: the forms deep-learning code uses ------------------------------------------

E = make_array((7, 4), np.float32)
X34 = make_array((3, 4), np.float32)
X234 = make_array((2, 3, 4), np.float64)


@pytest.mark.parametrize(
    "x, key_fn, traced",
    [
        pytest.param(E, lambda t: t, [np.array([[1, 0, 6], [2, 2, 3]])], id="embedding_lookup"),
        pytest.param(E, lambda t: t, [np.array([3], np.int32)], id="embedding_int32"),
        pytest.param(E, lambda t: t, [np.array(5)], id="embedding_0d_index"),
        pytest.param(E, lambda t: t, [np.int64(-2)], id="embedding_np_int_scalar_arg"),
        pytest.param(X34, lambda lab: (np.arange(3), lab), [np.array([3, 0, 2])], id="arange_labels"),
        pytest.param(X34, lambda r, lab: (r, lab), [np.array([0, 1, 2]), np.array([3, 0, -1])], id="both_traced"),
        pytest.param(X34, lambda lab: (range(3), lab), [np.array([1, 1, 2])], id="range_labels"),
        pytest.param(
            X234,
            lambda lab: (np.arange(2)[:, None], np.arange(3), lab),
            [np.array([[0, 1, 2], [3, 3, 0]])],
            id="batched_labels",
        ),
        pytest.param(X234, lambda t: (t, slice(None), t), [np.array([1, 0])], id="same_traced_twice_non_adjacent"),
        pytest.param(X234, lambda t: (Ellipsis, t), [np.array([[3, 2], [1, 0]])], id="ellipsis_traced_last_dim"),
        pytest.param(X234, lambda t: (None, 1, t, None), [np.array([2, 0])], id="none_int_traced"),
        pytest.param(X234, lambda t: (t, 0, slice(1, None)), [np.array([1, 0, 1])], id="traced_int_adjacent"),
        pytest.param(X234, lambda t: (t, slice(None), 0), [np.array([1, 0, 1])], id="traced_int_non_adjacent"),
        pytest.param(
            X234, lambda t: (slice(None), np.array([True, False, True]), t), [np.array([3, 0])], id="mask_and_traced"
        ),
        pytest.param(X34, lambda t: np.asarray(t), [np.array([0, 2])], id="asarray_of_traced_index"),
        pytest.param(
            X34,
            lambda a, b: [a, b],
            [np.array([0, 2]), np.array([1, 1])],
            id="list_of_traced_arrays_is_one_index_array",
        ),
        pytest.param(X34, lambda t: (t[:, None], t[None, :]), [np.array([1, 2])], id="outer_product_index"),
        pytest.param(X34, lambda t: t, [np.zeros((0,), np.int64)], id="empty_traced_index"),
        # an ellipsis standing for no dims still separates the index arrays: they move to the front
        pytest.param(X234, lambda t: (slice(None), t, Ellipsis, t), [np.array([1, 0])], id="empty_ellipsis_separates"),
        pytest.param(
            X234, lambda t: (slice(None), 2, Ellipsis, t), [np.array([1, 0])], id="empty_ellipsis_separates_int"
        ),
        pytest.param(
            np.zeros((1, 0, 0), np.float32),
            lambda a, b: (slice(None), a, Ellipsis, b),
            [np.zeros((0,), np.int64)] * 2,
            id="empty_ellipsis_empty_arrays",
        ),
    ],
)
def test_traced_index_examples(x, key_fn, traced):
    assert check_index(x, key_fn, *traced) == "ok"


@pytest.mark.parametrize(
    "x, key",
    [
        pytest.param(X34, True, id="true"),
        pytest.param(X34, (False, 0), id="false_int"),
        pytest.param(X34, (Ellipsis, np.True_), id="np_true"),
        pytest.param(X34, np.array(True), id="0d_mask"),
        pytest.param(X34, (np.False_,), id="np_false"),
        pytest.param(X34, (True, [0, 2]), id="true_with_array"),
        pytest.param(X34, ([0, 2], slice(None), True), id="true_non_adjacent"),
        pytest.param(X34, (None, False, slice(1, 3), np.array(True)), id="none_false_slice_true"),
        pytest.param(np.float32(2.0), True, id="true_on_0d"),
    ],
)
def test_scalar_bool_index(x, key):
    assert check_index(x, lambda: key) == "ok"


@pytest.mark.parametrize(
    "x, key",
    [
        pytest.param(X34, np.zeros((0,), bool), id="empty_mask_wrong_length"),
        pytest.param(X34, np.zeros((0, 4), bool), id="empty_2d_mask_wrong_length"),
        pytest.param(X34, np.zeros((3, 0), bool), id="empty_2d_mask_wrong_width"),
        pytest.param(
            np.zeros((0, 0), np.float32), (np.array([0]), np.zeros((0,), bool)), id="empty_mask_and_oob_array"
        ),
        pytest.param(X34, (np.array([5]), np.array([], np.int64)), id="oob_array_broadcast_to_empty"),
        pytest.param(X34, ([7, 8], np.zeros((0, 1), np.int64)), id="oob_list_broadcast_to_empty"),
        pytest.param(X34, (np.array([1]), np.array([], np.int64)), id="in_bounds_broadcast_to_empty"),
        pytest.param(X34, np.zeros((3,), bool), id="all_false_mask"),
    ],
)
def test_empty_advanced_index(x, key):
    x[key]  # numpy accepts all of these
    assert check_index(x, lambda: key) == "ok"


@pytest.mark.parametrize(
    "x, key",
    [
        pytest.param(X34, (5, 0), id="int_oob"),
        pytest.param(X34, (slice(None), np.zeros((2,), bool)), id="mask_wrong_length"),
        pytest.param(X34, (np.array([5]), np.array([1])), id="oob_array"),
        pytest.param(X34, (slice(None), -5), id="neg_int_oob"),
        pytest.param(X34, (0, 0, 0), id="too_many"),
        pytest.param(X34, (Ellipsis, 0, Ellipsis), id="two_ellipses"),
        pytest.param(X34, ([0, 3],), id="list_oob"),
        pytest.param(X34, (np.array([0, 1]), np.array([0, 1, 2])), id="shape_mismatch"),
        pytest.param(X34, np.array([True, False]), id="mask_wrong_shape"),
        pytest.param(X34, np.zeros((0, 7), bool), id="empty_mask_nonzero_dim_wrong"),
        pytest.param(X34, (range(2, 5),), id="range_oob"),
        pytest.param(np.zeros((0, 3)), (slice(None), [5]), id="oob_with_empty_result"),
        pytest.param(np.float32(1.0), 0, id="index_0d"),
    ],
)
def test_index_errors(x, key):
    assert check_index(np.asarray(x), lambda: key) == "error"
