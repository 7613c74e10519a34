"""Optimizer-state offload as a choice of the fixed-mesh sharding ILP (passes/sharding/offload_terms.py):
on a GPU profile with a host tier, a limit that nothing fits without it makes the solver offload,
priced by passes/offload.py exactly as the block search prices it; a limit the plan fits keeps the
state on the device unless moving it is faster; a profile without a host tier never offloads; the
plan JSON and the explanations say what moved and why; and an offloading plan is never run."""

import dataclasses
import json

import pytest

import graphc
from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.profiles import HOST_TIERS, cluster_figures, get_profile, host_tier
from graphc.core.spec import R
from graphc.core.units import fmt_time
from graphc.models import gpt3
from graphc.passes import scale
from graphc.passes.offload import offload_costs
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, lower, solve_problem, state_ties
from graphc.passes.scale import Layout, layered_model
from graphc.passes.search import step_batch
from graphc.passes.sharding.offload_terms import candidates, record, use
from graphc.passes.sharding.plan import ShardingPlan
from tests.passes import offload_models
from tests.passes.offload_models import OFFLOAD_ONLY, gpt3_bf16_step, plan_one_device

H100 = get_profile("h100-sxm")
BATCH = offload_models.BATCH


@pytest.fixture(scope="module")
def graph():
    return gpt3_bf16_step()


@pytest.fixture(scope="module")
def free(graph):
    return plan_one_device(graph, H100, None)


@pytest.fixture(scope="module")
def everything(graph, free):
    """The plan under the peak every candidate offloaded leaves: it must offload them all."""
    problem, solution, _plan_free = free
    use(problem, tuple(candidates(problem)))
    floor = problem.memory.peak(solution.choice)[0]
    use(problem, ())
    return plan_one_device(graph, H100, floor)


def test_the_candidates_are_the_parameters_with_adam_state(free):
    problem = free[0]
    names = problem.graph.value_names()
    cands = candidates(problem)
    params = {names[problem.graph.inputs[c.param]] for c in cands}
    assert "params.blocks.0.qkv.w" in params and "params.wte" in params
    for c in cands:  # Adam's two moments per parameter; its update runs on the host
        assert sorted(names[problem.graph.inputs[k]].split(".")[1] for k in c.states) == ["m", "v"]
        assert c.update_items and all(problem.items[i].node.part != "backward" for i in c.update_items)
        assert problem.graph.inputs[c.param] not in c.values  # the parameter stays on the device


def test_a_profile_without_a_host_tier_never_offloads(graph, everything):
    """cpu-here, MachineProfile.default(): no candidates, no offload columns, and the limit the GPU
    plan met by offloading is out of reach."""
    limit = everything[2].memory.limit_bytes
    for profile in (get_profile("cpu-here"), MachineProfile.default()):
        assert host_tier(profile) is None
        problem = build_problem(graph, Mesh({"dp": 1}, profile=profile), PlanOptions(**OFFLOAD_ONLY))
        assert candidates(problem) == []
        with pytest.raises(PlanError, match="no plan fits"):
            plan_one_device(graph, profile, limit)


def test_a_loose_limit_keeps_the_state_on_the_device(graph, free):
    """Offloading costs time here (PCIe and host DRAM against HBM): only a limit makes it worth it."""
    problem, solution, plan = free
    assert plan.offload is None and solution.offload == ()
    assert plan.cost.offload_s == 0.0 and json.loads(plan.to_json())["offload"] is None
    loose = plan_one_device(graph, H100, plan.memory.peak_bytes[0])[2]
    assert loose.offload is None and loose.cost.total_s == pytest.approx(plan.cost.total_s, rel=1e-12)


