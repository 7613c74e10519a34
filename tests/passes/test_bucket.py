"""Gradient bucketing (passes/bucket.py): the all-reduces of a data-parallel step's gradients run
as one collective per bucket (its returned loss in one of its own, so that no view of it keeps a
bucket alive), the planner prices them so, and results equal numpy."""

from collections import Counter

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.pytree import flatten
from graphc.core.spec import P
from graphc.models import gpt
from graphc.passes.bucket import bucket_all_reduces
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning, state_ties
from graphc.passes.sharding.redistribute import redistribution_time
from graphc.programs import simulate


def _loss(params, x, y):
    h = np.tanh(x @ params["w1"] + params["b1"])
    h = np.maximum(h @ params["w2"] + params["b2"], 0.0)
    return np.mean((h @ params["w3"] - y) ** 2)


def _step(params, x, y):
    loss, grads = graphc.value_and_grad(_loss)(params, x, y)
    return {k: params[k] - 0.1 * grads[k] for k in params}, loss


def _args(batch=1280, sizes=(20, 40, 24, 5), seed=1):
    rng = np.random.default_rng(seed)
    d0, d1, d2, d3 = sizes
    params = {
        "w1": (rng.standard_normal((d0, d1)) * 0.2).astype(np.float32),
        "b1": np.zeros(d1, np.float32),
        "w2": (rng.standard_normal((d1, d2)) * 0.2).astype(np.float32),
        "b2": np.full(d2, 0.01, np.float32),
        "w3": (rng.standard_normal((d2, d3)) * 0.2).astype(np.float32),
    }
    return (
        params,
        rng.standard_normal((batch, d0)).astype(np.float32),
        rng.standard_normal((batch, d3)).astype(np.float32),
    )


def _compiled(bucket_bytes, mesh="dp=4"):
    params, x, y = _args()
    f = graphc.parallelize(_step, mesh=mesh, cache=False)
    f.options = PlanOptions(bucket_bytes=bucket_bytes, zero=0)
    return f, f.compile(params, x, y), (params, x, y)


def _all_reduces(compiled) -> list:
    g = compiled.partitioned.lowered.devices[0].graph
    return [n for n in g.nodes if n.op.name == "all_reduce"]


