"""Dimension rules, differentially: every strategy the planner derives for a node, run piece by
piece on every device of a mesh (passes/sharding/local.py), must reassemble to the node's result
computed whole. Replicated results must agree on every replica, partial results must sum up."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.spec import shard, unshard
from graphc.interpreter import bind_arguments
from graphc.ops import REGISTRY
from graphc.passes.sharding.local import run_local
from graphc.passes.sharding.strategies import block_sets, get_rule, node_strategies
from tests.graphgen import random_graphs, random_inputs
from tests.helpers import quiet

PROFILE = MachineProfile.default()
MESHES = [{"x": 2}, {"x": 4}, {"a": 2, "b": 2}, {"x": 3}]


def _rng():
    return np.random.default_rng(0)


def f32(*shape):
    return _rng().standard_normal(shape).astype(np.float32)


def _models():
    """Small functions that between them use every primitive with a dimension rule."""

    def mlp(x, w, b):
        return np.maximum(x @ w + b, 0.0).sum(axis=0, keepdims=True)

    def batched(a, b):
        return (a @ b).max(axis=-1) + np.argmax(a, axis=1).astype(np.float32).sum()

    def attention(q, k, v):
        s = np.einsum("bqd,bkd->bqk", q, k) / 2.0
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
        return np.einsum("bqk,bkd->bqd", p, v)

    def shapes(x):
        y = x.reshape(4, 3, 4).transpose(1, 0, 2)
        z = np.broadcast_to(y[:, :1, :], (2, 3, 4, 4))
        p = np.pad(x[:, 2:], ((0, 0), (1, 1)))
        q, r = np.split(x, 2, axis=1)
        return z.sum(axis=0), p, np.concatenate([q, r * 2], axis=1), np.concatenate([x, x[:, :4]], axis=1)

    def qkv(x, w):
        h = x @ w
        q, k, v = np.split(h, 3, axis=-1)
        return q * k + v, np.concatenate([q, k], axis=-1)

    def embed(table, tokens):
        return table[tokens] * 2.0

    def pick(logits, labels):
        return logits[np.arange(logits.shape[0]), labels]

    def pick_grad(logits, labels):
        return graphc.grad(lambda z: (z[np.arange(z.shape[0]), labels] ** 2).sum())(logits)

    def positions(wpe, x):
        return x + wpe[np.arange(x.shape[1])] + wpe[:, 1:2][np.arange(4)[:, None], np.zeros((1, 3), np.int64)]

    def embed_grad(table, tokens):
        return graphc.grad(lambda t: (t[tokens] ** 2).sum())(table)

    def where_convert(x, y):
        c = x > y
        return np.where(c, x, y).astype(np.float64), np.logical_and(c, ~c), np.tanh(-x) * np.sqrt(np.abs(y))

    def consts(x):
        return x + np.arange(16, dtype=np.float32).reshape(4, 4)

    return [
        ("mlp", mlp, (f32(8, 4), f32(4, 12), f32(12))),
        ("batched", batched, (f32(4, 6, 8), f32(8, 4))),
        ("attention", attention, (f32(2, 4, 8), f32(2, 4, 8), f32(2, 4, 8))),
        ("shapes", shapes, (f32(4, 12),)),
        ("qkv", qkv, (f32(4, 8), f32(8, 24))),
        ("embed", embed, (f32(12, 4), np.array([[1, 11, -1, 5], [0, 0, 7, 3]]))),
        ("pick", pick, (f32(4, 6), np.array([0, 5, 2, 2]))),
        ("pick_grad", pick_grad, (f32(4, 6), np.array([0, 5, 2, 2]))),
        ("positions", positions, (f32(4, 3), f32(2, 4, 3))),
        ("embed_grad", embed_grad, (f32(12, 4), np.array([[1, 11, 1, 5], [0, 0, 7, 3]]))),
        ("where_convert", where_convert, (f32(4, 8), f32(4, 8))),
        ("consts", consts, (f32(4, 4),)),
    ]


MODELS = _models()


def _node_values(graph, args):
    """Every value of the graph, evaluated by the reference interpreter."""
    env = dict(zip(graph.inputs, bind_arguments(graph, args, {})))
    for node in graph.nodes:
        outs = (
            node.op.evaluate(*[env[v] for v in node.inputs], **node.attrs)
            if not node.regions
            else node.op.impl(
                __import__("graphc.interpreter", fromlist=["run_flat"]).run_flat,
                node.regions,
                *[env[v] for v in node.inputs],
                **node.attrs,
            )
        )
        for o, a in zip(node.outputs, outs):
            env[o] = np.asarray(a)
    return env


def _check_node(node, strategy, mesh_shape, env):
    coords = list(itertools.product(*[range(n) for n in mesh_shape]))
    pieces = {}
    for c in coords:
        local_in = [shard(env[v], s, mesh_shape, c) for v, s in zip(node.inputs, strategy.in_specs)]
        pieces[c] = run_local(node, strategy, mesh_shape, c, local_in)
    for k, (o, spec) in enumerate(zip(node.outputs, strategy.out_specs)):
        want = env[o]
        got = unshard({c: p[k] for c, p in pieces.items()}, spec, mesh_shape, want.shape)
        what = f"{node.op.name} {strategy.describe()} on {mesh_shape}, result {k}"
        if want.dtype.kind == "f":
            if any(p.kind == "P" for p in spec):
                # partial sums reassociate: where the whole sum overflows, inf and nan may trade places
                keep = np.isfinite(want)
                got, want = np.where(keep, got, 0), np.where(keep, want, 0)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)
        else:
            np.testing.assert_array_equal(got, want, err_msg=what)
        for a, p in enumerate(spec):  # replicas agree
            if p.kind == "R":
                for c in coords:
                    peer = c[:a] + (0,) + c[a + 1 :]
                    np.testing.assert_array_equal(pieces[c][k], pieces[peer][k], err_msg=what + " (replicas differ)")


@pytest.mark.parametrize("axes", MESHES, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
@pytest.mark.parametrize("name,fn,args", MODELS, ids=[m[0] for m in MODELS])
def test_every_strategy_reassembles(name, fn, args, axes):
    graph = graphc.trace(fn, *args)
    mesh = Mesh(axes, profile=PROFILE)
    rules = {n: get_rule(n) for n in graph.nodes}
    sets = block_sets(graph, rules)
    env = _node_values(graph, args)
    checked = 0
    for node in graph.nodes:
        for st in node_strategies(node, rules[node], mesh, sets):
            _check_node(node, st, tuple(mesh.shape), env)
            checked += 1
    assert checked > len(graph.nodes) or mesh.size == 3  # sizes here rarely divide by 3


def test_fused_nodes_reassemble():
    """Fused clusters (layer norm, softmax, GELU) split along their row dims, not their reduced dim."""

    def block(x, g):
        mu = x.mean(axis=-1, keepdims=True)
        h = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5) * g
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        return 0.5 * h * (1 + np.tanh(0.79788456 * (h + 0.044715 * h * h * h))) + e / e.sum(axis=-1, keepdims=True)

    args = (f32(4, 6, 8), f32(8))
    graph = graphc.optimize(graphc.trace(block, *args))
    fused = [n for n in graph.nodes if n.op.name == "fused"]
    assert fused
    env = _node_values(graph, args)
    mesh = Mesh({"a": 2, "b": 2}, profile=PROFILE)
    rules = {n: get_rule(n) for n in graph.nodes}
    sets = block_sets(graph, rules)
    for node in fused:
        rule = rules[node]
        x_in = next(i for i, v in enumerate(node.inputs) if v.type.shape == (4, 6, 8))
        assert rule.inputs[x_in][2] is None, "the normalized (reduced) dim must not split"
        assert rule.inputs[x_in][0] is not None and rule.inputs[x_in][1] is not None
        strategies = node_strategies(node, rule, mesh, sets)
        assert len(strategies) > 1
        for st in strategies:
            _check_node(node, st, (2, 2), env)


def test_vocab_parallel_embedding_is_masked_and_partial():
    table, tokens = f32(12, 4), np.array([[1, 11, -1, 5]])
    graph = graphc.trace(lambda t, i: t[i], table, tokens)
    (node,) = graph.nodes
    rule = get_rule(node)
    assert rule.masked == {"v"} and "v" in rule.sums
    mesh = Mesh({"tp": 4}, profile=PROFILE)
    names = {st.name: st for st in node_strategies(node, rule, mesh, block_sets(graph, {node: rule}))}
    st = names["v@tp"]
    assert str(st.in_specs[0][0]) == "S(0)" and str(st.out_specs[0][0]) == "P"
    _check_node(node, st, (4,), _node_values(graph, (table, tokens)))


def test_arange_index_splits_rows_without_partial_sums():
    """x[np.arange(n), labels]: the arange dim of x is the result's dim, split by rows on both."""
    logits, labels = f32(8, 6), np.array([0, 5, 2, 2, 1, 1, 0, 3])
    graph = graphc.optimize(graphc.trace(lambda z, t: z[np.arange(8), t], logits, labels), passes=("fold_constants",))
    node = next(n for n in graph.nodes if n.op.name == "gather")
    rule = get_rule(node)
    assert rule.inputs[0][0] == rule.outputs[0][0] and rule.inputs[0][0] in rule.masked
    assert not rule.sums
    mesh = Mesh({"dp": 4}, profile=PROFILE)
    st = next(s for s in node_strategies(node, rule, mesh, {}) if s.name == "i0@dp")
    assert [str(s[0]) for s in st.in_specs] == ["S(0)", "S(0)", "S(0)"] and str(st.out_specs[0][0]) == "S(0)"
    _check_node(node, st, (4,), _node_values(graph, (logits, labels)))


