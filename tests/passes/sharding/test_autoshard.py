"""Auto-sharding: the ILP against exhaustive search, the classic plans emerging from the costs,
memory limits, pins, the plan document, and determinism."""

import json

import numpy as np
import pytest

import graphc
from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profile import Link, MachineProfile
from graphc.core.spec import format_spec
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, solve_problem, state_ties
from graphc.passes.sharding.plan import ShardingPlan
from tests.passes.sharding.exhaustive import exhaustive

PROFILE = MachineProfile.default()
OPT = ("fold_constants", "simplify", "cse", "dce")


def mesh(**axes) -> Mesh:
    return Mesh(axes, profile=PROFILE)


def optimized(fn, *args, **kwargs):
    return graphc.optimize(graphc.trace(fn, *args, **kwargs), passes=OPT)


def par(fn, m, **kw):
    return graphc.parallelize(fn, mesh=m, cache=False, **kw)


# --- the ILP is exact: equal to exhaustive search on small graphs ---------------------------------


def _small_cases():
    rng = np.random.default_rng(0)

    def f32(*s):
        return rng.standard_normal(s).astype(np.float32)

    def mlp(w1, w2, x):
        return np.tanh(x @ w1) @ w2

    def resid(w, x):
        h = x @ w
        return (h + x).sum(axis=0)

    def attn_like(q, k, v):
        s = q @ k.T
        return (s - s.max(axis=-1, keepdims=True)) @ v

    def two_branch(w1, w2, x):
        a = np.maximum(x @ w1, 0)
        b = x @ w2
        return (a * b).sum(axis=1)

    return [
        ("mlp", mlp, (f32(16, 32), f32(32, 8), f32(64, 16))),
        ("resid", resid, (f32(16, 16), f32(32, 16))),
        ("attn_like", attn_like, (f32(8, 16), f32(8, 16), f32(8, 4))),
        ("two_branch", two_branch, (f32(8, 16), f32(8, 16), f32(32, 8))),
    ]


@pytest.mark.parametrize("axes", [{"x": 2}, {"a": 2, "b": 2}])
@pytest.mark.parametrize(
    "name,fn,args",
    [pytest.param(*c, marks=pytest.mark.slow) if c[0] in ("attn_like", "two_branch") else c for c in _small_cases()],
    ids=[c[0] for c in _small_cases()],
)
def test_ilp_equals_exhaustive_search(name, fn, args, axes):
    g = optimized(fn, *args)
    assert len(g.nodes) <= 12
    p = build_problem(g, mesh(**axes))
    space = np.prod([float(len(it.strategies)) for it in p.items])
    if space > 3e5:
        pytest.skip(f"{space:.0f} combinations")
    sol = solve_problem(p, PlanOptions(shrink=False))
    best, _choice = exhaustive(p)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-15)
    assert p.evaluate(sol.choice)["total_s"] == pytest.approx(best, rel=1e-9, abs=1e-15)


def test_ilp_equals_exhaustive_search_under_a_memory_limit():
    rng = np.random.default_rng(1)
    w1, w2, x = (rng.standard_normal(s).astype(np.float32) for s in [(64, 64), (64, 64), (8, 64)])
    g = optimized(lambda w1, w2, x: np.tanh(x @ w1) @ w2, w1, w2, x)
    p = build_problem(g, mesh(x=2))
    unlimited = p.memory.peak(solve_problem(p, PlanOptions(shrink=False)).choice)[0]
    limit = int(unlimited * 0.7)
    sol = solve_problem(p, PlanOptions(memory_limit=limit, shrink=False))
    best, _ = exhaustive(p, memory_limit=limit)
    assert p.memory.peak(sol.choice)[0] <= limit
    assert sol.objective == pytest.approx(best, rel=1e-9)


# --- classic plans emerge from the costs ------------------------------------------------------------


def _gpt_train(batch=2, seq=32, d=256, n_layer=2, n_head=4, n_vocab=256):
    from graphc.models import gpt

    return gpt.train_step, gpt.example_train_args(
        batch=batch, seq=seq, n_vocab=n_vocab, d=d, n_layer=n_layer, n_head=n_head
    )


