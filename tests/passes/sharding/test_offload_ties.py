"""Tied layers' optimizer-state candidates share one binary (passes/sharding/offload_terms.py,
"Tied layers"): the same parameter of identical layers, whose items shrink ties into one group,
moves to the host with the others or not at all. Against the model with a binary per candidate
(``TIE_LAYERS`` off): fewer columns, each binary shared by exactly one parameter's layers, the
same memory profile for every plan that moves whole tie classes, the same optimum when offloading
everything is faster; under a limit only offloading meets, a plan that fits and moves whole
classes; and no tie without shrinking."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profiles import get_profile
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, shrink, solve_problem, state_ties
from graphc.passes.sharding import ilp, offload_terms
from graphc.passes.sharding.memrows import MemoryRows
from tests.passes.offload_models import gpt3_tied_tp2_step
from tests.passes.sharding.test_offload_classes import _fast_host, _plan

A100 = get_profile("a100-sxm")


@pytest.fixture(scope="module")
def tied():
    """The 3-layer GPT-3 on tp=2 (tests/passes/offload_models.py; a100-sxm: a host tier)."""
    return gpt3_tied_tp2_step(), Mesh({"tp": 2}, profile=A100), PlanOptions(recompute="off")


def _model(case, tie: bool, monkeypatch, **options):
    graph, mesh, opts = case
    opts = dataclasses.replace(opts, **options)
    monkeypatch.setattr(offload_terms, "TIE_LAYERS", tie)
    problem = build_problem(graph, mesh, opts, ties=state_ties(graph))
    groups, of = shrink(problem, opts.shrink)
    vec, pair, maps = ilp.objective_terms(problem, groups, of)
    return problem, ilp._Model(problem, groups, of, vec, pair, maps, "highs", offload=True)


def _layerless(problem, c) -> str:
    """The candidate's parameter's name with its layer number taken out."""
    return re.sub(r"\.\d+(?=\.|$)", ".#", problem.graph.inputs[c.param].name)


def test_a_binary_is_shared_by_one_parameter_of_the_tied_layers(tied, monkeypatch):
    problem, model = _model(tied, True, monkeypatch)
    terms = model.offload
    by_binary: dict[int, set[str]] = {}
    layers: dict[int, int] = {}
    for c, o in zip(terms.cands, terms.o.tolist()):
        by_binary.setdefault(o, set()).add(_layerless(problem, c))
        layers[o] = layers.get(o, 0) + 1
    assert all(len(names) == 1 for names in by_binary.values())  # never two parameters
    assert max(layers.values()) == 3  # the three layers' copies of a parameter
    assert len(by_binary) < len(terms.cands)
    _p, each = _model(tied, False, monkeypatch)
    assert len(set(each.offload.o.tolist())) == len(each.offload.cands) == len(terms.cands)
    assert model.milp.n < each.milp.n
    _p, unshrunk = _model(tied, True, monkeypatch, shrink=False)  # a group per item: nothing is tied
    assert len(set(unshrunk.offload.o.tolist())) == len(unshrunk.offload.cands) > 0


def test_moving_whole_classes_keeps_every_plans_profile(tied, monkeypatch):
    _p, model = _model(tied, True, monkeypatch)
    _p, each = _model(tied, False, monkeypatch)
    rows, rows_each = MemoryRows(model), MemoryRows(each)
    binaries = sorted(set(model.offload.o.tolist()))
    rng = np.random.default_rng(0)
    for _ in range(20):
        gchoice = [int(rng.integers(g.size)) for g in model.groups]
        on = {o for o in binaries if rng.random() < 0.5}
        moved = {k for k, o in enumerate(model.offload.o.tolist()) if o in on}
        np.testing.assert_allclose(
            rows.profile(_plan(model, gchoice, moved)),
            rows_each.profile(_plan(each, gchoice, moved)),
            rtol=1e-12,
            atol=1e-6,
        )


def _solved(case, tie: bool, options: PlanOptions):
    graph, mesh, _opts = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(offload_terms, "TIE_LAYERS", tie)
        problem = build_problem(graph, mesh, options, ties=state_ties(graph))
        return problem, solve_problem(problem, options)


def _closed(problem, chosen) -> bool:
    """Whether the chosen candidates hold every layer's copy of their parameters."""
    names = {_layerless(problem, c) for c in chosen}
    every = offload_terms.candidates(problem)
    return {c.param for c in chosen} == {c.param for c in every if _layerless(problem, c) in names}


def test_the_optimum_is_kept_when_offloading_everything_is_faster(tied, monkeypatch):
    _fast_host(monkeypatch, A100.name)
    got = {tie: _solved(tied, tie, tied[2]) for tie in (False, True)}
    assert all(sol.status == "optimal" for _p, sol in got.values())
    assert len(got[True][1].offload) > 0
    assert got[True][1].objective == pytest.approx(got[False][1].objective, rel=1e-9)


def _smallest_peak(case) -> int:
    """The smallest peak of any plan keeping everything on the device (``PlanError.min_memory_bytes``)."""
    graph, mesh, opts = case
    problem = build_problem(graph, mesh, dataclasses.replace(opts, memory_limit=1), ties=state_ties(graph))
    groups, of = shrink(problem, opts.shrink)
    with pytest.raises(PlanError) as got:
        ilp.solve(problem, groups, of, 1, 60.0, "highs")
    assert got.value.min_memory_bytes is not None
    return int(got.value.min_memory_bytes)


def test_under_a_limit_tied_layers_move_together_and_fit(tied):
    """At 70% of the smallest peak without offload only offloading fits: the plan fits and
    offloads every layer's copy of each parameter it offloads. (Untied, this solve ran out of
    HiGHS's time limit; at 90% both were optimal and the tied plan 0.24% slower.)"""
    opts = dataclasses.replace(tied[2], memory_limit=int(0.7 * _smallest_peak(tied)))
    problem, sol = _solved(tied, True, opts)
    assert sol.status == "optimal" and len(sol.offload) > 0
    assert problem.memory.peak(sol.choice)[0] <= opts.memory_limit
    assert _closed(problem, sol.offload)
