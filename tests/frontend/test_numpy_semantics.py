"""numpy's exact semantics in the corners differential fuzzing found (tests/fuzz/test_numpy_jit.py):
result dtypes of every ufunc and operator on bool and small-int arrays next to Python and numpy
scalars (NEP 50), the fast paths of ``**``, numpy scalars against 0-d arrays, einsum's order of
summation, np.clip and np.where with scalar bounds, valid numpy graphc used to reject, and numpy's
own errors raised as GraphcErrors (never a bare TypeError or ValueError).

Each check traces the function, evaluates the graph with the reference interpreter and compares
with numpy eagerly: the same dtype and shape, equal values (nan, infinities and the sign of zeros
included); where numpy raises, graphc raises a GraphcError that is also of numpy's class.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np
import pytest

import graphc
from graphc.core.errors import GraphcError, TraceError
from graphc.frontend.ufuncs import SUPPORTED
from tests.helpers import quick_share

DTYPES = [np.dtype(d) for d in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8")]
SCALARS = [True, False, 0, 2, -1, 300, -129, 2.5, -0.0, float("inf"), float("nan"), np.float32(2), np.int8(-3)]
# composed from other primitives (log2 = log / log(2), ...), or a libm pow whose last bit numpy's
# own loops change with the operands' memory layout: equal to numpy up to rounding
ROUNDED = {np.log2, np.log10, np.logaddexp, np.exp2, np.power, np.float_power}


def sample(dt: np.dtype) -> np.ndarray:
    if dt.kind == "b":
        return np.array([True, False, True, False])
    if dt.kind == "u":
        return np.array([0, 1, 3, np.iinfo(dt).max], dt)
    if dt.kind == "i":
        return np.array([-2, 0, 3, np.iinfo(dt).min], dt)
    return np.array([-0.0, 1.5, -np.inf, np.nan], dt)


def quiet(fn, *args):
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args)


def run_graphc(fn, *args):
    return quiet(lambda *xs: graphc.evaluate(graphc.trace(fn, *xs), *xs), *args)


def assert_identical(got, want, what, rounded=False):
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (
        f"{what}: {got.dtype}{got.shape} != numpy's {want.dtype}{want.shape}"
    )
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: nan")
    both = ~np.isnan(want)
    if rounded:
        np.testing.assert_allclose(
            got[both], want[both], rtol={2: 1e-3, 4: 1e-6, 8: 1e-13}[want.dtype.itemsize], err_msg=what
        )
    else:
        np.testing.assert_array_equal(got[both], want[both], err_msg=what)
    np.testing.assert_array_equal(np.signbit(got[both]), np.signbit(want[both]), err_msg=f"{what}: signs")


def _gap(ufunc, want) -> bool:
    """Known, documented gaps (graphc raises a TraceError saying what is unsupported): bitwise ops
    on integers, floor division / remainder of floats, reciprocal of integers."""
    dt = np.asarray(want[0] if isinstance(want, tuple) else want).dtype
    if ufunc in (np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.invert):
        return dt.kind != "b"
    if ufunc in (np.floor_divide, np.remainder, np.divmod):
        return dt.kind == "f"
    return ufunc is np.reciprocal and dt.kind in "biu"


def check_batch(label, fns, args):
    """Each ``fn(*args)`` of ``fns`` against numpy; the ones numpy computes are traced together."""
    ok, wants = [], []
    for fn in fns:
        try:
            wants.append(quiet(fn, *args))
            ok.append(fn)
        except Exception as exc:
            with pytest.raises(GraphcError) as info:
                run_graphc(fn, *args)
            assert isinstance(info.value, (TraceError, type(exc))), f"{label}: {info.value!r} for numpy's {exc!r}"
    if ok:
        got = run_graphc(lambda *xs: tuple(fn(*xs) for fn in ok), *args)
        for k, (g, w) in enumerate(zip(got, wants)):
            if isinstance(w, tuple):
                for j, (gj, wj) in enumerate(zip(g, w)):
                    assert_identical(gj, wj, f"{label} case {k} result {j}")
            else:
                assert_identical(g, w, f"{label} case {k}")


def _ufunc_calls(ufunc, x):
    """ufunc(x), or ufunc with x on either side of every dtype's array and of the scalars."""
    if ufunc.nin == 1:
        return [lambda x: ufunc(x)]
    calls = []
    for dt in DTYPES:
        y = sample(dt)
        calls += [lambda x, y=y: ufunc(x, y), lambda x, y=y: ufunc(y[::-1], x)]
    for s in SCALARS:
        calls += [lambda x, s=s: ufunc(x, s), lambda x, s=s: ufunc(s, x)]
    return calls


