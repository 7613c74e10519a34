"""Mesh axis roles (passes/sharding/roles.py): dp splits only batch dims, sp only sequence dims,
tp anything; free_axes lifts the roles. Plans are checked on what they split and run against numpy."""

import warnings

import networkx as nx
import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profiles import get_profile
from graphc.core.roles import axis_role
from graphc.core.spec import R, S
from graphc.models import gpt, llama
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning, state_ties
from graphc.passes.sharding.roles import BATCH, SEQ, _rule_places, axis_roles
from graphc.passes.sharding.strategies import rules_of
from tests.helpers import assert_adam_step_close, assert_same_pytree


def test_roles_by_axis_name():
    assert [axis_role(n) for n in ("dp", "data", "batch", "DP")] == ["data"] * 4
    assert [axis_role(n) for n in ("tp", "model", "mp")] == ["model"] * 3
    assert [axis_role(n) for n in ("sp", "seq", "pp", "pipe", "x", "rows")] == [
        "seq",
        "seq",
        "pipe",
        "pipe",
        "free",
        "free",
    ]
    assert Mesh("dp=2,sp=2,tp=2").roles == {"dp": "data", "sp": "seq", "tp": "model"}


def _mse_loss(params, x, y):
    h = np.maximum(x @ params["w1"] + params["b1"], 0.0)
    return np.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def _sgd_step(params, x, y):
    loss, grads = graphc.value_and_grad(_mse_loss)(params, x, y)
    return {k: params[k] - 0.05 * grads[k] for k in params}, loss


def _mlp_args(batch, d_in, hidden, d_out, seed=0):
    rng = np.random.default_rng(seed)
    params = {
        "w1": (rng.standard_normal((d_in, hidden)) * 0.1).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.standard_normal((hidden, d_out)) * 0.1).astype(np.float32),
        "b2": np.zeros(d_out, np.float32),
    }
    x = rng.standard_normal((batch, d_in)).astype(np.float32)
    y = rng.standard_normal((batch, d_out)).astype(np.float32)
    return params, x, y


def test_large_batch_mlp_on_dp_is_data_parallel():
    """An expert splits the batch and all-reduces the (small) gradients; weights stay replicated."""
    params, x, y = _mlp_args(1536, 24, 48, 6)
    pf = graphc.parallelize(_sgd_step, mesh="dp=4", cache=False)
    plan = pf.plan(params, x, y)
    specs = {t.name: t.spec for t in plan.inputs}
    assert specs["%x"] == (S(0),) and specs["%y"] == (S(0),)
    assert all(specs[f"%params.{k}"] == (R,) for k in params)
    assert {c.kind for c in plan.collectives} == {"all_reduce"}
    grad_bytes = sum(v.nbytes for v in params.values())
    assert sum(c.bytes for c in plan.collectives) <= grad_bytes + 4  # the gradients (and the loss)
    assert_same_pytree(pf(params, x, y), _sgd_step(params, x, y))


def test_free_axes_lets_a_data_axis_split_weights():
    params, x, y = _mlp_args(32, 64, 512, 64)
    graph = optimize_for_planning(graphc.trace(_sgd_step, params, x, y))
    ties = state_ties(graph)
    restricted = build_problem(graph, Mesh("dp=2"), PlanOptions(zero=0), ties=ties)
    free = build_problem(graph, Mesh("dp=2"), PlanOptions(zero=0, free_axes=True), ties=ties)
    w1 = next(it for it in restricted.items if it.kind == "input" and it.value.name == "params.w1")
    w1_free = next(it for it in free.items if it.kind == "input" and it.value.name == "params.w1")
    assert [s.out_specs[0] for s in w1.strategies] == [(R,)]
    assert len(w1_free.strategies) == 3  # R, S(0), S(1)
    assert sum(len(it.strategies) for it in restricted.items) < sum(len(it.strategies) for it in free.items)


