"""What the source-transform tests (tests/test_autograph_*.py) check: a traced function equals its
Python run, static control flow stays Python, traced control flow becomes graph ops."""

import copy
import os
import sys

import numpy as np
import pytest

import graphc
from graphc.core.ir import walk
from tests.helpers import assert_same_pytree

CONTROL_OPS = {"cond", "while_loop", "fori_loop"}
X = np.array([1.0, -2.0, 3.0])
X32 = np.array([1.0, -2.0, 3.0], np.float32)


def ops_of(graph) -> set[str]:
    return {n.op.name for n in walk(graph.nodes)}


def check(fn, *args, **kwargs):
    """Trace ``fn`` and compare the graph (and its parsed text) with eager numpy."""
    want = fn(*copy.deepcopy(args), **copy.deepcopy(kwargs))
    graph = graphc.trace(fn, *args, **kwargs)
    graph.verify()
    text = str(graph)
    parsed = graphc.parse(text)
    assert str(parsed) == text
    assert_same_pytree(graphc.evaluate(graph, *args, **kwargs), want)
    assert_same_pytree(graphc.evaluate(parsed, *args, **kwargs), want)
    return graph


def check_static(fn, *args, **kwargs):
    graph = check(fn, *args, **kwargs)
    assert not CONTROL_OPS & ops_of(graph), f"static control flow became graph control flow: {ops_of(graph)}"
    return graph


def check_all_branches(fn, inputs, op="cond", n_branches=None):
    """One graph, traced from the first input, must match numpy for every input. Functions return
    ``(result, branch_id)``; the inputs must together take ``n_branches`` different branches."""
    graph = graphc.trace(fn, *inputs[0])
    graph.verify()
    assert op in ops_of(graph)
    text = str(graph)
    parsed = graphc.parse(text)
    assert str(parsed) == text
    taken = set()
    for args in inputs:
        want = fn(*copy.deepcopy(args))
        assert_same_pytree(graphc.evaluate(graph, *args), want)
        assert_same_pytree(graphc.evaluate(parsed, *args), want)
        # retracing with this input gives the same answer too
        assert_same_pytree(graphc.evaluate(graphc.trace(fn, *args), *args), want)
        taken.add(float(want[1]))
    if n_branches is not None:
        assert len(taken) == n_branches, f"inputs take branches {sorted(taken)}, want {n_branches} different ones"
    return graph


def trace_error(fn, *args, **kwargs) -> graphc.TraceError:
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(fn, *args, **kwargs)
    err = info.value
    caller = sys._getframe(1).f_globals["__file__"]  # the test file whose function failed to trace
    assert err.filename is not None and err.filename.endswith(os.path.basename(caller)), err
    return err