@pytest.mark.parametrize(
    "ufunc",
    quick_share(sorted(SUPPORTED - {np.matmul}, key=lambda u: u.__name__), every=6, keep=(np.add, np.power, np.less)),
    ids=lambda u: u.__name__,
)
def test_every_ufunc_on_every_dtype_and_scalar(ufunc):
    """numpy's result dtype (NEP 50: Python scalars weak, numpy scalars strong) and values, for
    arrays of every dtype and 0-d arrays; where numpy raises (no loop, a Python int out of the
    array's range) graphc raises a GraphcError."""
    for dt in DTYPES:
        for x in (sample(dt), sample(dt)[1:2].reshape(())):
            calls = _ufunc_calls(ufunc, x)
            supported = []
            for fn in calls:
                try:
                    want = quiet(fn, x)
                except Exception:
                    supported.append(fn)
                    continue
                if _gap(ufunc, want):
                    with pytest.raises(TraceError, match="supported"):
                        run_graphc(fn, x)
                else:
                    supported.append(fn)
            label = f"{ufunc.__name__} on {dt}{list(x.shape)}"
            if ufunc in ROUNDED:
                for fn in supported:
                    try:
                        want = quiet(fn, x)
                    except Exception:
                        with pytest.raises(GraphcError):
                            run_graphc(fn, x)
                        continue
                    assert_identical(run_graphc(fn, x), want, label, rounded=True)
            else:
                check_batch(label, supported, (x,))


OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "**": operator.pow,
    "<": operator.lt,
    "==": operator.eq,
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
}
EXPONENTS = [2, -1, 0.5, 2.0, -1.0, 3, 1, 0, True, np.int64(2), np.float64(0.5)]


@pytest.mark.parametrize("dt", quick_share(DTYPES, every=3), ids=str)
def test_operators_on_arrays_and_0d_arrays(dt):
    """ndarray's operators: ``**`` takes np.square for a Python int 2 (``bool_array ** 2`` is int8)
    and, on floats, np.reciprocal for -1 and np.sqrt for 0.5 (``float16 ** 0.5`` of -0.0 is -0.0);
    ``&``, ``|``, ``^`` of bools are the logical ops."""
    for x in (sample(dt), sample(dt)[:1].reshape(())):
        fns = []
        for name, op in OPERATORS.items():
            others = EXPONENTS if name == "**" else SCALARS + [sample(d) for d in DTYPES]
            for s in others:
                fns += [lambda x, op=op, s=s: op(x, s), lambda x, op=op, s=s: op(s, x)]
        bitwise = [fn for fn in fns if _is_int_bitwise(fn, x)]
        check_batch(f"operators on {dt}{list(x.shape)}", [fn for fn in fns if fn not in bitwise], (x,))
        for fn in bitwise:  # bitwise ops on integers: a documented gap, a TraceError
            with pytest.raises(TraceError):
                run_graphc(fn, x)


def _is_int_bitwise(fn, x) -> bool:
    op = fn.__defaults__[0]
    if op not in (operator.and_, operator.or_, operator.xor):
        return False
    try:
        return quiet(fn, x).dtype.kind != "b"
    except Exception:
        return False


def test_unary_operators():
    for dt in DTYPES:
        x = sample(dt)
        fns = [lambda x: -x, lambda x: abs(x), lambda x: +x, lambda x: np.abs(x), lambda x: np.positive(x)]
        if dt.kind == "b":
            fns.append(lambda x: ~x)
        check_batch(f"unary operators on {dt}", fns, (x,))