@pytest.mark.slow
def test_gpt_on_dp_tp_splits_the_batch_on_dp_and_weights_on_tp_only():
    args, kw = gpt.example_train_args(batch=32, seq=16, d=32, n_head=4, n_layer=1, n_vocab=64)
    pf = graphc.parallelize(gpt.train_step, mesh="dp=2,tp=2", cache=False, static_argnames=("n_head",))
    plan = pf.plan(*args, **kw)
    for t in plan.inputs:
        if t.name.startswith(("%params", "%opt_state")):
            assert t.spec[0] == R, (t.name, t.spec)  # dp never splits model state
    assert any(t.spec[1] != R for t in plan.inputs if t.name.startswith("%params"))  # tp splits weights
    tokens = next(t for t in plan.inputs if t.name == "%tokens")
    assert tokens.spec[0] == S(0)
    for n in plan.nodes:  # dp splits batch dims only: every split it makes is of a batch class
        for spec in (*n.in_specs, *n.out_specs):
            assert spec[0].kind in ("R", "P") or spec[0].is_split
    # the longest sum: the 32 x 16 tokens of a weight's gradient
    assert_adam_step_close(pf(*args, **kw), gpt.train_step(*args, **kw), lr=kw["lr"], terms=32 * 16)


def test_batch_and_sequence_dims_follow_the_dataflow():
    (params, tokens, targets), kw = llama.example_loss_args(batch=2, seq=8, d=32, n_layer=1, n_head=4, n_kv_head=2)
    graph = optimize_for_planning(graphc.trace(llama.loss, params, tokens, targets, **kw))
    roles = axis_roles(graph, Mesh("dp=2,sp=2"), rules_of(graph), ties=[])
    names = {v.name: v for v in graph.inputs}
    assert roles.kinds(names["tokens"]) == (BATCH, SEQ)
    assert roles.kinds(names["targets"])[0] == BATCH
    assert names["params.embed"] in roles.state
    hidden = [n.outputs[0] for n in graph.nodes if n.outputs and n.outputs[0].type.shape == (2, 8, 32)]
    assert hidden and all(roles.kinds(v) == (BATCH, SEQ, 0) for v in hidden)


def test_dim_classes_are_the_connected_dims_of_the_rules():
    """``_unite``'s union-find (inlined, skipping ``find`` for a root's child) partitions the dims
    as the components of the graph of dims its rules' labels join (networkx), over two layers."""
    (params, tokens, targets), kw = llama.example_loss_args(batch=2, seq=8, d=32, n_layer=2, n_head=4, n_kv_head=2)
    graph = optimize_for_planning(graphc.trace(llama.loss, params, tokens, targets, **kw))
    rules = rules_of(graph)
    classes = axis_roles(graph, Mesh("dp=2,sp=2"), rules, ties=[]).classes
    joined = nx.Graph()
    joined.add_nodes_from(range(len(classes.parent)))
    for node in graph.nodes:
        if rules[node] is None:
            continue
        operands, pairs = _rule_places(rules[node])
        bases = [classes.first[node.inputs[i] if is_in else node.outputs[i]] for is_in, i, _dims in operands]
        joined.add_edges_from((bases[k1] + d1, bases[k2] + d2) for k1, d1, k2, d2 in pairs)
    want = sorted(sorted(c) for c in nx.connected_components(joined))
    by_root: dict[int, list[int]] = {}
    for x in range(len(classes.parent)):
        by_root.setdefault(classes.find(x), []).append(x)
    assert sorted(by_root.values()) == want
    assert len(want) < len(classes.parent) / 2  # most dims joined: the test sees unions, not singletons


def test_time_major_batch_is_found_behind_the_time_dim():
    def rnn_loss(w, xs):
        h = np.zeros((xs.shape[1], w.shape[1]), np.float32)
        for t in range(xs.shape[0]):
            h = np.tanh(xs[t] @ w + h)
        return h.sum()

    w = np.ones((5, 6), np.float32) * 0.1
    xs = np.ones((3, 8, 5), np.float32)
    graph = optimize_for_planning(graphc.trace(rnn_loss, w, xs))
    roles = axis_roles(graph, Mesh("dp=2"), rules_of(graph), ties=[])
    assert roles.kinds(graph.inputs[1])[1] == BATCH and roles.kinds(graph.inputs[1])[0] == 0


def test_sequence_parallel_axis_splits_the_sequence_and_matches_numpy():
    args, kw = llama.example_loss_args(batch=2, seq=64, d=64, n_layer=1, n_head=4, n_kv_head=2, n_vocab=48, ffn=256)
    pf = graphc.parallelize(llama.loss, mesh="sp=2", cache=False, static_argnames=("n_head", "n_kv_head"))
    plan = pf.plan(*args, **kw)
    for t in plan.inputs:
        if t.name.startswith("%params"):
            assert t.spec == (R,)
    split = [n for n in plan.nodes if any(s[0].is_split for s in n.out_specs)]
    assert split, "sp split nothing"
    np.testing.assert_allclose(pf(*args, **kw), llama.loss(*args, **kw), rtol=1e-5)