def test_masked_lookup_raises_on_out_of_range_index():
    """A device that owns none of a bad index must not silently return zeros."""
    table, tokens = f32(12, 4), np.array([[1, 12]])
    graph = graphc.trace(lambda t, i: t[i], table, np.array([[1, 2]]))
    (node,) = graph.nodes
    mesh = Mesh({"tp": 2}, profile=PROFILE)
    st = next(s for s in node_strategies(node, get_rule(node), mesh, {}) if s.name == "v@tp")
    with pytest.raises(IndexError):
        run_local(node, st, (2,), (0,), [shard(table, st.in_specs[0], (2,), (0,)), tokens])


def test_every_primitive_has_rules():
    """Every primitive declares a cost; all but control flow declare a dimension rule (the ops of
    partitioned device programs too: a micro-batch's program is partitioned again on a stage's
    sub-mesh, tests/passes/test_pipeline.py)."""
    for op in REGISTRY.values():
        assert op.cost is not None, op.name
        assert (op.dim_rule is None) == (op.kind == "control"), op.name


def test_matmul_cost_and_contracted_dim():
    graph = graphc.trace(lambda a, b: a @ b, f32(2, 3, 5), f32(5, 7))
    (node,) = graph.nodes
    rule = get_rule(node)
    assert rule.sums == {"k"}
    assert rule.inputs[1] == ("k", "n")
    flops, nbytes = node.op.cost((node.inputs[0].type, node.inputs[1].type), (node.outputs[0].type,))
    assert flops == 2 * 2 * 3 * 5 * 7
    assert nbytes == 4 * (30 + 35 + 42)


