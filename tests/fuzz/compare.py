"""Comparing graphc's run of a program with numpy's: values (up to the rounding a program allows),
errors, and what the results may share with the inputs and with each other.

``check_runner(runner, program)`` is the property the jit and parallel targets share:

- numpy raises: graphc raises a ``GraphcError``, or numpy's exception itself (numpy code on numpy
  arrays inside the function runs as it is), never another exception; numpy succeeds: graphc
  succeeds (or raises one of the ``DOCUMENTED_REJECTIONS``) and ``assert_matches`` numpy's result;
- no result shares memory with an input or another result, unless numpy's does, and a result is
  writeable where numpy's is;
- a second call returns numpy's result again, in new arrays, and leaves the first call's results
  as they were;
- writing into each result changes nothing else: not the inputs, not the other results (unless
  numpy's share memory), not the second call's results, and not a third call's;
- the inputs are never changed.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.pytree import flatten
from tests.fuzz.programs import describe, quietly
from tests.fuzz.steps import run_program

RTOL = {2: 2e-3, 4: 2e-5, 8: 1e-12}
# steps whose float results graphc may round differently from numpy: transcendental functions (the
# fused kernels' own exp/log/tanh; log2 = log / log(2) and the like; numpy's pow loops change their
# last bit with the operands' memory layout), sums (kernels and einsum sum in another order; a
# scan or np.add.at may add in another order) and products of several factors (cumprod, multiply.at)
ROUNDING_UFUNCS = {"exp", "log", "log1p", "expm1", "tanh", "sin", "cos", "exp2", "log2", "logaddexp", "power"}
ROUNDING_REDUCTIONS = {"sum", "mean", "var", "std"}
ROUNDING_WRITES = {"add.at", "subtract.at", "multiply.at"}

# Valid numpy that graphc rejects on purpose, with a TraceError naming the line and the rewrite,
# and documents: a clear rejection is not a wrong answer, so the targets accept these where numpy
# succeeds (message fragment: what it is).
DOCUMENTED_REJECTIONS = {
    "ndarray.sort is not supported by graphc": "x.sort() in place (use x = np.sort(x))",
    # data-dependent shapes (README, "What does not work yet"; graphc/frontend/masked.py)
    "one value per selected element needs the number of True elements": "x[traced_mask] = one value per element",
}


def documented_rejection(exc: BaseException) -> str | None:
    """Which documented rejection ``exc`` is, or None."""
    text = str(exc)
    return next((what for fragment, what in DOCUMENTED_REJECTIONS.items() if fragment in text), None)


class Exactness:
    """What a value's comparison with numpy can rely on: ``inexact`` when a rounding step (above)
    made it or a value it depends on (floats then match up to ``rtol`` times ``scale``, the largest
    magnitude in its history); ``unverifiable`` when a discrete result (an int, a bool, an argmax, a
    branch taken) depends on an inexact value (one ulp may flip it), or an integer was converted
    from a nan, an infinity or an out-of-range float (undefined in C): only its dtype and shape are
    compared."""

    def __init__(self, inexact: bool = False, unverifiable: bool = False, scale: float = 1.0, itemsize: int = 8):
        self.inexact, self.unverifiable, self.scale, self.itemsize = inexact, unverifiable, scale, itemsize

    @property
    def rtol(self) -> float:
        return RTOL[self.itemsize]


def _magnitude(v: Any) -> tuple[float, int]:
    """(largest finite magnitude, smallest float itemsize) of a value (8 when it holds no floats)."""
    arr = np.asarray(v)
    if arr.dtype.kind != "f":
        return (float(np.max(np.abs(arr.astype(np.float64)), initial=0.0)) if arr.dtype.kind in "iub" else 0.0), 8
    finite = arr[np.isfinite(arr)]
    return float(np.max(np.abs(finite.astype(np.float64)), initial=0.0)), arr.dtype.itemsize


def _rounds(step: tuple) -> bool:
    kind, before, _refs, _after = step
    if kind in ("ufunc", "out"):
        return before[0] in ROUNDING_UFUNCS
    if kind in ("operator", "inplace"):
        return before[0] in ("**", "**=")
    if kind in ("reduce", "method_reduce"):
        return before[0] in ROUNDING_REDUCTIONS
    if kind == "write":
        return before[3] in ROUNDING_WRITES
    return kind in ("einsum", "matmul", "scan")


def _discrete(step: tuple) -> bool:
    """Whether a step's float result is chosen by comparisons (a branch, an index)."""
    kind, before, _refs, _after = step
    if kind in ("branch", "mask_write"):  # (a mask's elements are comparisons)
        return True
    return (kind == "reduce" and before[0] in ("argmax", "argmin")) or before[:1] == ("argsort",)


def _run_step(step: tuple, pool: list) -> tuple[Any, bool]:
    """(numpy's value of one step, whether it converted a nan, an infinity or an out-of-range float
    to an integer: numpy warns "invalid value encountered" and the result is whatever the machine's
    conversion gives, which C leaves undefined)."""
    with warnings.catch_warnings(record=True) as caught, np.errstate(all="ignore", invalid="warn"):
        warnings.simplefilter("always")
        value = run_program((step,), (len(pool),), *pool)[0]
    invalid = any("invalid value encountered" in str(w.message) for w in caught)
    return value, invalid and np.result_type(value).kind in "iub"