def test_in_place_power_takes_the_fast_paths():
    def f(x):
        y = x.copy()
        y **= 0.5
        z = x.copy()
        z **= 2
        return y, z

    for dt in (np.float16, np.float32, np.float64):
        x = np.array([-0.0, -np.inf, 4.0, 2.0], dt)
        got, want = run_graphc(f, x), quiet(f, x)
        for g, w in zip(got, want):
            assert_identical(g, w, f"**= on {np.dtype(dt)}")

    def g(x):
        x **= 2
        return x

    with pytest.raises(TraceError, match="square"):  # numpy: int8 square output cannot be cast to bool
        run_graphc(g, np.array([True, False]))
    with pytest.raises(TypeError, match="square"):
        g(np.array([True, False]))


# --- numpy scalars are not 0-d arrays ---------------------------------------------------------------


def test_numpy_scalars_power_without_fast_paths():
    """A reduction, a ufunc on 0-d values and an integer index give numpy scalars, whose ``**`` is
    np.power's pow (-0.0 ** 0.5 is 0.0, -inf ** 0.5 is inf) and whose bool ``** 2`` is int64;
    x[0, ...] and a 0-d input are arrays (sqrt: -0.0 and nan)."""
    x = np.array([-0.0, -np.inf, 4.0, 0.0])
    fns = [
        lambda x: np.min(x) ** 0.5,
        lambda x: np.sum(x[:1]) ** 0.5,
        lambda x: x[0] ** 0.5,
        lambda x: x[1] ** 0.5,
        lambda x: (x[0] * 1.0) ** 0.5,
        lambda x: x[0, ...] ** 0.5,
        lambda x: x[1, ...] ** 0.5,
        lambda x: np.max(x) ** -1,
        lambda x: np.any(x > 0) ** 2,
        lambda x: (x > 0) ** 2,
        lambda x: x[3].astype(np.float32) ** 0.5,
        lambda x: np.reshape(x[0], ()) ** 0.5,
        lambda x: np.asarray(np.min(x)) ** 0.5,  # a 0-d array again
        lambda x: x[0].copy() ** 0.5,
    ]
    check_batch("numpy scalars", fns, (x,))
    check_batch("0-d input", [lambda z: z**0.5, lambda z: (z + 0.0) ** 0.5], (np.array(-0.0),))


def test_in_place_update_of_a_numpy_scalar_makes_a_new_value():
    def f(x):
        s = np.sum(x)
        t = s
        s += 0.5  # a new object: t keeps the sum
        u = np.sum(x > 0)
        u **= 0.5  # an int64 scalar becomes a float64 one (an array would refuse the cast)
        v = x[0]
        v -= 1  # not an in-place update of a view of x
        return t, s, u, v, x

    check_batch("scalar +=", [f], (np.array([1, 2, 3]),))


# --- einsum, clip, where, repeat --------------------------------------------------------------------


def test_einsum_sums_in_numpys_default_order():
    """numpy's einsum (optimize=False) sums every product: an infinity times 0 is nan, and a sum
    of -0.0 products is 0.0; an optimized order (b summed over q first) gives inf and -0.0."""
    a = np.array([np.inf, 1.0, -np.inf, -1.0])
    b = np.array([[1.0, 0.0, -0.0, 0.0], [0.0, 1.0, 2.0, -0.0]])
    fns = [
        lambda a, b: np.einsum("i,qi->i", a, b),
        lambda a, b: np.einsum("i,qi->q", a, b),
        lambda a, b: np.einsum("i,qi", a, b),
        lambda a, b: np.einsum("i,i->", a, b[1]),
        lambda a, b: np.einsum("i,i->i", -a, b[0]),
        lambda a, b: np.tensordot(b, a, 1),
    ]
    check_batch("einsum", fns, (a, b))
    assert np.isnan(graphc.jit(fns[0])(a, b)[0])


