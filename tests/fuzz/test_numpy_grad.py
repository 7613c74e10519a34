"""Differential fuzzing of graphc's derivatives against oracles that do not use graphc's rules.

The programs (tests/fuzz/programs.py, flavor ``GRAD``): float64 inputs of moderate finite values
and the steps that have derivatives almost everywhere (kinks and jumps are found and skipped).

- ``graphc.grad`` of the sum of all float outputs, with respect to every input, equals central
  finite differences computed with numpy (``finite_difference_check``).
- Forward and reverse mode agree: ``<vjp(u), v> == <u, jvp(v)>`` for random u and v, up to the
  rounding of both sides (``test_jvp_and_vjp_agree``).
- Writes through duplicate indices, exactly: with ``y[idx] = v`` (and ``+=``) the last write of
  each index wins, so only its element of ``v`` gets a derivative (1 per use), the earlier
  duplicates 0; ``np.add.at`` / ``np.subtract.at`` count every duplicate (``duplicate_writes``).
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import graphc
from graphc.core.errors import GraphcError
from tests.fuzz.compare import assert_matches, check_same, documented_rejection, exactness
from tests.fuzz.magnitudes import absolute_jvp
from tests.fuzz.programs import GRAD, describe, programs, quietly
from tests.fuzz.steps import op_write, run_program
from tests.helpers import fuzz_settings

pytestmark = pytest.mark.fuzz

EPS = float(np.finfo(np.float64).eps)
STEP = 1e-5  # finite-difference step, relative to max(1, |x|)
KINK = 1e-3  # one-sided slopes (or two step sizes) further apart than this, relative: a kink or a jump


def _float_outputs(program: tuple) -> list[int]:
    """The positions of the outputs numpy computes as floats."""
    steps, outputs, inputs = program
    values = quietly(run_program, steps, outputs, *inputs)
    return [k for k, v in enumerate(values) if np.result_type(v).kind == "f"]


def _loss(program: tuple, floats: list[int]):
    """The sum of all float outputs, as a function of the inputs (numpy code graphc can trace)."""
    steps, outputs, _inputs = program

    def loss(*xs):
        values = run_program(steps, outputs, *xs)
        total = np.float64(0.0)
        for k in floats:
            total = total + np.sum(values[k])
        return total

    return loss


def _rounding_scale(program: tuple, floats: list[int]) -> float:
    """A bound on the magnitudes the loss is computed from: per float output, the largest magnitude
    in its history (compare.Exactness.scale) times its number of elements, summed."""
    steps, outputs, inputs = program
    info = exactness(steps, outputs, inputs)
    values = quietly(run_program, steps, outputs, *inputs)
    return sum(info[k].scale * max(1, np.size(values[k])) for k in floats)


def finite_difference_check(program: tuple, grads: tuple) -> int:
    """Compares ``grads`` (graphc's, one per input) with central differences of the loss computed by
    numpy at steps h and h/2, coordinate by coordinate; returns how many were compared.

    A coordinate is skipped where the loss or a difference is not finite, or where the one-sided
    slopes (or the two central differences) differ by more than ``KINK`` relative: a kink (abs,
    max, sort, clip at a bound) or a jump (a branch, a comparison) lies within h. Elsewhere the
    Richardson combination ``(4 d(h/2) - d(h)) / 3`` has truncation error far below
    ``|d(h) - d(h/2)|``, and each difference's rounding error is below ``eps * F / h`` per
    evaluation, F bounding the magnitudes the loss is summed from (``_rounding_scale``)."""
    steps, outputs, inputs = program
    floats = _float_outputs(program)
    loss = _loss(program, floats)
    where = describe(*program)

    def f(j: int, idx: tuple, value: float) -> float:
        xs = [x.copy() for x in inputs]
        xs[j][idx] = value
        return float(quietly(loss, *xs))

    noise_scale = _rounding_scale(program, floats)
    compared = 0
    for j, x in enumerate(inputs):
        g = np.asarray(grads[j])
        assert (g.shape, g.dtype) == (x.shape, x.dtype), f"gradient {j} is {g.dtype}{g.shape}\n{where}"
        for idx in np.ndindex(x.shape):
            x0 = float(x[idx])
            h = STEP * max(1.0, abs(x0))
            f0, fp1, fm1, fp2, fm2 = (f(j, idx, x0 + d) for d in (0.0, h, -h, h / 2, -h / 2))
            if not np.all(np.isfinite([f0, fp1, fm1, fp2, fm2])):
                continue
            d1 = (fp1 - fm1) / ((x0 + h) - (x0 - h))
            d2 = (fp2 - fm2) / ((x0 + h / 2) - (x0 - h / 2))
            right, left = (fp2 - f0) / (h / 2), (f0 - fm2) / (h / 2)
            noise = 8 * EPS * noise_scale / h
            bar = KINK * (1 + abs(d2)) + noise
            if abs(right - left) > bar or abs(d1 - d2) > bar:
                continue
            d = (4 * d2 - d1) / 3
            tol = 2 * abs(d1 - d2) + noise
            assert abs(g[idx] - d) <= tol, (
                f"graphc.grad differs from finite differences: d loss / d input {j}{list(idx)}: graphc "
                f"{g[idx]!r}, finite differences {d!r} (h {h:.3g}: {d1!r}, h/2: {d2!r}; tolerance {tol:.3g})\n{where}"
            )
            compared += 1
    return compared


def _grad_program(program: tuple) -> tuple | None:
    """The program, if it has a float output and numpy computes it: otherwise nothing to check."""
    steps, outputs, inputs = program
    try:
        floats = _float_outputs(program)
    except Exception:
        return None
    return program if floats else None


@given(programs(GRAD))
@fuzz_settings(150)
def test_grad_equals_finite_differences(program):
    assume(_grad_program(program) is not None)
    steps, outputs, inputs = program
    floats = _float_outputs(program)
    loss = _loss(program, floats)
    try:
        grads = quietly(graphc.grad(loss, argnums=tuple(range(len(inputs)))), *inputs)
    except GraphcError as exc:
        if documented_rejection(exc) is None:
            raise AssertionError(f"graphc.grad raised where numpy computes the loss\n{describe(*program)}") from exc
        return
    finite_difference_check(program, grads)


def _random_like(rng: np.random.Generator, x: Any) -> np.ndarray:
    return rng.standard_normal(np.shape(x))


@given(programs(GRAD))
@fuzz_settings(120)
def test_jvp_and_vjp_agree(program):
    assume(_grad_program(program) is not None)
    check_jvp_and_vjp(program)


def check_jvp_and_vjp(program: tuple) -> None:
    """<vjp(u), v> == <u, jvp(v)>: both are u^T J v, J the product of the Jacobians of the
    primitives the program traces to, multiplied from the right by forward mode and from the left
    by reverse mode. Each side's rounding error is below gamma_K A (tests/fuzz/magnitudes.py), where
    A = |u|^T |J_m| ... |J_1| |v| sums the magnitudes of the chain rule's terms (computed from numpy
    and the calculus, not from graphc's rules), K bounds the roundings along any chain of them (the
    rules' and the final inner products'), and gamma_K = K eps / (1 - K eps). The bound cannot be
    taken from the two results: they can cancel (``np.stack([x, x]) - x``: the jvp is exactly 0,
    the vjp adds and subtracts u0 + u1 in two orders). A wrong rule is off by a share of the terms
    it makes, far above gamma_K A unless its terms are negligible in A.
    Both modes' primal outputs must equal numpy's."""
    steps, outputs, inputs = program
    floats = _float_outputs(program)
    want = quietly(run_program, steps, outputs, *inputs)
    if not all(np.all(np.isfinite(want[k])) for k in floats):
        return
    where = describe(*program)

    def fn(*xs):
        values = run_program(steps, outputs, *xs)
        return tuple(values[k] for k in floats)

    rng = np.random.default_rng(zlib.crc32(where.encode()))  # (u and v: random, but reproducible)
    u = tuple(_random_like(rng, want[k]) for k in floats)
    v = tuple(_random_like(rng, x) for x in inputs)
    try:
        out_f, jv = quietly(graphc.jvp, fn, inputs, v)
        out_r, pullback = quietly(graphc.vjp, fn, *inputs)
        uv = quietly(pullback, u)
    except GraphcError as exc:
        if documented_rejection(exc) is None:
            raise AssertionError(f"graphc.jvp / vjp raised where numpy computes the function\n{where}") from exc
        return
    exact = [exactness(steps, outputs, inputs)[k] for k in floats]
    assert_matches(out_f, tuple(want[k] for k in floats), where + "\n(jvp's primal output)", exact)
    assert_matches(out_r, tuple(want[k] for k in floats), where + "\n(vjp's primal output)", exact)
    jv = [np.asarray(t, np.float64) for t in jv]
    uv = [np.asarray(t, np.float64) for t in uv]
    if not all(np.all(np.isfinite(t)) for t in jv + uv):
        return
    lhs = sum(float(np.sum(a * b)) for a, b in zip(uv, v))
    rhs = sum(float(np.sum(a * b)) for a, b in zip(u, jv))
    chain = quietly(absolute_jvp, fn, inputs, [np.abs(t) for t in v])
    absolute = sum(float(np.sum(np.abs(a) * b)) for a, b in zip(u, chain.outputs))
    if not np.isfinite(absolute):  # (an infinite partial derivative on a path whose tangent is 0: no bound)
        return
    roundings = chain.roundings + sum(np.size(t) for t in (*u, *v))  # (with the final inner products)
    gamma = roundings * chain.eps / (1 - roundings * chain.eps)
    tol = 2 * gamma * absolute / (1 - gamma)  # (each side; A's own rounding, relative gamma)
    assert abs(lhs - rhs) <= tol, (
        f"<vjp(u), v> = {lhs!r} != <u, jvp(v)> = {rhs!r} (tolerance {tol:.3g}: gamma_K A, K = {roundings}, "
        f"A = {absolute:.3g})\n{where}"
    )


# --- duplicate indices, exactly ---------------------------------------------------------------------------


@st.composite
def duplicate_writes(draw) -> tuple:
    """(form, how, key, x, v, weights): ``y = FORM(x); y[key] HOW v`` with duplicates in ``key``,
    and integer weights for the loss ``sum(weights * y)`` (so every derivative is an exact sum of
    small integers)."""
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    rows = draw(st.lists(st.integers(-shape[0], shape[0] - 1), min_size=2, max_size=5))
    rows = [*rows, rows[0]] if len(set(rows)) == len(rows) else rows  # at least one duplicate
    if len(shape) == 2 and draw(st.booleans()):
        cols = draw(st.lists(st.integers(0, shape[1] - 1), min_size=len(rows), max_size=len(rows)))
        key: Any = (rows, cols)
    else:
        key = np.asarray(rows) if draw(st.booleans()) else rows
    region = np.zeros(shape)[key].shape
    v_shape = draw(st.sampled_from([region, region[1:], (1,) * len(region), ()]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x, v = rng.standard_normal(shape), rng.standard_normal(v_shape)
    weights = rng.integers(-3, 4, size=shape).astype(np.float64)
    form = draw(st.sampled_from(["zeros", "copy", "array", "zeros_like"]))
    how = draw(st.sampled_from(["=", "=", "+=", "add.at", "subtract.at"]))
    return form, how, key, x, v, weights


def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """The sum of ``g`` over the dims a value of ``shape`` was broadcast along to ``g.shape``."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape))))
    return g.sum(axis=tuple(d for d, n in enumerate(shape) if n == 1), keepdims=True).reshape(shape)


