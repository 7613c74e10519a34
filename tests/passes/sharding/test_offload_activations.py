"""Activation offload in the fixed-mesh sharding ILP (passes/sharding/offload_terms.py ``Stash``):
a forward value the backward reads may wait in host memory between its last forward use and its
first backward use. On a GPU profile, a limit that only moving activations as well as the
optimizer state meets is met that way; the copies are priced by passes/offload.py's overlap rule;
the memory rows the ILP solves equal the memory model's profile term for term; a profile without
a host tier never offloads; the plan JSON marks the moved values and reads back; such a plan is
never run."""

import json

import numpy as np
import pytest

from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.profiles import get_profile, host_tier
from graphc.core.traits import Constant
from graphc.passes.offload import activation_costs
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, lower, shrink, state_ties
from graphc.passes.sharding import ilp
from graphc.passes.sharding.memrows import MemoryRows
from graphc.passes.sharding.offload_terms import Stash, candidates, may_offload, stashes, use
from graphc.passes.sharding.plan import ShardingPlan
from tests.passes.offload_models import OFFLOAD_ONLY, gpt3_bf16_step, plan_one_device

H100 = get_profile("h100-sxm")


@pytest.fixture(scope="module")
def graph():
    return gpt3_bf16_step()


@pytest.fixture(scope="module")
def floors(graph):
    """The free plan, and the peaks under its choice with every state offloaded (``state``) and
    with every stash offloaded as well (``both``)."""
    problem, solution, plan = plan_one_device(graph, H100, None)
    use(problem, tuple(candidates(problem)))
    state = problem.memory.peak(solution.choice)[0]
    use(problem, (*candidates(problem), *stashes(problem)))
    both = problem.memory.peak(solution.choice)[0]
    use(problem, ())
    assert both < state < plan.memory.peak_bytes[0]
    return problem, solution, plan, state, both