def test_clip_with_scalar_bounds_keeps_x_on_ties():
    """np.clip's float loop with scalar bounds keeps x where it ties a bound (-0.0 clipped to
    [0.0, 1.0] stays -0.0); with array bounds it is min(max(x, lo), hi). One dtype for all three
    operands (bool with 300 and a float32 bound is float32); int bounds beyond an int array's
    range clip nothing, or raise OverflowError as in numpy."""
    x = np.array([-0.0, 0.0, np.nan, -1.0, 2.0, np.inf])
    fns = [
        lambda x: np.clip(x, 0.0, 1.0),
        lambda x: np.clip(x, -0.0, 0.0),
        lambda x: np.clip(x, np.zeros(6), np.ones(6)),
        lambda x: np.clip(x, np.nan, 1.0),
        lambda x: np.clip(x[0], 0.0, 1.0),
        lambda x: x.clip(0.0, 1.0),
        lambda x: np.clip(x > 0, 300, np.float32(2)),
        lambda x: np.clip(x.astype(np.int8), -1000, 1000),
        lambda x: np.clip(x.astype(np.int8), 300, 2),
        lambda x: np.clip(x, None, None),
        lambda x: np.clip(x > 0, None, None),
    ]
    check_batch("clip", fns, (x,))
    np.testing.assert_array_equal(np.signbit(graphc.jit(fns[0])(x)), np.signbit(fns[0](x)))


def test_where_casts_python_numbers_that_do_not_fit():
    c = np.array([True, False, True])
    x = np.array([1, 2, 3], np.int8)
    fns = [lambda c, x: np.where(c, x, -129), lambda c, x: np.where(c, x, 300), lambda c, x: np.where(c, x, 2.5)]
    fns += [lambda c, x: np.where(c, x.astype(np.float16), 1e300), lambda c, x: np.where(x, 1, 2)]
    check_batch("where", fns, (c, x))


def test_repeat_corners():
    fns = [
        lambda x: np.repeat(x, [], axis=0),
        lambda x: np.repeat(x, 2, axis=1),
        lambda x: np.repeat(x[:0], 2, axis=0),
        lambda x: np.repeat(x[0, 0], 2, axis=0),
        lambda x: np.repeat(x[0, 0], 3),
        lambda x: np.repeat(x, 1.0, axis=0),
        lambda x: np.repeat(x, [1, 2], axis=0),
        lambda x: np.repeat(x, [-1], axis=0),
        lambda x: np.repeat(x[0, 0], 2, axis=1),
    ]
    check_batch("repeat", fns, (np.zeros((0, 3)),))
    check_batch("repeat", fns, (np.arange(6.0).reshape(2, 3),))


# --- valid numpy graphc used to reject ------------------------------------------------------------


def test_empty_index_lists():
    """numpy reads [] (a float64 array to np.asarray) as an empty integer index."""
    fns = [
        lambda x: np.take(x, [], axis=0),
        lambda x: np.take(x, [[], []], axis=1),
        lambda x: np.take(x, []),
        lambda x: x[[]],
        lambda x: np.take(x, [1.5, -1.0]),  # numpy: a list of floats truncates
        lambda x: np.take(x, np.array([1.5])),  # an array of floats: no same_kind cast
        lambda x: np.take(x, np.array([True, False]), axis=1),
        lambda x: np.take(x, x[0] > 0),
        lambda x: np.take(x, x[0]),  # (traced floats)
    ]
    check_batch("empty index", fns, (np.arange(6.0).reshape(2, 3),))


def test_logical_ufuncs_take_numbers_and_abs_takes_bools():
    x = np.array([0.0, -0.0, np.nan, 2.0])
    i = np.array([0, 3, -1, 0], np.int8)
    fns = [
        lambda x, i: np.logical_and(x, i),
        lambda x, i: np.logical_or(x, 0.0),
        lambda x, i: np.logical_not(x),
        lambda x, i: np.logical_not(i),
        lambda x, i: np.logical_xor(x, i),
        lambda x, i: np.logical_xor(x > 0, True),
        lambda x, i: np.abs(x > 0),
        lambda x, i: abs(i > 0),
        lambda x, i: np.abs(i.astype(np.uint8)),
        lambda x, i: (x > 0) ^ (i > 0),
    ]
    check_batch("logical", fns, (x, i))