def test_a_tight_limit_offloads_everything_priced_as_the_block_search_prices_it(graph, free, everything):
    problem, solution, plan = everything
    free_plan = free[2]
    off = plan.offload
    assert off is not None and off.reason == "fit"
    assert len(off.params) == len(candidates(problem)) and len(off.values) == 2 * len(off.params)
    assert plan.memory.peak_bytes[0] <= plan.memory.limit_bytes < off.kept_peak_bytes
    assert off.kept_peak_bytes == free_plan.memory.peak_bytes[0]  # one device: nothing else changed
    # the peak drops by the state, the update's values and the updated state (all live at the peak)
    assert free_plan.memory.peak_bytes[0] - plan.memory.peak_bytes[0] >= off.state_bytes
    # the block search's pricing of the same layout (one device, micro-batch 8, no ZeRO)
    model = layered_model(graph, step_batch(graph), H100)
    zero = scale.SegmentCost(0.0, 0.0, 0, 0, 0.0, None)
    segs = scale._Segments(zero, scale.SegmentCost(1e-3, off.backward_s / 4, 1, 1, 0.0, None), zero)
    lo = Layout(pp=1, dp=1, tp=1, micro_batch=BATCH, microbatches=1, zero=0, recompute="off", offload="optimizer")
    composed, why = scale.compose(model, segs, lo, H100, scale.cluster_figures(H100), None)
    assert why is None
    block = composed.offload
    # the block search splits what lies outside the layers (embedding, head, Adam's step count, the
    # dropout generator's state) into state and parameters by the layers' share; the ILP counts each
    # parameter's own: they differ by at most the held inputs that belong to no parameter
    owned = {k for c in candidates(problem) for k in (c.param, *c.states)}
    held = (*model.other_params, *model.other_state_inputs)
    loose = {problem.graph.inputs[k].name: problem.graph.inputs[k].type.nbytes for k in held if k not in owned}
    assert loose == {"opt_state.t": 4, "rng": 48}
    loose = sum(loose.values())
    assert abs(off.param_bytes - block.param_bytes) <= loose and abs(off.state_bytes - block.state_bytes) <= loose
    host = host_tier(H100)
    assert block == offload_costs(host, block.state_bytes, block.param_bytes, off.backward_s, 1.0)
    assert off.cost == offload_costs(host, off.state_bytes, off.param_bytes, off.backward_s, 1.0)
    assert off.overlap == cluster_figures(H100).dp_overlap == 1.0
    # the objective is exact: the free plan's, the device update out, the host's part in
    assert solution.objective == pytest.approx(free[1].objective + off.step_s, rel=1e-9)
    assert plan.cost.total_s == pytest.approx(solution.objective, rel=1e-9)
    assert plan.cost.offload_s == pytest.approx(off.cost.step_s, rel=1e-12)
    assert plan.cost.compute_s == pytest.approx(free_plan.cost.compute_s - off.device_update_s, rel=1e-9)


def test_a_limit_in_between_offloads_only_what_it_must(graph, free, everything):
    free_plan, all_plan = free[2], everything[2]
    limit = (free_plan.memory.peak_bytes[0] + all_plan.memory.peak_bytes[0]) // 2
    problem, solution, plan = plan_one_device(graph, H100, limit)
    off = plan.offload
    assert off is not None and 0 < len(off.params) < len(all_plan.offload.params)
    assert plan.memory.peak_bytes[0] <= limit < off.kept_peak_bytes
    assert free_plan.cost.total_s < plan.cost.total_s < all_plan.cost.total_s
    # every parameter it kept would fit no cheaper: dropping any offloaded one breaks the limit
    chosen = solution.offload
    for c in chosen:
        use(problem, tuple(x for x in chosen if x is not c))
        assert problem.memory.peak(solution.choice)[0] > limit
    use(problem, chosen)


def test_offload_is_chosen_without_a_limit_when_it_is_faster(graph, free, monkeypatch):
    """A host tier as fast as the device's memory makes the host's update cheaper than the
    device's: chosen with no limit at all, and said so."""
    fast = dataclasses.replace(HOST_TIERS["h100-sxm"], memory_bandwidth=1e18)
    fast = dataclasses.replace(fast, link=dataclasses.replace(fast.link, latency_s=1e-12, bandwidth=1e18))
    monkeypatch.setitem(HOST_TIERS, "h100-sxm", fast)
    problem, solution, plan = plan_one_device(graph, H100, None)
    off = plan.offload
    assert off is not None and off.reason == "faster" and len(off.params) == len(candidates(problem))
    assert plan.cost.total_s < free[2].cost.total_s
    assert "the step is shorter with the update on the host" in plan.summary()


def test_the_host_must_hold_what_moves(graph, everything, monkeypatch):
    small = dataclasses.replace(HOST_TIERS["h100-sxm"], memory_bytes=everything[2].offload.state_bytes / 2)
    monkeypatch.setitem(HOST_TIERS, "h100-sxm", small)
    with pytest.raises(PlanError, match="no plan fits"):
        plan_one_device(graph, H100, everything[2].memory.limit_bytes)


