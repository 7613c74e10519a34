"""What building the sharding problem shares between repeated layers (passes/sharding/problem.py,
costs.py, roles.py) against building every node and edge on its own: equal nodes share one
strategy list by their key (``_node_key``), edges one redistribution table by their ends
(``CostModel.edge_table``), values their dim classes (``roles._DimClasses``). Each shared result
must equal what the node or edge gets alone: on tied layers, with dropout (whose draws differ in
stream position only), with ZeRO and a memory limit, and on a stack whose one layer differs."""

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.models import gpt3
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, state_ties
from graphc.passes.sharding import problem as problem_mod
from graphc.passes.sharding.roles import BATCH, SEQ, axis_roles, state_inputs
from graphc.passes.sharding.strategies import rules_of


def _dropout_gpt3():
    args, kw = gpt3.example_train_specs(n_layer=3, d=32, n_head=2, seq=8, n_vocab=64, batch=4, dropout_p=0.1)
    return gpt3.train_step, args, kw


def _plain_gpt3():
    args, kw = gpt3.example_train_specs(n_layer=3, d=32, n_head=2, seq=8, n_vocab=64, batch=4)
    return gpt3.train_step, args, kw


def _uneven_stack():
    """Three MLP layers, the middle one twice as wide: its nodes must not take the others'
    strategies, and its neighbours' edges not its tables."""

    def loss(params, x):
        for p in params["layers"]:
            x = np.tanh(x @ p["w"] + p["b"]) @ p["v"]  # [B, d] -> [B, h] -> [B, d]
        return np.mean(x * x)

    def step(params, x):
        g = graphc.grad(loss)(params, x)
        return graphc.tree_map(lambda p, d: p - 0.1 * d, params, g)

    rng = np.random.default_rng(0)
    d = 8
    layers = [
        {"w": rng.standard_normal((d, h)), "b": np.zeros(h), "v": rng.standard_normal((h, d))} for h in (16, 32, 16)
    ]
    return step, ({"layers": layers}, rng.standard_normal((4, d))), {}


CASES = {
    "gpt3 dropout dp=2,tp=2": (_dropout_gpt3, {"dp": 2, "tp": 2}, PlanOptions()),
    "gpt3 zero, memory limit": (_plain_gpt3, {"dp": 2, "tp": 2}, PlanOptions(zero="auto", memory_limit=2**30)),
    "uneven stack dp=2,tp=2": (_uneven_stack, {"dp": 2, "tp": 2}, PlanOptions()),
}


def _graph(name):
    make, axes, options = CASES[name]
    fn, args, kw = make()
    static = tuple(k for k in kw if k in ("n_head", "lr", "dropout_p"))
    step = graphc.parallelize(fn, mesh=axes, static_argnames=static, cache=False)
    return step.trace_optimized(*args, **kw)[1], step.mesh, options


def _strategies(items):
    return [[(s.name, s.in_specs, s.out_specs, s.compute_s, s.recompute) for s in it.strategies] for it in items]


@pytest.mark.parametrize("name", list(CASES))
def test_nodes_sharing_strategies_get_what_each_gets_alone(name, monkeypatch):
    graph, mesh, options = _graph(name)
    shared = build_problem(graph, mesh, options, ties=state_ties(graph))
    monkeypatch.setattr(problem_mod, "_node_key", lambda node, value_keys, arrays: None)  # every node on its own
    alone = build_problem(graph, mesh, options, ties=state_ties(graph))
    assert len({id(it.strategies) for it in shared.items if it.kind == "node"}) < len(shared.items) / 2
    assert _strategies(shared.items) == _strategies(alone.items)
    assert [(it.kind, it.index) for it in shared.items] == [(it.kind, it.index) for it in alone.items]
    assert shared.edges == alone.edges


@pytest.mark.parametrize("name", ["gpt3 dropout dp=2,tp=2", "uneven stack dp=2,tp=2"])
def test_shared_edge_tables_price_each_edge_as_its_own_redistribution(name):
    graph, mesh, options = _graph(name)
    problem = build_problem(graph, mesh, options, ties=state_ties(graph))
    costs = problem.costs
    tables = set()
    for e in problem.edges:
        table, ui, vi = costs.edge_table(e)
        tables.add(id(table))
        src = problem.items[e.src].strategies
        dst = problem.items[e.dst].strategies
        want = [[costs.time(e, a.out_specs[e.src_out], b.in_specs[e.dst_in]) for b in dst] for a in src]
        assert table[np.ix_(ui, vi)].tolist() == want
    assert len(tables) < len(problem.edges) / 2


def _reference_kinds(graph, rules, ties):
    """Every value's BATCH | SEQ bits per dim, from a union-find over (value, dim) pairs made
    here from the rules (roles.py's module doc)."""
    parent = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    labelled = set()
    for node in graph.nodes:
        rule = rules.get(node)
        if rule is None:
            continue
        ok = set(rule.labels())
        place = {"in": node.inputs, "out": node.outputs}
        for side, i, d, label, _f in rule.occurrences():
            if label in ok:
                labelled.add((place[side][i], d))
        first = {}
        for side, i, d, label, _f in rule.occurrences(primary_only=True):
            if label in ok:
                a, b = find(first.setdefault(label, (place[side][i], d))), find((place[side][i], d))
                if a != b:
                    parent[a] = b
    state = state_inputs(graph, ties)
    batch, seq = set(), set()
    for k, v in enumerate(graph.inputs):
        dims = [d for d in range(v.type.ndim) if (v, d) in labelled]
        if k in state or not dims:
            continue
        batch.add(find((v, dims[0])))
        b = dims[0] + 1
        if b < v.type.ndim and (v, b) in labelled and (v.type.dtype.kind in "iu" or v.type.ndim >= 3):
            seq.add(find((v, b)))
    values = [*graph.inputs, *(o for n in graph.nodes for o in n.outputs)]
    return {
        v: tuple((BATCH if find((v, d)) in batch else 0) | (SEQ if find((v, d)) in seq else 0) for d in range(v.ndim))
        for v in values
    }


@pytest.mark.parametrize("name", ["gpt3 dropout dp=2,tp=2", "uneven stack dp=2,tp=2"])
def test_dim_classes_give_the_kinds_of_a_union_find_over_value_dims(name):
    graph, _mesh, _options = _graph(name)
    rules = rules_of(graph)
    ties = state_ties(graph)
    roles = axis_roles(graph, Mesh("dp=2,sp=2,tp=2"), rules, ties)
    want = _reference_kinds(graph, rules, ties)
    assert {v: roles.kinds(v) for v in want} == want
    assert any(BATCH in k for k in want.values())