def test_mixed_int64_uint64_comparisons_are_exact():
    a = np.array([-1, 0, 2**62, np.iinfo(np.int64).min, 5], np.int64)
    b = np.array([0, 0, 2**63 + 1, 1, 5], np.uint64)
    fns = [lambda a, b, op=op: op(a, b) for op in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq)]
    fns += [lambda a, b, op=op: op(b, a) for op in (operator.lt, operator.ne, operator.ge)]
    check_batch("int64 vs uint64", fns, (a, b))


@pytest.mark.parametrize("name", ["sum", "max", "min", "any", "all", "mean", "var", "std", "argmax", "argmin"])
def test_reductions_on_0d_arrays_follow_numpy(name):
    """numpy's ufunc reductions (sum, max, min, any, all) take axis 0 or -1 of a 0-d array (and
    reduce nothing), argmax/argmin ravel it first; mean/var/std raise numpy's AxisError, and
    every reduction raises it for axis 1, -2 or a tuple (0,), as a GraphcError."""
    fn = getattr(np, name)
    z = np.array(2.5)
    fns = [
        lambda z, ax=ax, kd=kd: fn(z, axis=ax, keepdims=kd) for ax in (0, -1, 1, -2, (0,), ()) for kd in (False, True)
    ]
    fns = [f for f in fns if not (name.startswith("arg") and isinstance(f.__defaults__[0], tuple))]
    check_batch(name, fns, (z,))
    check_batch(name, [lambda z: getattr(z, name)(axis=0)] if name not in ("argmax", "argmin") else [], (z,))
    with pytest.raises(np.exceptions.AxisError) as info:
        run_graphc(lambda z: fn(z, axis=1), z)
    assert isinstance(info.value, TraceError)


def test_sums_start_from_positive_zero():
    """numpy's sums of -0.0 are 0.0 (its add reduction starts from the identity +0.0), also over no
    axes (a 0-d array, axis=()); max and min keep -0.0."""
    v = np.array([-0.0, -0.0])
    fns = [
        lambda v: np.sum(v),
        lambda v: np.sum(v[:1]),
        lambda v: np.sum(v[0]),
        lambda v: v[0].sum(),
        lambda v: np.sum(v, axis=()),
        lambda v: np.mean(v[0]),
        lambda v: np.max(v[0]),
        lambda v: np.max(v, axis=()),
        lambda v: np.sum(v.reshape(1, 2), axis=-1),
    ]
    check_batch("sum of -0.0", fns, (v,))
    for fn in fns:
        got, want = graphc.jit(fn)(v), fn(v)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_running_sums_keep_negative_zero(dtype):
    """np.cumsum([-0.0, 1.0]) starts with -0.0: a running sum's first element is the element
    itself (the scan pads with -0.0, the float sum's identity, not 0.0)."""
    v = np.array([[-0.0, 1.0, -0.0], [-0.0, -0.0, -0.0]], dtype)
    fns = [
        lambda v: np.cumsum(v),
        lambda v: np.cumsum(v, axis=0),
        lambda v: np.cumsum(v, axis=1),
        lambda v: np.cumprod(v, axis=1),
        lambda v: np.cumsum(v[:, :1], axis=1),
    ]
    check_batch("cumsum of -0.0", fns, (v,))
    for fn in fns:
        got, want = graphc.jit(fn)(v), fn(v)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sign_of_negative_zero_in_a_fused_kernel(dtype):
    """numpy's sign(-0.0) is +0.0 and sign(nan) nan; inside a fused kernel too (Numba's np.sign
    keeps -0.0)."""
    v = np.array([-0.0, 0.0, np.nan, -2.5, 3.0, np.inf, -np.inf], dtype)

    def fn(v):
        return np.sign(v * 2) + v * 0  # one kernel: sign between two elementwise ops

    jitted = graphc.jit(fn)
    got, want = quiet(jitted, v), quiet(fn, v)
    assert jitted.compile(v).stats()["fused_kernels"] == 1
    assert_identical(got, want, "sign in a kernel")
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_squeeze_axis_of_a_0d_array():
    z = np.array(1.0)
    check_batch(
        "squeeze", [lambda z: np.squeeze(z, 0), lambda z: np.squeeze(z, -1), lambda z: np.squeeze(z, (0,))], (z,)
    )


