"""Planning leaves no node for the cycle collector: the collection that follows the paused
collector (graphc/core/collector.py) walks what planning left in cycles, and a node and its results
hold each other. The traced graph's own nodes (those the optimized graph does not share) are
unlinked once the optimized graph is made (``plan_and_graph``: passes/manager.py
``release_unshared``), and the trace's context gives its node list to the graph (frontend/entry.py)."""

from __future__ import annotations

import gc

import graphc
from graphc.api import parallel
from graphc.core.ir import Node
from graphc.models import mlp
from tests.helpers import assert_same_pytree


def _nodes_left(par, args, kwargs) -> tuple[int, object, object]:
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        plan, graph = par.plan_and_graph(*args, **kwargs)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = sum(type(o) is Node for o in gc.garbage)  # (type, not isinstance: a dead weak proxy raises)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    return left, plan, graph


def test_planning_leaves_no_node_for_the_collector(monkeypatch):
    args, kwargs = mlp.example_train_args(batch=8, sizes=(16, 8, 4))
    par = graphc.parallelize(mlp.train_step, mesh={"dp": 2}, cache=False)
    left, plan, graph = _nodes_left(par, args, kwargs)
    assert left == 0
    graph.verify()
    want = graphc.evaluate(graphc.trace(mlp.train_step, *args, **kwargs), *args, **kwargs)
    assert_same_pytree(graphc.evaluate(graph, *args, **kwargs), want)
    # the test can fail: without the release, the traced graph's own nodes wait for the collector
    monkeypatch.setattr(parallel, "release_unshared", lambda dropped, kept: None)
    assert _nodes_left(par, args, kwargs)[0] > 0