@pytest.fixture(scope="module")
def megatron_plan():
    fn, (args, kw) = _gpt_train()
    return par(fn, mesh(tp=4), static_argnames=("n_head", "lr")).plan(*args, **kw), args


def _weight_specs(plan):
    """{input name: spec} of the GPT parameters (the first argument's leaves)."""
    return {d.name: format_spec(d.spec) for d in plan.inputs}


def test_gpt_on_tp4_gets_the_megatron_pattern(megatron_plan):
    plan, args = megatron_plan
    specs = _weight_specs(plan)
    names = [d.name for d in plan.inputs]

    def spec_of(fragment):
        hits = [specs[n] for n in names if fragment in n and not n.startswith("%opt_state")]
        assert hits, (fragment, names[:20])
        return hits

    # column-parallel QKV (blocked by q/k/v: each device holds its heads of all three) and first MLP
    # weight; row-parallel output projections
    for s in spec_of("attn.c_attn.w"):
        assert s == "[S(1, blocks=3)]", s
    for s in spec_of("mlp.c_fc.w"):
        assert s == "[S(1)]", s
    for s in spec_of("c_proj.w"):
        assert s == "[S(0)]", s
    # no block weight is ever moved: parameters are used where they are stored, so no collective
    # serves a graph input but (perhaps) the tied embedding table, read by the lookup and the LM
    # head: stored split by vocabulary, one all-gather of it can serve both (FSDP-style)
    inputs = {d.name for d in plan.inputs}
    moved = {c.tensor for c in plan.collectives if c.tensor in inputs and c.kind != "slice"}
    assert moved <= {"%params.wte"}, moved
    fwd = [c for c in plan.collectives if c.part == "forward" and c.kind != "slice" and c.tensor not in moved]
    blocks = len(args[0]["blocks"])
    act_bytes = 2 * 32 * 256 * 4
    big = [c for c in fwd if c.bytes >= act_bytes]
    assert all(c.bytes == act_bytes for c in big), big
    kinds = [c.kind for c in big]
    assert set(kinds) <= {"all_reduce", "reduce_scatter", "all_gather"}, kinds
    # two all-reduces per block, or the equivalent reduce-scatter + all-gather pairs
    # (sequence parallelism between the blocks: one more all-gather before the head)
    assert kinds.count("all_reduce") + kinds.count("reduce_scatter") == 2 * blocks, kinds
    assert kinds.count("reduce_scatter") <= kinds.count("all_gather") <= kinds.count("reduce_scatter") + 1, kinds


def test_mlp_with_large_batch_on_dp4_is_pure_data_parallel():
    from graphc.models import mlp

    (params, x, labels), kw = mlp.example_train_args(batch=1024, sizes=(64, 64, 64, 10))
    plan = par(mlp.train_step, mesh(dp=4), static_argnames=("lr",)).plan(params, x, labels, **kw)
    coll = [c for c in plan.collectives if c.kind != "slice"]
    non_scalar = [c for c in coll if c.bytes > 4]
    assert all(c.kind == "all_reduce" for c in non_scalar), [(c.kind, c.tensor, c.op) for c in non_scalar]
    assert all(c.part in ("backward", "update") for c in non_scalar)
    sizes = sorted(c.bytes for c in non_scalar)
    assert sizes == sorted(v.nbytes for layer in params["layers"] for v in layer.values())
    x_spec = [format_spec(d.spec) for d in plan.inputs if d.type.startswith("f32[1024,64]")]
    assert x_spec == ["[S(0)]"]
    # the predicted communication is the closed form: one all-reduce per gradient, all in one
    # bucket (passes/bucket.py): the fixed cost of a collective paid once for them all; and the
    # loss's, which runs alone (returned: never in a bucket), paying its own
    from graphc.passes.sharding.redistribute import step_time

    link = PROFILE.link

    def t(nbytes):
        args = (link.latency_s, link.bandwidth, PROFILE.collective_overhead_s, PROFILE.mem_bandwidth)
        return step_time("all_reduce", 4, nbytes, *args)

    expected = sum(t(c.bytes) - t(0) for c in non_scalar) + t(0) + sum(t(c.bytes) for c in coll if c.bytes <= 4)
    assert plan.cost.comm_s == pytest.approx(expected, rel=1e-9)
    assert [c.bytes for c in coll if c.bytes <= 4] == [4]  # the mean loss, reduced once