def test_a_data_axis_that_divides_no_batch_warns_and_replicates():
    params, x, y = _mlp_args(6, 8, 16, 4)  # batch 6 on dp=4
    pf = graphc.parallelize(_sgd_step, mesh="dp=4", cache=False)
    with pytest.warns(graphc.PlanWarning, match="dp=4 .*batch dims of size 6: it replicates the work") as caught:
        plan = pf.plan(params, x, y)
    assert caught[0].filename == __file__  # the user's line
    assert any("dp=4" in w and "batch dims of size 6" in w for w in plan.warnings), plan.warnings
    assert all(t.spec == (R,) for t in plan.inputs)
    with pytest.warns(graphc.PlanWarning, match="replicates the work"):  # compiling plans (and warns) again
        assert_same_pytree(pf(params, x, y), _sgd_step(params, x, y))
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphc.PlanWarning)  # once per compile: a second call compiles nothing
        assert_same_pytree(pf(params, x, y), _sgd_step(params, x, y))


@pytest.mark.parametrize(
    "axes, meant",
    [("dq=2", ["dp (data role)"]), ("dp=2,tpp=2", ["tp (model role)", "pp (pipe role)"]), ({"modle": 2}, ["model"])],
)
def test_an_axis_named_close_to_a_role_warns_which_role_it_would_have_had(axes, meant):
    with pytest.warns(graphc.MeshWarning, match="has no role, so it may split any dim") as caught:
        pf = graphc.parallelize(lambda x: x * 2, mesh=axes)
    (w,) = caught
    assert all(m in str(w.message) for m in meant), str(w.message)
    assert w.filename == __file__
    assert "free" in pf.mesh.roles.values()


@pytest.mark.parametrize("axes", ["dp=2,tp=2", "data=2,model=2", "sp=2,pp=2", "x=2,y=2", "rows=2,cols=2", "DP=2"])
def test_role_names_and_distant_names_do_not_warn(axes):
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphc.MeshWarning)
        graphc.parallelize(lambda x: x * 2, mesh=Mesh(axes))


@pytest.mark.parametrize("first_arg_container", [True, False])
def test_state_without_ties_is_the_leading_container(first_arg_container):
    w = {"w": np.ones((6, 4), np.float32)}

    def f(params, x):
        return x @ params["w"]

    def g(x, w):
        return x @ w

    x = np.ones((8, 6), np.float32)
    if first_arg_container:
        graph = optimize_for_planning(graphc.trace(f, w, x))
        roles = axis_roles(graph, Mesh("dp=2"), rules_of(graph), ties=[])
        assert graph.inputs[0] in roles.state and roles.kinds(graph.inputs[1]) == (BATCH, 0)
    else:  # bare arrays: nothing is known to be state; both leading dims may be batch
        graph = optimize_for_planning(graphc.trace(g, x, w["w"]))
        roles = axis_roles(graph, Mesh("dp=2"), rules_of(graph), ties=[])
        assert not roles.state and roles.kinds(graph.inputs[0])[0] & BATCH


@pytest.mark.parametrize(
    "axes, warned, size", [("dp=2,tp=16", "tp=16", 16), ("tp=3,sp=2", "tp=3,sp=2", 6), ("dp=4,tp=8", None, 8)]
)
def test_a_mesh_whose_node_axes_span_two_nodes_is_warned(axes, warned, size):
    """On a100-sxm (8 GPUs a node) the tp and sp axes are priced on the node's link; a group of
    them that does not divide the node (16, or 3 x 2) spans two nodes, which that link does not
    price: the plan says so. (The mesh search skips such meshes: passes/search.py.)"""
    (params, tokens, targets), kw = llama.example_loss_args(batch=4, seq=8, d=32, n_layer=1, n_head=4, n_kv_head=2)
    graph = optimize_for_planning(graphc.trace(llama.loss, params, tokens, targets, **kw))
    got = axis_roles(graph, Mesh(axes, profile=get_profile("a100-sxm")), rules_of(graph), ties=[]).warnings
    spans = [w for w in got if "node" in w]
    if warned is None:
        assert not spans
    else:
        assert spans == [
            f"mesh axes {warned} are priced on the link inside a node of a100-sxm, but a group of "
            f"{size} devices does not divide its node of 8: "
            "some group spans two nodes (--link prices their network)"
        ]
    assert not axis_roles(graph, Mesh(axes), rules_of(graph), ties=[]).warnings  # this machine: one node
