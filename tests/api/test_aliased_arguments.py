"""Arguments that share memory with an array the function writes into in place (wrong29): a tied
weight held under two names (``self.head = self.wte``), the same array passed twice, a view held
beside its array. numpy sees the write through every name; a graph reads each argument as it was
at the call, so graphc gave the old values silently (a tied embedding updated by half, a view
attribute one step behind). Such a call is now a TraceError at the line of the write, on every
call path (a first call, a warm call's generated entry, graphc.parallelize, graphc.evaluate);
arguments that do not overlap, or that nothing writes, run and equal numpy."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import graphc
from tests.helpers import line_of

RNG = np.random.default_rng(0)


class Tied:
    def __init__(self, tie: bool):
        self.wte = RNG.standard_normal((10, 4))
        self.head = self.wte if tie else self.wte.copy()

    def step(self, tokens, lr):
        logits = self.wte[tokens] @ self.head.T
        self.wte -= lr * 0.1  # <- write wte
        self.head -= lr * 0.2
        return logits.sum()


def compiled(fn, how):
    return graphc.jit(fn) if how == "jit" else graphc.parallelize(fn, mesh={"dp": 2}, cache=False)


def quietly(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphc.GraphcWarning)  # (plans that replicate, unsaved writes)
        return fn(*args)


@pytest.mark.parametrize("how", ["jit", "dp2"])
def test_a_tied_weight_written_in_place_is_refused_and_untied_runs_as_numpy(how):
    tokens = np.array([1, 2, 3, 4])
    untied = Tied(tie=False)
    want = copy.deepcopy(untied)
    step = compiled(untied.step, how)
    for _ in range(2):
        assert quietly(step, tokens, 0.5) == pytest.approx(want.step(tokens, 0.5), rel=1e-12)
        np.testing.assert_array_equal(untied.wte, want.wte)
        np.testing.assert_array_equal(untied.head, want.head)
    tied = Tied(tie=True)
    before = tied.wte.copy()
    with pytest.raises(graphc.TraceError, match=r"writes into self\.wte in place.*self\.head as the same array") as err:
        quietly(compiled(tied.step, how), tokens, 0.5)
    assert err.value.lineno == line_of("# <- write wte")
    np.testing.assert_array_equal(tied.wte, before)  # nothing was run or written back
    assert tied.head is tied.wte


class RowView:
    def __init__(self):
        self.w = np.arange(12.0).reshape(3, 4)
        self.row = self.w[1]

    def step(self, x):
        self.w *= 2
        return self.row * x


def test_a_view_held_beside_its_array_is_refused():
    with pytest.raises(graphc.TraceError, match=r"self\.w in place.*self\.row over memory it shares"):
        graphc.jit(RowView().step)(np.ones(4))


class Halves:
    def __init__(self):
        self.buf = np.arange(8.0)
        self.even, self.odd = self.buf[::2], self.buf[1::2]

    def step(self):
        self.even += 1
        return self.odd * 2


def test_disjoint_views_of_one_buffer_run_as_numpy():
    got, want = Halves(), Halves()
    del got.buf, want.buf  # (the whole buffer held too overlaps the written half: refused)
    assert np.array_equal(graphc.jit(got.step)(), want.step())
    np.testing.assert_array_equal(got.even, want.even)
    np.testing.assert_array_equal(got.odd, want.odd)


def write_then_read(a, b):
    a[0] = 5.0
    return b.sum() + a.sum()


def read_only(a, b):
    return a.sum() - 2 * b.sum()


def test_the_same_array_passed_twice_to_a_writer_is_refused_on_warm_calls_too():
    x, y = RNG.standard_normal(4), RNG.standard_normal(4)
    f = graphc.jit(write_then_read)
    for _ in range(3):  # the first call, then the generated entry of warm calls
        assert quietly(f, x.copy(), y) == pytest.approx(write_then_read(x.copy(), y), rel=1e-12)
    z = x.copy()
    with pytest.raises(graphc.TraceError, match=r"writes into a in place.*passes b as the same array"):
        quietly(f, z, z)
    with pytest.raises(graphc.TraceError, match=r"passes b over memory it shares"):
        quietly(f, z, z[:])
    assert quietly(f, z[:2].copy(), z[2:4].copy()) is not None  # (another shape: traced again, runs)
    g = graphc.jit(read_only)  # nothing written: the same array twice is read twice, as numpy does
    assert g(z, z) == read_only(z, z) and g(z, z) == read_only(z, z)


def update(params, grads):
    for k in params:
        params[k] -= 0.1 * grads[k]
    return params


def test_dicts_of_arrays_through_the_tree_entry():
    params = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}
    grads = {"w": np.ones((3, 2)), "b": np.ones(2)}
    f = graphc.jit(update)
    for _ in range(2):
        got = quietly(f, params, grads)
        want = update(copy.deepcopy(params), grads)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    with pytest.raises(graphc.TraceError, match=r"writes into params\.w in place.*passes grads\.w as the same"):
        quietly(f, params, {"w": params["w"], "b": grads["b"]})


def test_evaluate_of_a_trace_refuses_too():
    x = np.arange(4.0)
    graph = quietly(graphc.trace, write_then_read, x, x.copy())
    with pytest.raises(graphc.TraceError, match="same array"):
        graphc.evaluate(graph, x, x)