def test_scans_and_argsort_of_a_0d_array_along_axis_0():
    """numpy's cumsum, cumprod and argsort (functions and methods) take axis 0 or -1 of a 0-d array
    and ravel it (a result of shape (1,)); np.sort raises numpy's AxisError there, and all of them
    for axis 1 or -2 (found by tests/fuzz)."""
    z = np.array(-2.5)
    fns = [
        lambda z, fn=fn, ax=ax: fn(z, axis=ax)
        for fn in (np.cumsum, np.cumprod, np.argsort, np.sort)
        for ax in (0, -1, 1, -2)
    ]
    fns += [lambda z: z.cumsum(axis=0), lambda z: z.cumprod(axis=-1), lambda z: z.argsort(axis=0)]
    check_batch("0-d scans and sorts", fns, (z,))


def test_writes_numpy_refuses():
    """numpy refuses a write into a numpy scalar (``np.add.at``, ``out=``), an array of 1 or more
    dims into one element (``y[0] = v[:1]``, also through a traced index or ``+=``), and a 2-d
    value through a boolean mask over every dim (of a 0-d array, True or False); graphc raised
    nothing and wrote (found by tests/fuzz). A 0-d view (``y[0, ...]``) and a mask over fewer dims take such values."""
    x = np.array([1.0, 2.0, 3.0])
    mask = np.array([True, False, True])

    def scalar_at(x):
        s = np.sum(x)
        np.add.at(s, (), 1.0)
        return s

    def scalar_out(x):
        s = x[0].copy()
        np.negative(x[1], out=s)
        return s

    def element(x):
        y = x.copy()
        y[0] = x[1:2]
        return y

    def element_add(x):
        y = x.copy()
        y[-1] += x[1:2]
        return y

    def traced_element(x, i):
        y = x.copy()
        y[i] = x[1:2]
        return y

    def masked_2d(x):
        y = x.copy()
        y[mask] = x[None, :2]
        return y

    def masked_traced_2d(x):
        y = x.copy()
        y[x > 1.5] = x[None, :2]
        return y

    def masked_0d_2d(x):  # True or False as the whole key of a 0-d array: a 0-d mask (found by the long fuzz run)
        y = x[:1].reshape(()).copy()
        y[True] = x[None, :1]
        return y

    def masked_0d_array_3d(x):
        y = x[:1].reshape(()).copy()
        y[np.array(False)] = x[None, None, :1]
        return y

    for fn, args in (
        (scalar_at, (x,)),
        (scalar_out, (x,)),
        (element, (x,)),
        (element_add, (x,)),
        (traced_element, (x, np.array(0))),
        (masked_2d, (x,)),
        (masked_traced_2d, (x,)),
        (masked_0d_2d, (x,)),
        (masked_0d_array_3d, (x,)),
    ):
        with pytest.raises((TypeError, ValueError)) as want:
            fn(*args)
        with pytest.raises(type(want.value)) as got:
            graphc.jit(fn)(*args)
        assert isinstance(got.value, TraceError), fn.__name__

    def allowed(x):
        y = x.reshape(1, 3).copy()
        y[0, ...] = x[None, :]  # a row of shape (3,) takes (1, 3): numpy drops the leading dim
        z = x.copy()
        z[0, ...] = x[1:2]  # a 0-d view takes (1,)
        s = x[:1].reshape(()).copy()
        s[True] = x[1:2]  # a 0-d mask takes (1,)
        return y, z, s

    check_batch("allowed writes", [allowed], (x,))


