"""A result never shares memory with an argument or with another result (issue 27): a caller who
writes into what graphc returned must never change its own input or another result. numpy
returns new arrays from np.copy, x.copy(), np.array(x), x * 1, +x and (x * 2, x * 2); graphc's
simplification reduces some of them to an input or to one value returned twice, so the executor
copies exactly those. Checked on every path a result takes: the interpreter, jit (the
straight-line program of small values and the counted program of large ones), the sharded
runtime on tp, dp and dp x tp meshes, and pipelines."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc
from graphc.core.pytree import flatten
from graphc.models import mlp

FUNCTIONS = {
    "np.copy": lambda x: np.copy(x),
    "x.copy()": lambda x: x.copy(),
    "np.array": lambda x: np.array(x),
    "x * 1": lambda x: x * 1,
    "+x": lambda x: +x,
    "x + 0.0 * 2": lambda x: x - 0.0,
    "astype same": lambda x: x.astype(x.dtype),
    "reshape": lambda x: x.reshape(-1),
    "transpose": lambda x: x.T,
    "slice": lambda x: x[1:],
    "identity": lambda x: x,
    "pair of equal": lambda x: (x * 2, x * 2),
    "input twice": lambda x: (x, x),
    "result and its view": lambda x: (x * 2, (x * 2).T),
    "view and its result": lambda x: ((x * 2).T, x * 2),
    "input and its reshape": lambda x: (x.reshape(-1), x),
    "dict of copies": lambda x: {"a": np.copy(x), "b": x.copy()},
}

SHAPES = [(4, 6), (1, 6), (0, 6), (512, 600)]  # (512, 600) float64: above the straight-line size


def _leaves(tree):
    leaves, _ = flatten(tree)
    return [np.asarray(leaf) if not isinstance(leaf, np.ndarray) else leaf for leaf in leaves]


def _check_unaliased(results, args, expected):
    """No result shares memory with an argument or another result; writing into each result
    leaves the arguments and the other results as they were."""
    outs, ins = _leaves(results), _leaves(args)
    for i, o in enumerate(outs):
        for a in ins:
            assert not np.shares_memory(o, a), f"result {i} shares memory with an argument"
        for j in range(i):
            assert not np.shares_memory(o, outs[j]), f"results {j} and {i} share memory"
    before_in = [a.copy() for a in ins]
    before_out = [o.copy() for o in outs]
    for i, o in enumerate(outs):
        if o.size and o.flags.writeable:
            o[...] = 7
            for a, b in zip(ins, before_in):
                np.testing.assert_array_equal(a, b)
            for j, (other, b) in enumerate(zip(outs, before_out)):
                if j != i:
                    np.testing.assert_array_equal(other, b)
            o[...] = before_out[i]
    for got, want in zip(outs, _leaves(expected)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_jit_results_are_new_arrays(name, shape):
    fn = FUNCTIONS[name]
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    jitted = graphc.jit(fn)
    for _ in range(2):  # the first call and a warm one (the generated entry)
        _check_unaliased(jitted(x), x, fn(x))


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_interpreter_results_are_new_arrays(name):
    fn = FUNCTIONS[name]
    x = np.arange(24.0).reshape(4, 6)
    _check_unaliased(graphc.evaluate(graphc.trace(fn, x), x), x, fn(x))


@pytest.mark.parametrize("mesh", [{"tp": 2}, {"dp": 2}, {"dp": 2, "tp": 2}], ids=str)
@pytest.mark.parametrize(
    "name",
    ["np.copy", "x * 1", "reshape", "transpose", "identity", "pair of equal", "input twice", "view and its result"],
)
def test_sharded_results_are_new_arrays(name, mesh):
    fn = FUNCTIONS[name]
    x = np.arange(48.0).reshape(8, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a data axis that splits nothing here warns
        _check_unaliased(graphc.parallelize(fn, mesh=mesh)(x), x, fn(x))


def test_pipeline_passes_no_argument_through():
    """A pipeline step that returns its arguments next to its results hands out copies."""
    (args, kwargs) = mlp.example_train_args()

    def step(params, x, labels, lr=0.1):
        new, loss = mlp.train_step(params, x, labels, lr)
        return new, loss, params, x

    results = graphc.parallelize(step, mesh={"pp": 2}, microbatches=2)(*args, **kwargs)
    expected = graphc.jit(step)(*args, **kwargs)
    outs, ins = _leaves(results), _leaves(args)
    for o in outs:
        assert not any(np.shares_memory(o, a) for a in ins)
    for got, want in zip(outs, _leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