@pytest.mark.slow
def test_gpt_on_dp2_tp4_mixes_both():
    """Data parallel across dp (tokens split by batch), Megatron tensor parallel across tp."""
    fn, (args, kw) = _gpt_train(batch=16, seq=16, d=64, n_vocab=128)
    plan = par(fn, mesh(dp=2, tp=4), static_argnames=("n_head", "lr")).plan(*args, **kw)
    assert plan.solver.status == "optimal"
    axes = {a for c in plan.collectives for a in c.axes}
    assert axes == {"dp", "tp"}
    specs = {n: s for n, s in _weight_specs(plan).items() if not n.startswith("%opt_state")}
    assert specs["%tokens"].startswith("[S(0), ")  # batch over dp (tp may add sequence parallelism)
    for name, spec in specs.items():
        if "c_attn.w" in name:
            assert spec == "[R, S(1, blocks=3)]", (name, spec)
        elif "c_fc.w" in name:
            assert spec == "[R, S(1)]", (name, spec)
        elif "c_proj.w" in name:
            assert spec == "[R, S(0)]", (name, spec)


def _two_weights(w_big, w_small, x):
    return (x @ w_big) @ w_small


def test_large_weight_is_split_to_fit_and_too_small_a_limit_names_the_minimum():
    # weights of 16 and 1 units; devices of 10 units: only splitting the big one fits
    unit = 64 * 64 * 4
    w_big = np.zeros((256, 256), np.float32)  # 16 units
    w_small = np.zeros((256, 16), np.float32)  # 1 unit
    x = np.zeros((4, 256), np.float32)
    m = mesh(tp=2)
    free = par(_two_weights, m).plan(w_big, w_small, x)
    fits = par(_two_weights, m, memory_limit=10 * unit).plan(w_big, w_small, x)
    assert fits.memory.peak_bytes[0] <= 10 * unit < free.memory.peak_bytes[0]
    big_spec = format_spec(fits.inputs[0].spec)
    assert "S(" in big_spec
    with pytest.raises(graphc.MemoryLimitError) as err:
        par(_two_weights, m, memory_limit=4 * unit).plan(w_big, w_small, x)
    minimum = err.value.min_memory_bytes
    assert minimum and minimum > 4 * unit
    assert str(minimum) in str(err.value)
    ok = par(_two_weights, m, memory_limit=minimum).plan(w_big, w_small, x)
    assert ok.memory.peak_bytes[0] == minimum


# --- pins, ties, the plan document -------------------------------------------------------------------


def test_shard_pins_a_spec_and_an_impossible_pin_fails_saying_why():
    def f(w, x):
        h = graphc.shard(x @ w, "R", "S(1)")
        return np.tanh(h).sum()

    w = np.zeros((16, 32), np.float32)
    x = np.zeros((8, 16), np.float32)
    plan = par(f, mesh(dp=2, tp=2)).plan(w, x)
    pinned = [n for n in plan.nodes if n.op == "sharding"]
    assert pinned and all([format_spec(x) for x in n.out_specs] == ["[R, S(1)]"] for n in pinned)

    def g(w, x):
        return graphc.shard(x @ w, "S(0)", "S(0)").sum()

    with pytest.raises(PlanError, match=r"pinned spec \[S\(0\), S\(0\)\]"):
        par(g, mesh(dp=2, tp=2)).plan(w, x)
    assert graphc.shard(x, "S(0)", "R") is x  # the identity outside a trace


def test_in_and_out_specs_are_honoured():
    def f(w, x):
        return np.tanh(x @ w)

    w = np.zeros((16, 32), np.float32)
    x = np.zeros((8, 16), np.float32)
    plan = par(f, mesh(tp=2), in_specs=("[S(1)]", None), out_specs="[R]").plan(w, x)
    assert format_spec(plan.inputs[0].spec) == "[S(1)]"
    assert format_spec(plan.outputs[0].spec) == "[R]"
    with pytest.raises(PlanError):
        par(f, mesh(tp=2), in_specs=("[S(2)]", None)).plan(w, x)