@pytest.fixture(scope="module")
def moved(graph, floors):
    """The plan under a limit half way between the two floors: only moving activations meets it."""
    state, both = floors[3], floors[4]
    return plan_one_device(graph, H100, (state + both) // 2)


def test_the_stashes_are_forward_values_the_backward_reads(floors):
    problem = floors[0]
    pos = problem.memory.positions()
    found = stashes(problem)
    assert len(found) >= 4 * 4  # several per layer
    for st in found:
        node = problem.items[st.item].node
        assert node is not None and node.part == "forward" and st.item not in problem.remat
        assert not node.op.has(Constant)  # a program holds its constants all run
        readers = [pos[e.dst] for e in problem.edges if e.value == st.value]
        backward = [
            pos[e.dst]
            for e in problem.edges
            if e.value == st.value
            and problem.items[e.dst].node is not None
            and problem.items[e.dst].node.part == "backward"
        ]
        first, last = st.away
        assert backward and last == min(backward) - 1 and first <= last
        assert not any(first <= at <= last for at in readers)  # nobody reads it while it is away


def test_activation_offload_is_what_lets_the_plan_fit(graph, floors, moved):
    """Below the peak that offloading every optimizer state leaves, the plan fits only by moving
    stashed activations too; it moves some, not all, and the JSON marks them."""
    free, state, both = floors[2], floors[3], floors[4]
    problem, solution, plan = moved
    limit = plan.memory.limit_bytes
    off = plan.offload
    assert off is not None and off.reason == "fit" and off.activations is not None
    acts = off.activations
    assert plan.memory.peak_bytes[0] <= limit < state and off.kept_peak_bytes == free.memory.peak_bytes[0]
    assert 0 < len(acts.values) < len(stashes(problem))
    assert all(isinstance(c, Stash) for c in solution.offload if c not in candidates(problem))
    # priced by the overlap rule on the plan's own compute: forward and backward of the step
    forward = sum(n.compute_s for n in plan.nodes if n.part == "forward")
    backward = sum(n.compute_s for n in plan.nodes if n.part == "backward")
    rule = activation_costs(host_tier(H100).link, acts.value_bytes, forward, backward, values=acts.values)
    assert acts.values == rule.values and acts.transfers == len(acts.values)
    assert acts.out_s == pytest.approx(rule.out_s, rel=1e-12) and acts.forward_s == pytest.approx(forward, rel=1e-9)
    assert acts.exposed_s == pytest.approx(rule.exposed_s, rel=1e-9)
    assert acts.backward_s == pytest.approx(backward, rel=1e-9)
    # the objective is exact: the free plan's, plus the offload's part of the step
    assert solution.objective == pytest.approx(floors[1].objective + off.step_s, rel=1e-9)
    assert plan.cost.offload_s == pytest.approx(off.host_s, rel=1e-12)
    assert plan.cost.total_s == pytest.approx(solution.objective, rel=1e-9)
    # each moved value's bytes come off the device exactly while it is away
    assert both <= plan.memory.peak_bytes[0]
    doc = json.loads(plan.to_json())["offload"]
    assert doc["what"] == "optimizer state and activations"
    marks = doc["activations"]
    assert marks["values"] == list(acts.values) and len(marks["value_bytes"]) == len(acts.values)
    assert marks["bytes_per_device"] == pytest.approx(sum(marks["value_bytes"]))
    assert marks["hidden_s"] + marks["exposed_s"] == pytest.approx(marks["out_s"] + marks["back_s"])
    assert doc["step_s"] == pytest.approx(off.host_s) == pytest.approx(json.loads(plan.to_json())["cost"]["offload_s"])


def test_a_limit_the_state_alone_meets_moves_no_activation(graph, floors):
    """The stashes' columns enter only when moving the state fits nothing (``solve_offloading``)."""
    plan = plan_one_device(graph, H100, floors[3])[2]
    assert plan.offload is not None and plan.offload.activations is None and plan.offload.what == "optimizer state"


def test_the_plan_reads_back_and_explain_says_what_moved(moved):
    plan = moved[2]
    again = ShardingPlan.from_json(plan.to_json())
    assert again.offload == plan.offload and again == plan
    doc = json.loads(plan.to_json())
    doc["offload"]["activations"]["out_s"] = "slow"
    with pytest.raises(PlanError, match=r"plan.json.offload.activations: expected .*ActivationOffload"):
        ShardingPlan.from_json(json.dumps(doc), "plan.json")
    text = plan.summary()
    assert "stashed activation(s), between the forward and the backward" in text
    assert "beside the forward" in text and "exposed" in text and "over the limit" in text
    name = plan.offload.activations.values[0]
    text = plan.explain(name)
    assert "in host memory between its forward and backward uses" in text and "over the limit" in text


def test_an_activation_offloading_plan_is_never_run(graph, moved):
    with pytest.raises(PlanError, match="stashed activation.*host memory.*not a plan to run"):
        lower(graph, moved[2])


def test_a_profile_without_a_host_tier_never_offloads_activations(graph, moved):
    limit = moved[2].memory.limit_bytes
    for profile in (get_profile("cpu-here"), MachineProfile.default()):
        problem = build_problem(graph, Mesh({"dp": 1}, profile=profile), PlanOptions(**OFFLOAD_ONLY))
        assert stashes(problem) == [] and not may_offload(problem)
        with pytest.raises(PlanError, match="no plan fits"):
            plan_one_device(graph, profile, limit)


def test_the_memory_rows_are_the_memory_model_with_stashes_away(graph):
    """With the offload columns in (state and stashes), the rows the ILP bounds (memrows.py, and
    ``memory_expr`` + ``OffloadTerms.memory_terms`` per position) equal the memory model's profile
    with the chosen values away, for random choices of strategies and of what moves."""
    options = PlanOptions(memory_limit=10**9, **OFFLOAD_ONLY)
    problem = build_problem(graph, Mesh({"tp": 2}, profile=H100), options, ties=state_ties(graph))
    groups, of = shrink(problem, options.shrink)
    vec, pair, maps = ilp.objective_terms(problem, groups, of)
    model = ilp._Model(problem, groups, of, vec, pair, maps, "highs", offload="activations")
    terms = model.offload
    assert len(terms.stashes) and len(terms.cands)
    rows = MemoryRows(model)
    rng = np.random.default_rng(0)
    for _ in range(4):
        gchoice = [int(rng.integers(g.size)) for g in groups]
        choice = [0] * len(problem.items)
        for gi, g in enumerate(groups):
            for i, m in g.members:
                choice[i] = int(m[gchoice[gi]])
        moved = {
            o for o in sorted(set(terms.o.tolist())) if rng.random() < 0.5
        }  # tied layers' candidates move together
        cands = [c for c, o in zip(terms.cands, terms.o.tolist()) if o in moved]
        away = [st for st in terms.stashes if rng.random() < 0.5]
        x = model.point(gchoice)
        on = {int(terms.o[terms.cands.index(c)]) for c in cands} | {int(terms.a[terms.stashes.index(s)]) for s in away}
        for col in on:
            x[col] = 1.0
        for (g, o), cols in terms._shared.items():
            if o in on:
                x[cols[gchoice[g]]] = 1.0
        use(problem, (*cands, *away))
        want = problem.memory.profile(choice)
        use(problem, ())
        np.testing.assert_allclose(rows.profile(x), want, rtol=0, atol=1e-6)
        for at in rng.choice(rows.size, size=10, replace=False):
            const, coef = model.memory_expr(int(at))
            idx, mib = terms.memory_terms(int(at))
            got = const + sum(b * x[model.x[g][s]] for (g, s), b in coef.items())
            got += sum(v * model.MIB * x[c] for c, v in zip(idx, mib))
            assert got == pytest.approx(want[int(at)], abs=1e-3)
