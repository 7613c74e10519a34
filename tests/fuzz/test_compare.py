"""The fuzz targets' oracle catches what it is for: runners that are wrong on purpose (results that
alias the inputs or each other, inputs written, results reused by the next call, values off by
one ulp where the program is exact) fail ``check_runner``; numpy itself passes it; and the
finite-difference and duplicate-index oracles of the gradient targets agree with hand
derivations."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from graphc.ops.registry import REGISTRY as OPS
from tests.fuzz.compare import check_runner
from tests.fuzz.magnitudes import absolute_jvp
from tests.fuzz.steps import Const, run_program
from tests.fuzz.test_numpy_grad import check_jvp_and_vjp, expected_gradients, finite_difference_check

X = np.array([1.0, -2.0, 3.0])
DOUBLE = (("operator", ("*",), (0, Const(2)), ()),)  # x * 2
PROGRAM = (DOUBLE, (1,), (X,))
TWICE = (DOUBLE, (1, 1), (X,))  # numpy: one array, returned twice


def numpy_runner(program):
    steps, outputs, _inputs = program
    return functools.partial(run_program, steps, outputs)


def test_numpy_passes():
    assert check_runner(numpy_runner(PROGRAM), PROGRAM, "numpy")
    assert check_runner(numpy_runner(TWICE), TWICE, "numpy")


def test_a_result_aliasing_an_input_fails():
    def aliasing(x):
        x *= 2  # (writes the caller's array: numpy's result, in the input's memory)
        return (x,)

    with pytest.raises(AssertionError, match="shares memory with input 0"):
        check_runner(aliasing, PROGRAM, "aliasing")


def test_one_array_for_two_results_fails():
    program = ((*DOUBLE, ("operator", ("*",), (0, Const(2)), ())), (1, 2), (X,))  # two arrays in numpy

    def twice(x):
        y = x * 2
        return y, y

    with pytest.raises(AssertionError, match="results 0 and 1 share memory"):
        check_runner(twice, program, "twice")


def test_a_result_reused_by_the_next_call_fails():
    cache: dict = {}

    def reusing(x):
        out = cache.setdefault("out", np.empty_like(x))
        np.multiply(x, 2, out=out)
        return (out,)

    with pytest.raises(AssertionError, match="two calls share memory"):
        check_runner(reusing, PROGRAM, "reusing")


def test_a_written_constant_changes_the_next_call():
    constant = X * 2

    def from_a_constant(x):
        return (constant[:],)  # a view of graphc's own constant: a write into it lasts

    with pytest.raises(AssertionError, match="two calls share memory|third call"):
        check_runner(from_a_constant, PROGRAM, "constant")


def test_one_ulp_off_fails_where_the_program_is_exact():
    def off(x):
        return (np.nextafter(x * 2, np.inf),)

    with pytest.raises(AssertionError, match="float values differ"):
        check_runner(off, PROGRAM, "off")


def test_signed_zeros_are_compared():
    program = (DOUBLE, (1,), (np.array([-0.0]),))
    with pytest.raises(AssertionError, match="signed zeros"):
        check_runner(lambda x: (np.abs(x * 2),), program, "abs")


def test_zero_signs_of_rounded_values_only_where_asked():
    """The parallel targets do not compare the sign of a zero in a value a rounding step made (a
    sum carried as partial sums through a product); the sign of an exact zero they do."""
    summed = ((("reduce", ("sum",), (0,), (None, False, 0)), ("operator", ("*",), (1, Const(0.0)), ())), (2,), (X,))

    def flipped(x):
        return (np.sum(x) * 0.0 * -1.0,)  # numpy's +0.0 as -0.0

    with pytest.raises(AssertionError, match="signed zeros"):
        check_runner(flipped, summed, "flipped")
    assert check_runner(flipped, summed, "flipped", inexact_zero_signs=False)
    exact = (DOUBLE, (1,), (np.array([-0.0]),))
    with pytest.raises(AssertionError, match="signed zeros"):
        check_runner(lambda x: (np.abs(x * 2),), exact, "abs", inexact_zero_signs=False)


def test_finite_differences_skip_kinks_and_catch_wrong_slopes():
    program = ((("ufunc", ("absolute",), (0,), ()), ("ufunc", ("sin",), (0,), ())), (1, 2), (np.array([0.0, 0.5]),))
    right = (np.sign(program[2][0]) + np.cos(program[2][0]),)  # (the kink of abs at 0: skipped)
    assert finite_difference_check(program, right) == 1
    with pytest.raises(AssertionError, match="differs from finite differences"):
        finite_difference_check(program, (right[0] + [0.0, 1e-6],))


def test_duplicate_index_oracle_by_hand():
    x, v, w = np.zeros(3), np.array([5.0, 7.0]), np.array([1.0, 2.0, 3.0])
    # y[[0, 0]] = v: v[1] wins at 0; y[[0, 0]] += v: the same; np.add.at: both count
    assert [g.tolist() for g in expected_gradients("copy", "=", [0, 0], x, v, w)] == [[0, 2, 3], [0, 1]]
    assert [g.tolist() for g in expected_gradients("copy", "+=", [0, 0], x, v, w)] == [[1, 2, 3], [0, 1]]
    assert [g.tolist() for g in expected_gradients("zeros", "add.at", [0, 0], x, v, w)] == [[0, 0, 0], [1, 1]]
    assert [g.tolist() for g in expected_gradients("copy", "subtract.at", [2], x, v[:1], w)] == [[1, 2, 3], [-3]]


# --- the jvp/vjp identity -------------------------------------------------------------------------

STACK_MINUS = (("stack", (0,), (0, 0), ()), ("operator", ("-",), (1, 0), ()))  # np.stack([x, x]) - x


def test_jvp_vjp_bound_holds_where_the_result_cancels():
    """Class 27 of docs/fuzzing_numpy.md: ``np.stack([x, x]) - x`` is 0 for every x; its jvp is
    ``v - v``, exactly 0, while the vjp's ``(u0 + u1) - (u0 + u1)``, summed in two orders, is not.
    A bound taken from the results (0) failed; the chain rule's magnitudes bound it."""
    for x in (np.array([0.3, -1.7, 2.9]), np.array(1.3), np.arange(6.0).reshape(2, 3) / 7):
        check_jvp_and_vjp((STACK_MINUS, (2,), (x,)))


