"""The source transform (graphc/frontend/autograph.py), part of tests/autograph_checks.py's
differential checks against plain Python: What cannot become graph control flow is a TraceError at the user's line; gradients through traced branches and counted loops.

Tests marked ``xfail(strict=True, reason="graphc gap: ...")`` document behaviour that differs from
Python; they are correct tests that graphc does not pass yet."""

import numpy as np
import pytest

import graphc
from tests.autograph_checks import (
    X,
    check,
    check_static,
    ops_of,
    trace_error,
)
from tests.helpers import assert_same_pytree, line_of, numeric_grad
from tests.test_autograph_traced import Gate

# =================================================================================================
# Errors: TraceError at the user's line
# =================================================================================================


def return_in_traced_if(x):
    if x.sum() > 0:
        return x * 2  # <return-in-if>
    return x


def return_in_traced_helper(x):
    return clip_early(x) + 1


def clip_early(v):
    if np.abs(v).max() > 1.0:
        return v / np.abs(v).max()  # <return-in-helper>
    return v


def break_in_traced_while(x):
    while x.sum() < 10.0:
        x = x + 1.0
        if x.max() > 2.0:
            break  # <break-in-while>
    return x


def continue_in_traced_while(x):
    while x.sum() < 10.0:
        x = x + 1.0
        if x[0] > 3:
            continue  # <continue-in-while>
        x = x * 2
    return x


def break_in_traced_range(x, n):
    for i in range(n):  # <break-in-range>
        x = x + 1
        if i > 3:
            break
    return x


def continue_in_traced_range(x, n):
    for i in range(n):  # <continue-in-range>
        if i == 1:
            continue
        x = x + 1
    return x


def return_in_traced_while(x):
    while x.sum() < 10:
        x = x + 1
        return x  # <return-in-while>
    return x


@pytest.mark.parametrize(
    "fn, args, marker, kind",
    [
        (return_in_traced_if, (X,), "<return-in-if>", "return"),
        (return_in_traced_helper, (X,), "<return-in-helper>", "return"),
        (break_in_traced_while, (X,), "<break-in-while>", "break"),
        (continue_in_traced_while, (X,), "<continue-in-while>", "continue"),
        (return_in_traced_while, (X,), "<return-in-while>", "return"),
        (break_in_traced_range, (X, np.int64(5)), "<break-in-range>", "break"),
        (continue_in_traced_range, (X, np.int64(5)), "<continue-in-range>", "continue"),
    ],
)
def test_return_break_continue_in_traced_control_flow(fn, args, marker, kind):
    err = trace_error(fn, *args)
    assert err.lineno == line_of(marker)
    assert f"`{kind}`" in str(err)


def test_same_functions_run_with_static_conditions():
    """The functions of the error tests are fine when their conditions are static."""
    assert_same_pytree(graphc.evaluate(graphc.trace(break_in_traced_range, X, 6), X, 6), break_in_traced_range(X, 6))
    graph = graphc.trace(continue_in_traced_range, X, 3)
    assert_same_pytree(graphc.evaluate(graph, X, 3), continue_in_traced_range(X, 3))


def shape_differs(x):
    s = x.sum()
    if s > 1:
        y = x
    elif s > 0:  # <shape-elif>
        y = x[:2]
    else:
        y = x
    return y


def dtype_differs(x):
    if x.sum() > 0:  # <dtype-if>
        y = x
    else:
        y = x.astype(np.float32)
    return y


def ifexp_shape_differs(x):
    return x if x.sum() > 0 else x[:2]  # <ifexp-shape>


def one_branch_only(x):
    if x.sum() > 0:  # <one-branch-only>
        z = x * 2  # noqa: F841
    else:
        x = x - 1
    return x


def test_branch_shape_and_dtype_mismatch():
    err = trace_error(shape_differs, X)
    assert err.lineno == line_of("<shape-elif>")
    assert "variable 'y'" in str(err) and "f64[2]" in str(err) and "f64[3]" in str(err)
    err = trace_error(dtype_differs, X)
    assert err.lineno == line_of("<dtype-if>")
    assert "variable 'y'" in str(err) and "f32[3]" in str(err)
    err = trace_error(ifexp_shape_differs, X)
    assert err.lineno == line_of("<ifexp-shape>")


def test_variable_assigned_in_only_one_branch():
    err = trace_error(one_branch_only, X)
    assert err.lineno == line_of("<one-branch-only>")
    assert "variable 'z' is assigned in only one branch" in str(err)


def grows_in_while(x):
    while x.sum() < 100.0:  # <grow-while>
        x = np.concatenate([x, x])
    return x


def dtype_change_in_range(x, n):
    acc = np.zeros(3, np.float32)
    for _ in range(n):  # <dtype-range>
        acc = acc + x
    return acc


def first_assigned_in_loop(x):
    while x.sum() < 10:  # <first-in-loop>
        x = x + 1
        z = x * 2
    return z


def test_loop_variable_changing_shape_or_dtype():
    err = trace_error(grows_in_while, X)
    assert err.lineno == line_of("<grow-while>")
    assert "loop variable x is f64[3] before an iteration and f64[6] after it" in str(err)
    err = trace_error(dtype_change_in_range, X, np.int64(3))
    assert err.lineno == line_of("<dtype-range>")
    assert "loop variable acc is f32[3] before an iteration and f64[3] after it" in str(err)
    err = trace_error(first_assigned_in_loop, X)
    assert err.lineno == line_of("<first-in-loop>")
    assert "variable 'z' is only assigned inside the body of a loop on a traced value" in str(err)


