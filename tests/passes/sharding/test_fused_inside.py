"""``memory.fused_inside`` clusters only the nodes from the first backward node to the last: the backward
clusters, and so the values kept inside kernels, are those of clustering every node."""

from __future__ import annotations

import pytest

import graphc
from graphc.core.pytree import static_argnames
from graphc.models import gpt, llama, mlp
from graphc.passes.fuse import find_clusters
from graphc.passes.sharding.memory import fused_inside


def _every_node(graph) -> set:
    """The rule of fused_inside over every node: the backward clusters' values read only inside."""
    nodes, outputs = graph.nodes, set(graph.outputs)
    readers: dict = {}
    for n in nodes:
        for v in n.inputs:
            readers.setdefault(v, []).append(n)
    inside = set()
    for c in find_clusters(nodes):
        if c.part != "backward":
            continue
        members = {id(nodes[k]) for k in c.nodes}
        for k in c.nodes:
            for o in nodes[k].outputs:
                if o not in outputs and readers.get(o) and all(id(r) in members for r in readers[o]):
                    inside.add(o)
    return inside


@pytest.mark.parametrize(
    "fn,example",
    [
        (mlp.train_step, lambda: mlp.example_train_args(batch=4, sizes=(8, 6, 3))),
        (gpt.train_step, gpt.example_train_args),
        (llama.train_step, lambda: llama.example_train_specs(n_layer=2)),
    ],
    ids=["mlp", "gpt", "llama"],
)
def test_fused_inside_equals_clustering_every_node(fn, example):
    args, kwargs = example()
    par = graphc.parallelize(fn, mesh={"dp": 2}, static_argnames=static_argnames(kwargs), cache=False)
    graph = par.trace_optimized(*args, **kwargs)[1]
    want = _every_node(graph)
    assert fused_inside(graph) == want
    assert want or fn is mlp.train_step  # the models with a softmax or a norm keep values inside