def exactness(steps: tuple, outputs: tuple, inputs: tuple) -> list[Exactness]:
    """The Exactness of each output, from numpy's run of the program."""
    pool, info = list(inputs), []
    for x in inputs:
        scale, size = _magnitude(x)
        info.append(Exactness(scale=max(1.0, scale), itemsize=size))
    for step in steps:
        kind, before, refs, after = step
        value, undefined = _run_step(step, pool)
        used = [info[i] if isinstance(i, int) else Exactness(scale=max(1.0, _magnitude(i.value)[0])) for i in refs]
        is_float = np.result_type(value).kind == "f"
        inexact = is_float and (_rounds(step) or any(u.inexact for u in used))
        discrete = not is_float or _discrete(step)
        unverifiable = any(u.unverifiable for u in used) or (discrete and any(u.inexact for u in used)) or undefined
        scale, size = _magnitude(value)
        pool.append(value)
        info.append(
            Exactness(
                inexact,
                unverifiable,
                max([1.0, scale] + [u.scale for u in used]),
                min([size] + [u.itemsize for u in used]),
            )
        )
    return [info[i] for i in outputs]


def assert_matches(got: Any, want: Any, what: str, exact: list[Exactness], inexact_zero_signs: bool = True) -> None:
    """Same pytree; every leaf of the same dtype and shape; ints and bools equal; floats equal, with
    nan, +-inf and the sign of zeros numpy's, up to rounding where a rounding step made them
    (``Exactness``; not the sign of their zeros if ``inexact_zero_signs`` is False); values that
    depend on such rounding discretely are not compared. A failure's first line says which check
    failed, then ``what`` (the program)."""
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree, f"result structure {got_tree} != numpy's {want_tree}\n{what}"
    for k, (g, w, e) in enumerate(zip(got_leaves, want_leaves, exact)):
        g, w = np.asarray(g), np.asarray(w)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (
            f"output {k} is {g.dtype}{list(g.shape)}, numpy's {w.dtype}{list(w.shape)}\n{what}"
        )
        if e.unverifiable:
            continue
        if w.dtype.kind != "f":
            check_same(f"output {k}: {w.dtype.kind} values differ", what, np.testing.assert_array_equal, g, w)
            continue
        check_same(f"output {k}: nan positions differ", what, np.testing.assert_array_equal, np.isnan(g), np.isnan(w))
        inf_g, inf_w = np.where(np.isinf(g), np.sign(g), 0), np.where(np.isinf(w), np.sign(w), 0)
        check_same(f"output {k}: infinities differ", what, np.testing.assert_array_equal, inf_g, inf_w)
        zero = (g == 0) & (w == 0) & (inexact_zero_signs or not e.inexact)
        check_same(
            f"output {k}: signed zeros differ",
            what,
            np.testing.assert_array_equal,
            np.signbit(g[zero]),
            np.signbit(w[zero]),
        )
        finite = np.isfinite(w)
        g64, w64 = g[finite].astype(np.float64), w[finite].astype(np.float64)
        if e.inexact:
            check = functools.partial(np.testing.assert_allclose, rtol=e.rtol, atol=e.rtol * e.scale)
            check_same(f"output {k}: float values differ beyond rounding", what, check, g64, w64)
        else:
            check_same(f"output {k}: float values differ (exact)", what, np.testing.assert_array_equal, g64, w64)


def check_same(failure: str, what: str, check: Callable, got: Any, want: Any) -> None:
    """``check(got, want)`` (an ``np.testing`` assertion), failing with ``failure`` as the first line
    of the message (which tests/fuzz/census.py classifies by), then ``what`` and the check's own."""
    try:
        check(got, want)
    except AssertionError as exc:
        raise AssertionError(f"{failure} (graphc's, numpy's)\n{what}\n{exc}") from None


# --- memory: aliasing, writes into results, inputs kept ------------------------------------------------


def _arrays(leaves: list) -> list:
    """The leaves that are numpy arrays (numpy scalars and Python numbers hold no shared memory)."""
    return [x if isinstance(x, np.ndarray) else None for x in leaves]


def _shares(a: Any, b: Any) -> bool:
    return a is not None and b is not None and np.shares_memory(a, b)


def _numpy_shares(want: list, k: int, j: int) -> bool:
    """Whether numpy's results k and j share memory, or are one object (a numpy scalar returned
    twice: graphc may return one 0-d array twice there)."""
    return want[k] is want[j] or _shares(_arrays(want)[k], _arrays(want)[j])


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


def _changed(x: np.ndarray) -> np.ndarray:
    """Values other than ``x``'s in every element (of its dtype)."""
    if x.dtype.kind == "b":
        return ~x
    return np.where(x == 42, 43, 42).astype(x.dtype)