@pytest.mark.parametrize("op", ["sub", "tanh", "mul"])
def test_jvp_vjp_check_catches_a_wrong_vjp_rule(monkeypatch, op):
    """A vjp rule that is wrong on purpose (one term's sign, or a factor 1 + 1e-9) fails the
    identity: the bound is about 1e-13 of the chain rule's magnitudes."""
    rule = OPS[op].vjp

    def wrong(ad, g):
        grads = rule(ad, g)
        if op == "sub":
            return [grads[0], -grads[1]]  # d(x - y)/dy = +1
        return [grads[0] * (1 + 1e-9), *grads[1:]]

    monkeypatch.setattr(OPS[op], "vjp", wrong)
    x = np.array([0.3, -1.7, 2.9])
    programs = {
        "sub": (STACK_MINUS, (2,), (x,)),
        "tanh": ((("ufunc", ("tanh",), (0,), ()),), (1,), (x,)),
        "mul": ((("operator", ("*",), (0, 0), ()),), (1,), (x,)),
    }
    with pytest.raises(AssertionError, match="<vjp"):
        check_jvp_and_vjp(programs[op])


def test_magnitudes_by_hand():
    """|J| |v| of small functions, derived by hand: the terms that cancel count twice."""
    x, v = np.array([0.5, -2.0]), np.array([3.0, -1.0])
    cases = [
        (lambda x: (np.stack([x, x]) - x,), [np.abs(np.stack([v, v])) * 2]),
        (lambda x: (np.sin(x) * x,), [np.abs(np.cos(x)) * np.abs(x) * np.abs(v) + np.abs(np.sin(x)) * np.abs(v)]),
        (lambda x: (np.max(x), x @ x), [np.abs(v[0]), 2 * np.abs(x) @ np.abs(v)]),
    ]
    for fn, want in cases:
        got = absolute_jvp(fn, (x,), (np.abs(v),))
        assert got.eps == np.finfo(np.float64).eps and got.roundings > 0
        for g, w in zip(got.outputs, want):
            np.testing.assert_allclose(g, w, rtol=1e-15)