def attribute_in_traced_if(x):
    state = Gate(0.0)
    if x.sum() > 0:  # <attr-if>
        state.threshold = x.sum()
    return x


def test_attribute_assignment_in_traced_if():
    err = trace_error(attribute_in_traced_if, X)
    assert err.lineno == line_of("<attr-if>")
    assert "attribute" in str(err)


def traced_trip_count_loss(x, n):
    for _ in range(n):  # <grad-traced-range>
        x = np.tanh(x * 1.1)
    return np.sum(x)


def test_reverse_mode_through_traced_range_suggests_bounded_loop():
    with pytest.raises(graphc.TraceError, match="bounded loop") as info:
        graphc.grad(traced_trip_count_loss)(X, np.int64(3))
    assert info.value.lineno == line_of("<grad-traced-range>")


def _exec_function(source: str):
    namespace = {"np": np}
    exec(source, namespace)  # noqa: S102
    return namespace["f"]


@pytest.mark.parametrize(
    "source, line",
    [
        ("def f(x):\n    y = x * 2\n    if y.sum() > 0:\n        y = -y\n    return y\n", 3),
        ("def f(x):\n    while x.sum() < 10:\n        x = x + 1\n    return x\n", 2),
        ("def f(x):\n    return x if x.sum() > 0 else -x\n", 2),
    ],
)
def test_function_without_source_says_source_could_not_be_read(source, line):
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(_exec_function(source), X)
    assert info.value.lineno == line
    assert "source could not be read" in str(info.value)


def test_function_without_source_falls_back_to_plain_tracing():
    f = _exec_function("def f(x, n=2):\n    for i in range(n):\n        x = np.tanh(x) + i\n    return x\n")
    check_static(f, X)
    check_static(f, X, n=0)


# =================================================================================================
# Gradients through traced branches and counted loops
# =================================================================================================


class BranchyNet:
    def __init__(self, w):
        self.w = w

    def __call__(self, x):
        h = np.tanh(x * self.w)
        s = h.sum()
        if s > 0.5:
            out = h * s
        elif s > -0.5:
            out = np.sin(h) + x
        else:
            out = h**3
        return out


def branchy_loss(x):
    y = BranchyNet(np.array([1.0, 2.0, 0.5]))(x)
    z = y * 2.0 if y.sum() > 0 else y * y
    return np.sum(z * z)


def counted_loss(x):
    def body(i, h, c):
        if (h * c).sum() > 0:
            h = np.tanh(h * 1.3 + 0.1 * i)
        else:
            h = np.sin(h) - 0.2
        return [h, c * 0.9]

    h, c = graphc.fori_loop(0, 5, body, [x, x + 1.0])
    return np.sum(h * c)


def unrolled_loss(x, n=4):
    for i in range(n):  # Python int bound: unrolled
        x = np.tanh(x * 1.5 + 0.1 * i) if x.sum() > 0 else np.sin(x)
    return np.sum(x * x)


GRAD_POINTS = [
    np.array([2.0, 1.0, 0.5]),
    np.array([0.3, -0.8, 0.5]),
    np.array([-2.0, -1.0, -0.5]),
    np.array([-0.3, 0.8, -0.5]),
]


@pytest.mark.parametrize(
    "loss, x",
    [(loss, x) for loss in (branchy_loss, counted_loss) for x in GRAD_POINTS]
    + [(unrolled_loss, np.array([0.3, -0.2, 0.5])), (unrolled_loss, np.array([-0.3, 0.2, -0.5]))],
)
def test_grad_matches_finite_differences(loss, x):
    np.testing.assert_allclose(graphc.grad(loss)(x), numeric_grad(loss, x), rtol=1e-5, atol=1e-8)
    v = np.array([1.0, -0.5, 0.25])
    _, t = graphc.jvp(loss, (x,), (v,))
    assert float(t) == pytest.approx(float(numeric_grad(loss, x) @ v), rel=1e-5, abs=1e-8)


def test_grad_points_take_every_branch():
    sums = [np.tanh(x * np.array([1.0, 2.0, 0.5])).sum() for x in GRAD_POINTS]
    assert any(s > 0.5 for s in sums) and any(-0.5 < s <= 0.5 for s in sums) and any(s <= -0.5 for s in sums)


def two_branch_loss(x):
    h = np.tanh(x * np.array([1.0, 2.0, 0.5]))
    if h.sum() > 0.5:
        out = h * h.sum()
    else:
        out = np.sin(h) + x
    return np.sum(out * out)


def value_and_grad_step(x):
    loss, g = graphc.value_and_grad(two_branch_loss)(x)
    if loss > 1.0:  # a traced if on the loss, in the same trace
        g = g / loss
    return loss, g


@pytest.mark.parametrize("x", GRAD_POINTS)
def test_grad_of_traced_branches_inside_a_trace(x):
    graph = check(value_and_grad_step, x)
    assert "cond" in ops_of(graph)
    graph = graphc.trace(value_and_grad_step, GRAD_POINTS[0])
    assert_same_pytree(graphc.evaluate(graph, x), value_and_grad_step(x))


def grad_of_elif_step(x):
    return graphc.grad(branchy_loss)(x)


def test_grad_of_nested_traced_ifs_inside_a_trace():
    for x in GRAD_POINTS:
        check(grad_of_elif_step, x)
