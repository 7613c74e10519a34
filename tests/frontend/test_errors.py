"""Every error path of the frontend names the user's file:line and says what was expected."""

import types

import numpy as np
import pytest

import graphc
from tests.helpers import line_of

THIS_FILE = "tests/frontend/test_errors.py"


def trace_error(fn, *args, **kwargs) -> graphc.TraceError:
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(fn, *args, **kwargs)
    return info.value


def check_location(err: graphc.TraceError, marker: str):
    line = line_of(marker)
    assert err.lineno == line, str(err)
    assert err.filename.endswith("test_errors.py")
    assert str(err).startswith(f"{err.filename}:{line}: ")


X = np.ones((3, 4), np.float32)


def test_unsupported_numpy_function_names_it_and_the_line():
    def f(x):
        y = x * 2
        return np.fft.rfft(y, axis=0)  # <unsupported>

    err = trace_error(f, X)
    check_location(err, "<unsupported>")
    assert "numpy.fft.rfft is not supported" in str(err)


def test_unsupported_ufunc_names_it():
    def f(x):
        return np.arctan2(x, x)  # <ufunc>

    err = trace_error(f, X)
    check_location(err, "<ufunc>")
    assert "numpy.arctan2 is not supported" in str(err)


def test_unsupported_scipy_ufunc_names_scipys_module():
    """scipy's ufuncs are numpy ufuncs; the error names the library the call is to (issue 32 item 5)."""
    special = pytest.importorskip("scipy.special")  # a test-only dependency

    def f(x):
        return special.gammaln(x + 1)  # <gammaln>

    def g(x):
        return special.cbrt(x)  # <cbrt> (numpy has a cbrt too)

    def h(x):
        return np.sum(special.expit(x, where=x > 0))  # <where> (expit is supported, where= is not)

    for fn, marker, text in [
        (f, "<gammaln>", "scipy.special.gammaln is not supported by graphc"),
        (g, "<cbrt>", "scipy.special.cbrt is not supported by graphc"),
        (h, "<where>", "scipy.special.expit: unsupported arguments ['where']"),
    ]:
        err = trace_error(fn, X)
        check_location(err, marker)
        assert text in str(err) and "numpy." not in str(err), str(err)
    err = trace_error(lambda x: special.xlogy.reduce(x), X)
    assert "scipy.special.xlogy.reduce is not supported" in str(err), str(err)


def test_shape_mismatch_in_matmul_names_the_line():
    def f(x, w):
        h = x @ w  # <matmul>
        return h

    err = trace_error(f, X, np.ones((5, 2), np.float32))
    check_location(err, "<matmul>")
    assert "shapes (3, 4) and (5, 2) not aligned" in str(err)


def test_broadcast_mismatch_names_the_line():
    def f(x):
        return x + np.ones(5)  # <broadcast>

    err = trace_error(f, X)
    check_location(err, "<broadcast>")
    assert "could not be broadcast together with shapes (3, 4) (5,)" in str(err)


def test_shape_error_deep_in_user_helpers_points_at_the_helper_line():
    def helper(a):
        return a.reshape(7, -1)  # <helper>

    def f(x):
        return helper(x) * 2

    err = trace_error(f, X)
    check_location(err, "<helper>")
    assert "cannot reshape array of size 12 into shape (7, -1)" in str(err)


def test_return_inside_traced_if():
    def f(x):
        if x.sum() > 0:
            return x  # <return>
        return -x

    err = trace_error(f, X)
    check_location(err, "<return>")
    assert "`return` inside an if/while whose condition is a traced value is not supported" in str(err)


def test_float_of_traced_value():
    def f(x):
        return float(x.mean())  # <float>

    err = trace_error(f, X)
    check_location(err, "<float>")
    assert "float() of a traced array" in str(err)