def check_memory(got: list, want: list, inputs: list, np_inputs: list, where: str) -> None:
    """graphc's results (``got``, run on ``inputs``) share memory with an input or each other only
    where numpy's (``want``, run on ``np_inputs``, equal copies) do; writeable where numpy's are."""
    got, want_arrays = _arrays(got), _arrays(want)
    for k, g in enumerate(got):
        if g is None:
            continue
        if want_arrays[k] is not None and want_arrays[k].flags.writeable:
            assert g.flags.writeable, f"result {k} is read-only; numpy's is writeable\n{where}"
        for j, x in enumerate(inputs):
            assert not _shares(g, x) or _shares(want_arrays[k], np_inputs[j]), (
                f"result {k} shares memory with input {j}; numpy's does not\n{where}"
            )
        for j in range(k):
            assert not _shares(g, got[j]) or _numpy_shares(want, k, j), (
                f"results {j} and {k} share memory; numpy's do not\n{where}"
            )


def check_writes_into_results(got: list, want: list, inputs: list, others: list, where: str) -> None:
    """Writing into each result (that shares nothing with an input) leaves every input and every
    other result unchanged, except results numpy's shares memory with; and ``others`` (another
    call's results) unchanged."""
    got_arrays = _arrays(got)
    for k, g in enumerate(got_arrays):
        if g is None or g.size == 0 or not g.flags.writeable or any(_shares(g, x) for x in inputs):
            continue
        before = [None if x is None else _bits(x) for x in got_arrays]
        inputs_before = [_bits(x) for x in inputs]
        others_before = [_bits(np.asarray(x)) for x in others]
        g[...] = _changed(g)
        for j, x in enumerate(inputs):
            assert _bits(x) == inputs_before[j], f"writing into result {k} changed input {j}\n{where}"
        for j, x in enumerate(got_arrays):
            if j != k and x is not None and not _numpy_shares(want, k, j):
                assert _bits(x) == before[j], f"writing into result {k} changed result {j}\n{where}"
        for j, x in enumerate(others):
            assert _bits(np.asarray(x)) == others_before[j], (
                f"writing into result {k} changed result {j} of another call\n{where}"
            )


# --- the property ----------------------------------------------------------------------------------------


def numpy_outcome(steps: tuple, outputs: tuple, inputs: tuple) -> tuple[Any, Exception | None, list]:
    """(numpy's result, the exception numpy raised or None, the copies of the inputs it ran on)."""
    np_inputs = [x.copy() for x in inputs]
    try:
        return quietly(run_program, steps, outputs, *np_inputs), None, np_inputs
    except Exception as exc:
        return None, exc, np_inputs


def check_runner(runner: Callable, program: tuple, label: str, inexact_zero_signs: bool = True) -> bool:
    """``runner(*inputs)`` (graphc.jit of the program, or graphc.parallelize ...) against numpy: the
    properties of this module's docstring (``inexact_zero_signs``: ``assert_matches``'). Returns
    whether both computed a result."""
    steps, outputs, inputs = program
    where = f"{label}:\n{describe(steps, outputs, inputs)}"
    want, numpy_error, np_inputs = numpy_outcome(steps, outputs, inputs)
    args = [x.copy() for x in inputs]
    try:
        got = quietly(runner, *args)
    except GraphcError as exc:
        if numpy_error is None and documented_rejection(exc) is None:
            raise AssertionError(f"graphc raised where numpy did not\n{where}") from exc
        return False
    except Exception as exc:
        if numpy_error is not None and type(exc) is type(numpy_error):
            return False  # (numpy's own error: numpy code on numpy arrays inside the function, run as it is)
        raise AssertionError(f"graphc raised {type(exc).__name__}, not a GraphcError\n{where}") from exc
    if numpy_error is not None:
        raise AssertionError(f"numpy raised {type(numpy_error).__name__} where graphc did not: {numpy_error}\n{where}")
    exact = exactness(steps, outputs, inputs)
    assert_matches(got, want, where, exact, inexact_zero_signs)
    got_leaves, want_leaves = flatten(got)[0], flatten(want)[0]
    check_memory(got_leaves, want_leaves, args, np_inputs, where)
    first = [_bits(np.asarray(x)) for x in got_leaves]

    again = quietly(runner, *args)  # (a warm call: the specialization's generated entry)
    assert_matches(again, want, "(second call) " + where, exact, inexact_zero_signs)
    again_leaves = flatten(again)[0]
    assert [_bits(np.asarray(x)) for x in got_leaves] == first, f"the second call changed the first's results\n{where}"
    for k, (g, a) in enumerate(zip(_arrays(got_leaves), _arrays(again_leaves))):
        if not any(_shares(_arrays(want_leaves)[k], x) for x in np_inputs):
            assert not _shares(g, a), f"result {k} of two calls share memory\n{where}"

    check_writes_into_results(got_leaves, want_leaves, args, again_leaves, where)
    assert_matches(
        quietly(runner, *args), want, "(third call, after writing into results) " + where, exact, inexact_zero_signs
    )
    for j, (x, a) in enumerate(zip(inputs, args)):
        assert _bits(a) == _bits(x), f"input {j} was changed\n{where}"
    return True