def test_a_bool_element_takes_an_array_of_one_element():
    """One bool element (``b[()]`` of a 0-d array, ``b[0, 1]``) takes an array of one element of
    any dims and any dtype: numpy stores its truth value (nan is True), where an element of any
    other dtype raises "setting an array element with a sequence"; graphc raised that for bools
    too (found by tests/fuzz). Two elements, or none, still raise."""
    f = np.array([[0.0, np.nan]])
    m = np.array([[False, True]])

    def element(f, m, k, v):
        b = m[0, 1:].reshape(()).copy() if k == () else m.copy()
        b[k] = v
        return b

    fns = [
        lambda f, m, k=k, v=v: element(f, m, k, v(f, m))
        for k in ((), (0, 1), (0, 0))
        for v in (
            lambda f, m: f[:, :1],  # 0.0 of shape (1, 1): False
            lambda f, m: f[0, 1:],  # nan of shape (1,): True
            lambda f, m: m[:, 1],  # True of shape (1,)
            lambda f, m: m[0, :0],  # no element: raises
            lambda f, m: f[0],  # two elements: raises
            lambda f, m: f[:, 1:] > 1,  # a traced bool of shape (1, 1)
        )
    ]

    def added(f, m):
        b = m.copy()
        b[0, 0] += m[:, 1]  # bool + bool array of one element: a (1,) array into one element
        return b

    def float_element(f, m):
        g = f.copy()
        g[0, 0] = f[0, :1]  # not a bool: raises
        return g

    check_batch("a bool element", [*fns, added, float_element], (f, m))