def test_in_place_assignment_into_a_broadcast_view_is_rejected():
    def f(x):
        row = np.broadcast_to(x[0], (3, 4))
        row[1] = 1.0  # <setitem>
        return x

    err = trace_error(f, X)
    check_location(err, "<setitem>")
    assert "assignment destination is read-only" in str(err)


def test_traced_bool_mask_index_is_rejected():
    def f(x):
        return x[x > 0]  # <mask>

    err = trace_error(f, X)
    check_location(err, "<mask>")
    assert "data-dependent shape" in str(err)


def test_static_index_out_of_bounds():
    def f(x):
        return x[:, 9]  # <oob>

    err = trace_error(f, X)
    check_location(err, "<oob>")
    assert "index 9 is out of bounds for axis 1 with size 4" in str(err)


def test_one_argument_where():
    def f(x):
        return np.where(x > 0)  # <where1>

    err = trace_error(f, X)
    check_location(err, "<where1>")
    assert "three-argument form" in str(err)


def test_complex_dtype_argument():
    err = trace_error(lambda z: z * 2, np.ones(3, np.complex64))
    assert "dtype complex64 is not supported" in str(err)
    assert "argument z" in str(err)


def test_unsupported_argument_type():
    class Config:  # no __dict__ and not registered: not a pytree (an object with a __dict__ is one)
        __slots__ = ()

    err = trace_error(lambda x, cfg: x, X, Config())
    assert "has type Config" in str(err)


def test_tracer_leaking_between_traces():
    leaked = []

    def first(x):  # <store>
        leaked.append(x * 2)
        return x

    err = trace_error(first, X)  # a list it reads from its closure: refused, and put back
    check_location(err, "<store>")
    assert "stores a traced value in the global or closure variable 'leaked'" in str(err) and leaked == []
    box = types.SimpleNamespace()  # (an object of another module: not looked into)

    def first_into_box(x):
        box.v = x * 2
        return x

    def second(x):
        return x + box.v  # <leak>

    graphc.trace(first_into_box, X)
    err = trace_error(second, X)
    check_location(err, "<leak>")
    assert "another trace" in str(err)


def test_int_overflow_of_python_scalar_matches_numpy():
    def f(a):
        return a + 300  # <overflow>

    with pytest.raises(OverflowError):
        f(np.ones(3, np.int8))
    with pytest.raises(OverflowError):
        graphc.trace(f, np.ones(3, np.int8))


def test_evaluate_rejects_mismatched_arguments():
    g = graphc.trace(lambda p, x: p["w"] @ x, {"w": np.ones((2, 3))}, np.ones(3))
    with pytest.raises(graphc.EvaluationError, match=r"input %p.w expects f64\[2,3\], got array of shape \(3, 3\)"):
        graphc.evaluate(g, {"w": np.ones((3, 3))}, np.ones(3))
    with pytest.raises(
        graphc.EvaluationError, match=r"arguments\[0\]\[0\]: expected a dict with keys \['w'\], got \['v'\]"
    ):
        graphc.evaluate(g, {"v": np.ones((2, 3))}, np.ones(3))
    with pytest.raises(graphc.EvaluationError, match="expected a tuple of length 2"):
        graphc.evaluate(g, {"w": np.ones((2, 3))})


def test_in_place_update_cannot_change_the_shape():
    def f(a, b):
        a += b  # <iadd-shape>
        return a

    err = trace_error(f, np.ones(3), np.ones((2, 3)))
    check_location(err, "<iadd-shape>")
    assert "non-broadcastable output operand with shape (3,)" in str(err)


def test_pins_that_split_tied_state_two_ways_are_a_plan_error():
    f = graphc.parallelize(lambda a: a * 2, mesh="tp=2", in_specs="[S(1)]", out_specs="[S(0)]", cache=False)
    with pytest.raises(graphc.PlanError, match=r"need one spec, but the pins allow \[S\(1\)\] for the input"):
        f.plan(np.ones((4, 4), np.float32))