def test_a_data_parallel_step_reduces_its_gradients_in_one_collective_and_its_loss_alone():
    f, compiled, args = _compiled(25 * 2**20)
    plan = compiled.plan
    assert {t.name: str(t.spec) for t in plan.inputs}["%x"] == "(S(0),)"  # data parallel
    reduces = _all_reduces(compiled)
    assert len(reduces) == 2
    n_params = len(args[0])
    bucket, loss = reduces if reduces[0].inputs[0].producer.op.name == "concatenate" else reduces[::-1]
    assert bucket.inputs[0].type.size == sum(p.size for p in args[0].values())
    assert loss.inputs[0].type.shape == ()  # returned: never a view of the gradients' bucket
    # the plan prices one bucket: about one collective's fixed cost in all, not one per tensor
    one = plan.mesh.links["dp"].latency_s
    assert plan.cost.comm_s < 2 * (2 * one + plan.mesh.profile.collective_overhead_s) + 1e-4
    got, _ = flatten(f(*args))
    want, _ = flatten(_step(*args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    unbucketed = _all_reduces(_compiled(0)[1])
    assert len(unbucketed) == n_params + 1


def test_small_buckets_split_in_program_order_and_still_equal_numpy():
    f, compiled, args = _compiled(4096)  # the gradients are 1.5 to 3.8 KiB each
    reduces = _all_reduces(compiled)
    assert 1 < len(reduces) < len(args[0]) + 1
    assert all(r.inputs[0].type.nbytes <= 4096 for r in reduces if r.inputs[0].producer.op.name == "concatenate")
    got, _ = flatten(f(*args))
    want, _ = flatten(_step(*args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "mesh", ["dp=2", pytest.param("dp=4", marks=pytest.mark.slow), pytest.param("dp=2,tp=2", marks=pytest.mark.slow)]
)
def test_bucketing_any_plan_keeps_the_device_programs_equal_to_the_reference(mesh):
    """Bucket the lowered programs of a GPT step (whatever the plan) and simulate them: same outputs."""
    (params, opt_state, tokens, targets), kw = gpt.example_train_args(batch=16, seq=16, d=64, n_layer=1)
    # lr static: the inputs below are built by hand from the array arguments alone
    f = graphc.parallelize(gpt.train_step, mesh=mesh, static_argnames=("n_head", "lr"), cache=False)
    f.options = PlanOptions(bucket_bytes=0, zero=0)
    compiled = f.compile(params, opt_state, tokens, targets, **kw)
    program = compiled.partitioned.lowered
    inputs = program.shard_inputs([np.asarray(a) for a in flatten((params, opt_state, tokens, targets))[0]])
    want = program.gather_outputs(simulate(program, inputs))
    bucketed = type(program)(
        program.mesh,
        tuple(p.with_graph(bucket_all_reduces(p.graph, 1 << 20)) for p in program.devices),
        program.in_types,
        program.out_types,
    ).verify()
    before = program.devices[0].graph.nodes
    update = [n for n in before if n.op.name == "all_reduce" and n.part == "update"]
    after = Counter(n.op.name for n in bucketed.devices[0].graph.nodes)["all_reduce"]
    # a bucket closes when a member's result is needed before another's operand is ready
    assert after < Counter(n.op.name for n in before)["all_reduce"] or len(update) < 2
    got = bucketed.gather_outputs(simulate(bucketed, inputs))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_the_planner_amortizes_only_deferred_all_reduces():
    params, x, y = _args(batch=64)
    graph = optimize_for_planning(graphc.trace(_step, params, x, y))
    mesh = Mesh("dp=4", profile=MachineProfile.default())
    problem = build_problem(graph, mesh, PlanOptions(zero=0), ties=state_ties(graph))
    deferred = [e for e in problem.edges if e.deferred]
    assert deferred

    def waits(e):  # the update reads it (a returned value's all-reduce, the loss's, runs alone)
        consumer = problem.items[e.dst]
        if consumer.kind == "fanout":  # read by several: deferred when every reader waits
            return all(waits(f) for f in problem.edges if f.src == e.dst)
        return consumer.kind == "node" and consumer.node.part == "update"

    for e in problem.edges:
        assert e.deferred == waits(e)

    def gradient(e):  # may arrive partial, and is not one of the update's own values
        src = problem.items[e.src]
        in_update = src.node is not None and src.node.part == "update"
        return not in_update and any(P in st.out_specs[e.src_out] for st in src.strategies)

    partial = [e for e in deferred if gradient(e)]
    total = sum({e.value: e.value.type.nbytes for e in partial}.values())
    assert problem.costs.bucket_share_bytes == total
    unbucketed = PlanOptions(zero=0, bucket_bytes=0)
    assert build_problem(graph, mesh, unbucketed, ties=state_ties(graph)).costs.bucket_share_bytes == 0


def test_the_loss_all_reduce_is_priced_alone_as_it_runs():
    # the runtime never buckets a returned value's all-reduce (passes/bucket.py): the planner
    # prices it whole, where it had shared a bucket's fixed cost with the gradients
    params, x, y = _args(batch=64)
    graph = optimize_for_planning(graphc.trace(_step, params, x, y))
    mesh = Mesh("dp=4", profile=MachineProfile.default())
    problem = build_problem(graph, mesh, PlanOptions(zero=0), ties=state_ties(graph))
    assert problem.costs.bucket_share_bytes > 0
    loss = graph.outputs[-1]
    (edge,) = [e for e in problem.edges if problem.items[e.dst].kind == "output" and e.value is loss]
    assert not edge.deferred
    src = problem.items[edge.src]
    partial = [s for s, st in enumerate(src.strategies) if P in st.out_specs[edge.src_out]]
    assert partial  # the loss may arrive as a partial sum over dp
    whole = [s for s, st in enumerate(problem.items[edge.dst].strategies) if P not in st.in_specs[0]]
    t = loss.type
    for s in partial:
        for d in whole:
            a = src.strategies[s].out_specs[edge.src_out]
            b = problem.items[edge.dst].strategies[d].in_specs[0]
            alone = redistribution_time(t.shape, t.dtype.itemsize, a, b, mesh)
            assert alone > 0
            assert problem.costs.edge_time(edge, s, d) == alone


def test_a_returned_all_reduce_never_joins_a_bucket():
    # two returned partial sums over dp (the loss and a sum over the batch) beside the gradients:
    # each returned value's all-reduce runs alone, as the planner prices it (before, the two
    # shared a bucket of their own)
    def step(params, x, y):
        loss, grads = graphc.value_and_grad(_loss)(params, x, y)
        return {k: params[k] - 0.1 * grads[k] for k in params}, loss, np.sum(y)

    params, x, y = _args()
    f = graphc.parallelize(step, mesh="dp=4", cache=False)
    f.options = PlanOptions(zero=0)
    g = f.compile(params, x, y).program.devices[0].graph
    reduces = [n for n in g.nodes if n.op.name == "all_reduce"]
    bucketed = [n for n in reduces if n.inputs[0].producer.op.name == "concatenate"]
    assert [n.outputs[0].type.size for n in bucketed] == [sum(a.size for a in params.values())]  # the gradients'