def test_std_at_zero_has_gradient_zero():
    """np.std is 0 where all its elements are equal (or there is one): its minimum, where sqrt's
    derivative at 0 made the gradient nan (as JAX's; found by tests/fuzz: a std over one element,
    and over ``np.concatenate([x, x])``); 0 is the derivative along every direction that keeps
    them equal, which is all finite differences can see there. Values and dtypes stay numpy's
    (nan for inf and nan, ddof beyond the count), and away from 0 the gradient is sqrt's."""
    x = np.array([[1.5, -2.0, np.inf, np.nan, -0.0]])
    fns = [
        lambda x, kw=kw: np.std(x, **kw)
        for kw in (dict(axis=0), dict(axis=(0,), keepdims=True), dict(axis=0, dtype=np.float32), dict(axis=0, ddof=1))
    ]
    fns += [lambda x: x[0, :1].std(), lambda x: np.std(x[0, 0]), lambda x: np.std((x[:, :2] > 0), axis=0)]
    fns += [lambda x: np.std(np.concatenate([x[0, :2], x[0, :2]]).reshape(2, 2), axis=0, ddof=3)]
    check_batch("std of one element", fns, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for fn in (
            lambda x: np.sum(np.std(x, axis=0) * 3.0),
            lambda x: np.std(x[0, 1]) + np.std(x[:, :2], axis=0)[1],
            lambda x: np.std(np.concatenate([x[0, :1], x[0, :1]])) + np.std(np.repeat(x, 3, axis=0), axis=0)[0],
        ):
            g = graphc.grad(fn)(x[:, :2])
            np.testing.assert_array_equal(g, np.zeros((1, 2)))
    y = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(graphc.grad(np.std)(y), (y - y.mean()) / (y.size * np.std(y)), rtol=1e-15)


def test_an_advanced_assignment_reshapes_the_value_to_its_last_dims():
    """numpy's assignment through an advanced key (index arrays, a boolean mask over fewer dims
    than the array's) reshapes a value of more dims than the selection to its last dims: leading
    dims of size 1 go, and so do any leading dims of an empty value whose last dims are empty
    (``y[mask] = v`` of shape (2, 1, 0) into a selection of shape (1, 0)); a basic key only drops
    leading dims of size 1. graphc raised for the empty ones (found by the long fuzz run)."""
    mask = np.array([[False], [True]])

    def write(key, vshape, traced_key=False):
        def fn(x, idx):
            y = x.copy()
            y[(idx,) if traced_key else key] = np.ones(vshape) * x.sum()
            return y

        return fn

    fns = [
        write(key, vshape)
        for key in ((mask,), ([1],), (slice(1, 2),), (1,))
        for vshape in ((2, 1, 0), (5, 1, 0), (2, 0, 0), (0, 2, 0), (1, 1, 0), (3, 0), (1, 0))
    ]
    fns += [write(None, vshape, traced_key=True) for vshape in ((2, 1, 1, 0), (3, 1, 1, 0), (2, 0, 1, 0))]
    check_batch("advanced assignment of empty values", fns, (np.zeros((2, 1, 0)), np.array([1])))
    full = [write(key, vshape) for key in ((mask,), ([1],)) for vshape in ((2, 1, 3), (1, 1, 3), (3,))]
    check_batch("advanced assignment", full, (np.arange(6.0).reshape(2, 1, 3), np.array([1])))


# --- numpy's errors are GraphcErrors ------------------------------------------------------------------


def test_numpy_errors_keep_their_class_and_become_graphc_errors():
    """While tracing (a Python int out of the array's range, an axis out of range) and while
    running (an integer to a negative power), numpy's exception is raised as an instance of both
    its own class and GraphcError, naming the user's line when tracing."""
    i8 = np.array([1, 2], np.int8)
    with pytest.raises(OverflowError) as info:
        graphc.trace(lambda x: x + 300, i8)
    assert isinstance(info.value, TraceError) and "test_numpy_semantics.py" in str(info.value)
    with pytest.raises(np.exceptions.AxisError) as info:
        graphc.trace(lambda x: np.sum(x, axis=2), i8)
    assert isinstance(info.value, GraphcError) and info.value.axis == 2
    with pytest.raises(ValueError, match="negative integer powers") as info:
        graphc.jit(lambda x, y: x**y)(i8, np.array([1, -1], np.int8))
    assert isinstance(info.value, GraphcError)
    with pytest.raises(ValueError, match="negative integer powers") as info:
        run_graphc(lambda x, y: x**y, i8, np.array([1, -1], np.int8))
    assert isinstance(info.value, GraphcError)
    with pytest.raises(TypeError) as info:  # numpy: no loop for bool
        graphc.trace(lambda x: +x, np.array([True]))
    assert isinstance(info.value, GraphcError)
    with pytest.raises(TraceError):  # shifts: not supported, and never a bare TypeError
        graphc.trace(lambda x: x << 1, i8)


def _numbers(x):
    y = x * 0.5 + x * 0.5  # one float32 0.5
    z = y * -0.0 + y * 0.0  # -0.0 and 0.0: other bits, two numbers
    w = (x.astype(np.float64) * 0.5).astype(np.float32)  # a float64 0.5: another number
    return z + 2 * y + 2 * w + np.float32(0.5) * x


def test_equal_numbers_share_one_constant_node():
    """The numbers a function uses are constants; equal ones (the same dtype and bits) are one
    node, as CSE would make them later (a deep model repeats a few numbers in every layer: Adam's
    b1, b2, lr, eps per parameter), and the function computes what numpy computes."""
    x = np.array([[1.5, -2.0, 0.0], [4.0, -0.0, 3.0]], np.float32)
    graph = graphc.trace(_numbers, x)
    numbers = [(n.attrs["value"].dtype, n.attrs["value"].tobytes()) for n in graph.nodes if n.op.name == "constant"]
    assert len(numbers) == len(set(numbers))
    half = np.array(0.5, np.float32).tobytes()
    assert (np.dtype(np.float32), half) in numbers and (np.dtype(np.float64), np.array(0.5).tobytes()) in numbers
    assert {b for d, b in numbers if d == np.float32} >= {np.array(-0.0, np.float32).tobytes(), bytes(4)}
    got, want = graphc.jit(_numbers)(x), _numbers(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