def test_uneven_splits_are_excluded():
    graph = graphc.trace(lambda x: np.exp(x), f32(5, 6))
    (node,) = graph.nodes
    mesh = Mesh({"x": 4}, profile=PROFILE)
    for st in node_strategies(node, get_rule(node), mesh, {}):
        assert all(not p.is_split for p in st.out_specs[0]), st.describe()
    mesh3 = Mesh({"x": 3}, profile=PROFILE)
    assert {st.name for st in node_strategies(node, get_rule(node), mesh3, {})} == {"replicate", "e1@x"}


@settings(max_examples=150, deadline=None, derandomize=True)  # reproducible in CI
@given(random_graphs(max_nodes=6), hst.sampled_from([(2,), (3,), (2, 2)]))
def test_random_graphs_every_strategy_reassembles(graph, mesh_shape):
    """Hypothesis-generated graphs (random ops, shapes, broadcasting, dtypes): every strategy of
    every node, run on its pieces, gives the node's result."""
    axes = {f"a{i}": n for i, n in enumerate(mesh_shape)}
    mesh = Mesh(axes, profile=PROFILE)
    inputs = random_inputs(graph, 0)
    try:
        env = quiet(_node_values, graph, inputs)
    except (FloatingPointError, IndexError):
        return
    rules = {n: get_rule(n) for n in graph.nodes}
    sets = block_sets(graph, rules)
    for node in graph.nodes:
        for st_ in node_strategies(node, rules[node], mesh, sets):
            quiet(_check_node, node, st_, mesh_shape, env)