def expected_gradients(form: str, how: str, key: Any, x: np.ndarray, v: np.ndarray, weights: np.ndarray) -> tuple:
    """d sum(weights * y) / d (x, v), from numpy's semantics alone: for ``=`` and ``+=`` which
    element of v each position of y finally holds (numpy writes the markers 1..v.size as it would
    write v, duplicates and broadcasting included); for ``.at`` every (index, element) pair."""
    keeps_x = form in ("copy", "array")
    if how in ("=", "+="):
        markers = np.zeros(x.shape, np.int64)
        markers[key] = np.arange(1, v.size + 1).reshape(v.shape)
        dv = np.array([weights[markers == m].sum() for m in range(1, v.size + 1)]).reshape(v.shape)
        dx = np.where(markers == 0, weights, weights if how == "+=" else 0.0)
    else:
        gathered = np.broadcast_to(weights[key], np.zeros(x.shape)[key].shape)
        dv = _unbroadcast(gathered, v.shape) * (1 if how == "add.at" else -1)
        dx = weights
    return (dx if keeps_x else np.zeros_like(x)), dv


@given(duplicate_writes())
@fuzz_settings(100)
def test_duplicate_index_write_gradients(example):
    form, how, key, x, v, weights = example
    where = f"y = {form}(x); y[{key!r}] {how} v; x = {x.tolist()!r}, v = {v.tolist()!r}, weights {weights.tolist()!r}"

    def loss(x, v):
        return np.sum(weights * op_write(form, (), "base", how, "base", key, x, v))

    want = np.sum(weights * op_write(form, (), "base", how, "base", key, x.copy(), v))
    value, (dx, dv) = graphc.value_and_grad(loss, argnums=(0, 1))(x, v)
    # (the loss sums at most 12 products of the values in another order: 12 eps times their sum)
    bound = (
        12 * EPS * float(np.sum(np.abs(weights * op_write(form, (), "base", how, "base", key, np.abs(x), np.abs(v)))))
    )
    check = functools.partial(np.testing.assert_allclose, rtol=0, atol=bound)
    check_same(f"the loss through y[idx] {how} v differs from numpy's", where, check, value, want)
    want_dx, want_dv = expected_gradients(form, how, key, x, v, weights)
    check_same(f"d/dx of y = {form}(x); y[idx] {how} v is wrong", where, np.testing.assert_array_equal, dx, want_dx)
    check_same(f"d/dv of y[idx] {how} v is wrong", where, np.testing.assert_array_equal, dv, want_dv)