def test_state_outputs_are_tied_to_their_inputs():
    from graphc.models import mlp

    (params, x, labels), kw = mlp.example_train_args(batch=64, sizes=(32, 64, 10))
    plan = par(mlp.train_step, mesh(dp=2, tp=2), static_argnames=("lr",)).plan(params, x, labels, **kw)
    n = len(plan.outputs) - 1  # (new params..., loss)
    assert [d.spec for d in plan.inputs[:n]] == [d.spec for d in plan.outputs[:n]]


@pytest.mark.slow
def test_plan_document_round_trips_and_is_deterministic(tmp_path):
    fn, (args, kw) = _gpt_train(d=64, seq=16)
    p1, g1 = par(fn, mesh(dp=2, tp=2), static_argnames=("n_head", "lr")).plan_and_graph(*args, **kw)
    p2 = par(fn, mesh(dp=2, tp=2), static_argnames=("n_head", "lr")).plan(*args, **kw)

    def strip(plan):
        doc = json.loads(plan.to_json())
        doc.pop("timing", None)
        for k in ("seconds", "build_s"):
            doc["solver"].pop(k, None)
        return doc

    assert strip(p1) == strip(p2)
    doc = json.loads(p1.to_json())
    for key in ("version", "mesh", "nodes", "collectives", "cost", "memory", "solver"):
        assert key in doc
    for c in doc["collectives"]:
        assert {"kind", "axes", "bytes", "part"} <= set(c)
    assert len(doc["memory"]["peak_bytes"]) == 4 and "limit_bytes" in doc["memory"]
    assert {"compute_s", "comm_s", "total_s"} <= set(doc["cost"])
    assert doc["cost"]["total_s"] == pytest.approx(doc["cost"]["compute_s"] + doc["cost"]["comm_s"])
    path = tmp_path / "plan.json"
    p1.save(str(path))
    back = ShardingPlan.load(str(path))
    assert back == p1 and back.to_json() == p1.to_json()
    back.check(g1)
    other = optimized(lambda x: x * 2, np.zeros(3, np.float32))
    with pytest.raises(PlanError, match="stale plan"):
        back.check(other)
    text = p1.summary()
    assert "predicted step" in text and "memory per device" in text
    name = max(p1.nodes, key=lambda n: n.compute_s).name
    why = p1.explain(name)
    assert "instead" in why or "no alternative" in why


def test_hand_edited_plan_is_resolved_around_its_pins():
    def f(w, x):
        return np.tanh(x @ w)

    w = np.zeros((64, 64), np.float32)
    x = np.zeros((64, 64), np.float32)
    pf = par(f, mesh(tp=2))
    plan = pf.plan(w, x)
    doc = json.loads(plan.to_json())
    mm = next(n for n in doc["nodes"] if n["op"] == "matmul")
    alt = next(a for a in mm["alternatives"])
    mm["strategy"] = alt["strategy"]
    mm["pinned"] = True
    edited = ShardingPlan.from_json(json.dumps(doc))
    assert pf.follow(edited, w, x) == 1
    again = pf.plan(w, x)
    got = next(n for n in again.nodes if n.op == "matmul")
    assert got.strategy == alt["strategy"] and got.pinned
    assert again.cost.total_s >= plan.cost.total_s - 1e-12


def test_slow_link_changes_the_choice():
    from graphc.models import mlp

    (params, x, labels), kw = mlp.example_train_args(batch=256, sizes=(256, 256, 10))
    fast = Mesh({"dp": 4}, profile=PROFILE, links={"dp": Link(1e-6, 1e12)})
    slow = Mesh({"dp": 4}, profile=PROFILE, links={"dp": Link(1e-3, 1e6)})
    t_fast = par(mlp.train_step, fast, static_argnames=("lr",)).plan(params, x, labels, **kw)
    t_slow = par(mlp.train_step, slow, static_argnames=("lr",)).plan(params, x, labels, **kw)
    assert len(t_fast.collectives) > 0
    assert t_slow.cost.comm_s <= t_fast.cost.comm_s * 1e6  # sanity
    assert len([c for c in t_slow.collectives if c.kind != "slice"]) <= len(
        [c for c in t_fast.collectives if c.kind != "slice"]
    )