def test_the_plan_json_marks_the_offloaded_values_and_reads_back(everything):
    plan = everything[2]
    doc = json.loads(plan.to_json())
    marks = doc["offload"]
    assert marks["what"] == "optimizer state" and marks["reason"] == "fit"
    assert set(marks["values"]) >= {"opt_state.m.blocks.0.qkv.w", "opt_state.v.blocks.3.qkv.w"}
    assert not any(v.startswith("params.") for v in marks["values"])
    assert "params.blocks.0.qkv.w" in marks["params"]
    assert marks["step_s"] == pytest.approx(marks["d2h_exposed_s"] + marks["host_update_s"] + marks["h2d_s"])
    assert doc["cost"]["offload_s"] == pytest.approx(marks["step_s"])
    again = ShardingPlan.from_json(plan.to_json())
    assert again.offload == plan.offload and again == plan
    marks["state_bytes"] = "a lot"  # a hand-edited plan: the field is named
    with pytest.raises(PlanError, match=r"plan.json.offload.state_bytes: expected float"):
        ShardingPlan.from_json(json.dumps(doc), "plan.json")
    del marks["reason"]
    with pytest.raises(PlanError, match="plan.json: not a complete graphc plan"):
        ShardingPlan.from_json(json.dumps(doc), "plan.json")


def test_the_summary_and_explain_say_what_moved_and_why(everything):
    plan = everything[2]
    text = plan.summary()
    assert "offloaded to host memory: the optimizer state of" in text
    c = plan.cost  # the headline's terms add up to the step it states
    assert c.offload_s > 0 and c.total_s == pytest.approx(c.compute_s + c.comm_s + c.offload_s)
    headline = f"predicted step {fmt_time(c.total_s)} = compute {fmt_time(c.compute_s)} + communication "
    assert headline + f"{fmt_time(c.comm_s)} + offload {fmt_time(c.offload_s)} " in text
    assert "Adam on the CPU" in text and "over the limit" in text and "not run" in text
    moved = plan.explain("%opt_state.m.blocks.0.qkv.w")
    assert "in host memory (offloaded)" in moved and "over the limit" in moved
    assert "offloaded" not in plan.explain("%params.blocks.0.qkv.w")


def test_an_offloading_plan_is_never_run(graph, everything):
    with pytest.raises(PlanError, match="host memory.*not a plan to run"):
        lower(graph, everything[2])


def test_parallelize_plans_the_offload_and_refuses_to_run_it():
    """The API path: a step planned on a GPU profile under a limit only offloading meets is planned
    (``plan``), and calling it is a clear error, never a run that keeps the state on the device.
    (Two devices without ZeRO or recomputation: a one-device mesh runs like graphc.jit, unplanned.)"""
    args, kw = gpt3.example_train_args(batch=2, seq=8, d=32, n_layer=1)
    step = dict(static_argnames=("n_head", "lr"), cache=False, profile="h100-sxm", recompute="off", zero=0)
    free = graphc.parallelize(gpt3.train_step, mesh={"dp": 2}, **step).plan(*args, **kw)
    limit = int(0.8 * free.memory.peak_bytes[0])
    pf = graphc.parallelize(gpt3.train_step, mesh={"dp": 2}, memory_limit=limit, **step)
    plan = pf.plan(*args, **kw)
    assert plan.offload is not None and plan.offload.reason == "fit"
    assert max(plan.memory.peak_bytes) <= limit < plan.offload.kept_peak_bytes
    with pytest.raises(PlanError, match="host memory.*not a plan to run"):
        pf(*args, **kw)


def test_a_zero_shard_moves_and_updates_only_its_share():
    """ZeRO-1 on dp=2 splits every moment in two: offloading a parameter moves the device's half of
    its state, and the host updates half of the parameter (its gradient's half out, half back)."""
    args, kw = gpt3.example_train_args(batch=2, seq=8, d=32, n_layer=1)
    pf = graphc.parallelize(gpt3.train_step, mesh=Mesh({"dp": 2}, profile=H100), static_argnames=("n_head", "lr"))
    graph = pf.trace_optimized(*args, **kw)[1]
    options = PlanOptions(zero=1, recompute="off")
    problem = build_problem(graph, pf.mesh, options, ties=state_ties(graph))
    choice = solve_problem(problem, options).choice
    cands = tuple(candidates(problem))
    split = [
        c for c in cands if all(problem.items[i].strategies[choice[i]].out_specs[0] != (R,) for i in c.state_items)
    ]
    assert len(split) >= len(cands) // 2  # the moments ZeRO-1 splits along dp
    off = record(problem, choice, tuple(split), None)
    inputs = problem.graph.inputs
    assert off.state_bytes == sum(inputs[k].type.nbytes for c in split for k in c.states) / 2
    assert off.param_bytes == sum(inputs[c.param].type.nbytes for c in split) / 2
    assert off.cost == offload_costs(host_tier(H100), off.state_bytes, off.param_bytes, off.backward_s, 1.0)
