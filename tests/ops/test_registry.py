"""The op registry: every primitive is complete, and random graphs built from it verify, print,
parse back identically and evaluate bit-identically after the round trip."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphc
from graphc.core.ir import KINDS
from graphc.ops import REGISTRY
from tests.graphgen import SAMPLERS, random_graphs, random_inputs
from tests.helpers import quick_share, quiet


def test_primitive_set_is_small():
    model_ops = [n for n, op in REGISTRY.items() if op.kind != "comm"]
    assert 30 <= len(model_ops) <= 50, sorted(model_ops)  # (49: the RNG ops and the 3 update ops of issue 20)
    # the ops of partitioned device programs: four collectives and two local resharding steps
    assert sorted(n for n, op in REGISTRY.items() if op.kind == "comm") == [
        "all_gather",
        "all_reduce",
        "all_to_all",
        "partial_zero",
        "reduce_scatter",
        "shard_slice",
    ]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_op_declares_its_rules(name):
    op = REGISTRY[name]
    assert op.name == name
    assert op.kind in KINDS
    assert callable(op.infer) and callable(op.impl)
    assert op.doc, f"{name} has no doc string"
    assert callable(op.vjp) and callable(op.jvp), f"{name} misses a VJP or JVP rule"
    if op.kind != "comm":  # device-program ops are tested with the lowering (tests/passes/test_lower.py)
        assert name in SAMPLERS, f"{name} has no random-graph sampler in tests/graphgen.py"


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(random_graphs(), st.integers(0, 1000))
def test_random_graphs_verify_roundtrip_and_evaluate(graph, seed):
    graph.verify()
    text = str(graph)
    parsed = graphc.parse(text)
    assert str(parsed) == text
    inputs = random_inputs(graph, seed)
    for a, b in zip(quiet(graphc.evaluate, graph, *inputs), quiet(graphc.evaluate, parsed, *inputs)):
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype


@pytest.mark.parametrize("name", quick_share(sorted(n for n, op in REGISTRY.items() if op.kind != "comm")))
def test_each_op_in_isolation(name):
    """Random graphs that use only this op (plus the constants it needs)."""

    @settings(max_examples=25, deadline=None)
    @given(random_graphs(max_nodes=3, ops=[name]))
    def check(graph):
        graph.verify()
        text = str(graph)
        assert str(graphc.parse(text)) == text
        quiet(graphc.evaluate, graph, *random_inputs(graph))

    check()
