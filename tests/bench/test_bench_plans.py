"""``graphc bench plans``: the machinery on a tiny configuration (no timing assertions)."""

from __future__ import annotations

import math

import pytest

from graphc.bench import plans
from graphc.core.profile import MachineProfile


@pytest.mark.long  # 24 s loaded: eight plans built, run twice each and measured (the pieces have quick tests below)
def test_bench_plans_tiny_structure():
    profile = MachineProfile.default()
    result = plans.bench_plans(
        cases=plans.tiny_cases(),
        meshes=("dp=2", "dp=2,tp=2"),
        variants=("solver's choice", "data parallel"),
        repeat=2,
        profile=profile,
    )
    rows = [r for r in result.rows if r.error is None]
    assert {r.model for r in rows} == {"mlp", "gpt"}
    assert {r.mesh for r in rows} <= {"dp=2", "dp=2,tp=2"}
    for r in rows:
        assert len(r.times) == 2 and all(t > 0 for t in r.times)
        assert r.predicted_s > 0 and r.peak_predicted > 0 and r.peak_measured > 0
        assert math.isfinite(r.memory_error)
    # plans equal to one already built on the same mesh are left out
    keys = [(r.model, r.mesh, plans._plan_key(r.compiled)) for r in rows]
    assert len(keys) == len(set(keys))
    assert set(result.rhos) == {"overall", "mlp", "gpt"}
    assert list(result.ablation) == list(plans.ablations(profile))
    for rhos in result.ablation.values():
        assert set(rhos) == set(result.rhos)
    text = plans.report(result)
    assert "Spearman rank correlation" in text and "peak memory per device" in text
    assert "matmul table" in text


def test_reprice_with_the_same_profile_gives_the_plan_cost():
    profile = MachineProfile.default()
    (row,) = plans.build_plans(plans.tiny_cases()[:1], meshes=("dp=2",), variants=("solver's choice",), profile=profile)
    assert math.isclose(plans.reprice(row, profile), row.predicted_s, rel_tol=1e-9)


def test_plan_pins_data_parallel_replicates_the_state():
    case = plans.tiny_cases()[1]  # gpt: params, optimizer state, tokens, targets
    from graphc.api.parallel import parallelize
    from graphc.core.mesh import Mesh

    mesh = Mesh("dp=2", profile=MachineProfile.default())
    graph = parallelize(case.fn, mesh=mesh, static_argnames=case.static).trace_optimized(*case.args, **case.kwargs)[1]
    ins, nodes = plans.plan_pins(graph, mesh, "data parallel")
    assert not nodes and len(ins) == len(graph.inputs)
    split = [k for k, spec in ins.items() if str(spec[0]) != "R"]
    assert split == [len(graph.inputs) - 2, len(graph.inputs) - 1]  # tokens and targets