@pytest.mark.slow
def test_shrinking_ties_repeated_layers():
    fn, (args, kw) = _gpt_train(d=64, seq=16, n_layer=4)
    g = graphc.parallelize(fn, mesh=mesh(tp=2), static_argnames=("n_head", "lr"), cache=False).trace_optimized(
        *args, **kw
    )[1]
    p = build_problem(g, mesh(tp=2))
    from graphc.passes.sharding.groups import shrink_groups

    groups, _of = shrink_groups(p)
    assert len(groups) < len(p.items) / 2.5  # four blocks tied into one
    unshrunk = solve_problem(p, PlanOptions(shrink=False))
    shrunk = solve_problem(p, PlanOptions(shrink=True))
    assert shrunk.objective >= unshrunk.objective - 1e-12
    assert shrunk.objective <= unshrunk.objective * 1.01  # tying loses little here


def test_no_rule_is_replicated_with_a_warning():
    def f(x):
        return graphc.while_loop(lambda c: c.sum() < 10, lambda c: (c * 2,), (x,))[0]

    plan = par(f, mesh(x=2)).plan(np.ones(4, np.float32))
    assert any("no sharding rule" in w for w in plan.warnings)
    loop = next(n for n in plan.nodes if n.op == "while_loop")
    assert loop.strategy == "replicate" and loop.warning


def _promoting_blocks(n_layer, seed=0):
    """A residual stack fed float64 input (numpy's default) with float32 weights: NEP 50 makes
    the first block's matmuls mixed and every later block's float64 throughout."""

    def block(x, p):
        h = x * p["g"] / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
        return x + np.maximum(h @ p["w1"], 0.0) @ p["w2"]

    def loss(params, x):
        for p in params:
            x = block(x, p)
        return (x * x).mean()

    def step(params, x):
        value, grads = graphc.value_and_grad(loss)(params, x)
        return [{k: p[k] - 0.1 * gp[k] for k in p} for p, gp in zip(params, grads)], value

    rng = np.random.default_rng(seed)
    params = [
        {
            "w1": rng.standard_normal((24, 40)).astype(np.float32),
            "w2": rng.standard_normal((40, 24)).astype(np.float32),
            "g": np.ones(24, np.float32),
        }
        for _ in range(n_layer)
    ]
    return step, (params, rng.standard_normal((6, 5, 24)))


@pytest.mark.parametrize("axes", [{"dp": 2, "tp": 2}, {"tp": 4}])
def test_tied_groups_do_not_grow_with_depth_when_promotion_changes_the_first_block(axes):
    from graphc.passes.sharding.groups import shrink_groups

    counts = []
    for n_layer in (10, 20):
        step, args = _promoting_blocks(n_layer)
        graph = graphc.parallelize(step, mesh=axes, cache=False).trace_optimized(*args)[1]
        dtypes = {str(n.outputs[0].type.dtype) for n in graph.nodes if n.op.name == "matmul"}
        assert dtypes == {"float64"}  # float64 @ float32 promotes (NEP 50)
        problem = build_problem(graph, mesh(**axes), PlanOptions(zero=0), ties=state_ties(graph))
        counts.append(len(shrink_groups(problem)[0]))
    assert counts[1] == counts[0], counts


def test_a_pin_no_input_strategy_has_is_refused_naming_the_input():
    """An input pinned to a spec it cannot take (3 rows on 2 devices) is refused with its text-IR
    name; the names are made only for that message (building a problem does not walk the graph
    for them otherwise)."""
    from graphc.passes.sharding.problem import Pins

    def f(rows, w):
        return rows @ w

    g = graphc.trace(f, np.ones((3, 4), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(PlanError, match=r"input %rows: pinned spec \[S\(0\)\] is not a valid even placement"):
        build_problem(g, mesh(tp=2), pins=Pins(inputs={0: "S(0)"}))
    p = build_problem(g, mesh(tp=2), pins=Pins(inputs={1: "S(0)"}))
    assert p.items[1].pinned == "[S(0)]"
