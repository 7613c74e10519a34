"""One offload column per class of equal strategies (passes/sharding/offload_terms.py
``OffloadTerms._shares``): a group's strategies whose coefficients are equal in every sum a
candidate's product columns enter share one ``w`` column. Against the model with a column per
strategy (``SHARE_CLASSES`` off), on a mesh whose groups have such strategies: fewer columns, the
same memory profile for every plan, the same LP relaxation optimum and the same integer optimum,
both when offloading is faster (no limit) and when only offloading fits (a limit)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphc.core.mesh import Mesh
from graphc.core.profiles import HOST_TIERS, get_profile
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, shrink, solve_problem, state_ties
from graphc.passes.sharding import ilp, offload_terms
from graphc.passes.sharding.memrows import MemoryRows
from graphc.passes.sharding.milp import LpRelaxation
from tests.passes.offload_models import gpt3_tied_tp2_step
from tests.passes.sharding.test_memrows import _cases

A100 = get_profile("a100-sxm")


@pytest.fixture(scope="module")
def tied():
    """The 3-layer GPT-3 on tp=2 (tests/passes/offload_models.py; a100-sxm: a host tier)."""
    return gpt3_tied_tp2_step(), Mesh({"tp": 2}, profile=A100), PlanOptions(recompute="off")


@pytest.fixture(scope="module")
def limited():
    """The MLP on h100-sxm, dp=2 (test_memrows.py) at 40% of its peak without a limit: only
    offloading fits (test_offload_cover.py)."""
    graph, mesh, options = _cases()[4]
    free = build_problem(graph, mesh, dataclasses.replace(options, memory_limit=None), ties=state_ties(graph))
    unlimited = free.memory.peak(solve_problem(free, dataclasses.replace(options, memory_limit=None)).choice)[0]
    return graph, mesh, dataclasses.replace(options, memory_limit=int(0.4 * unlimited))


def _fast_host(monkeypatch, name):
    """A host so fast that offloading every candidate's state is faster (test_offload_screen.py)."""
    fast = dataclasses.replace(HOST_TIERS[name], memory_bandwidth=1e18)
    fast = dataclasses.replace(fast, link=dataclasses.replace(fast.link, latency_s=1e-12, bandwidth=1e18))
    monkeypatch.setitem(HOST_TIERS, name, fast)


def _model(case, share: bool, monkeypatch, offload=True):
    graph, mesh, options = case
    monkeypatch.setattr(offload_terms, "SHARE_CLASSES", share)
    problem = build_problem(graph, mesh, options, ties=state_ties(graph))
    groups, of = shrink(problem, options.shrink)
    vec, pair, maps = ilp.objective_terms(problem, groups, of)
    return problem, ilp._Model(problem, groups, of, vec, pair, maps, "highs", offload=offload)


def _lp_optimum(model) -> float:
    lp = LpRelaxation(model.milp)
    assert lp.solve(60.0) is not None
    return float(lp.h.getInfo().objective_function_value) + model.milp.offset


def _plan(model, gchoice, moved) -> np.ndarray:
    """The columns of the plan choosing ``gchoice`` and offloading the candidates ``moved``."""
    z = model.point(gchoice)
    for k in moved:
        z[model.offload.o[k]] = 1.0
    for g, o, w in model.offload.shares():
        if z[o]:
            z[w[gchoice[g]]] = 1.0
    return z


@pytest.mark.parametrize("case", ["tied", "limited"])
def test_classes_keep_the_profile_and_the_relaxation_with_fewer_columns(case, request, monkeypatch):
    c = request.getfixturevalue(case)
    _p, each = _model(c, False, monkeypatch)
    _p, shared = _model(c, True, monkeypatch)
    n = len(each.offload.cands)
    assert n == len(shared.offload.cands) > 0
    assert shared.milp.n < each.milp.n  # some group has strategies with equal coefficients
    assert sum(len(set(w)) < len(w) for _g, _o, w in shared.offload.shares()) > 0
    rows_each, rows_shared = MemoryRows(each), MemoryRows(shared)
    rng = np.random.default_rng(0)
    for _ in range(20):  # a plan's memory under either model is the same
        gchoice = [int(rng.integers(g.size)) for g in each.groups]
        moved = np.flatnonzero(rng.random(n) < 0.5)
        np.testing.assert_allclose(
            rows_shared.profile(_plan(shared, gchoice, moved)),
            rows_each.profile(_plan(each, gchoice, moved)),
            rtol=1e-12,
            atol=1e-9,
        )
    assert _lp_optimum(shared) == pytest.approx(_lp_optimum(each), rel=1e-9)


def _solved_both_ways(case):
    """``case`` (graph, mesh, options) solved with the class columns off and on: {share: (problem, solution)}."""
    graph, mesh, options = case
    got = {}
    for share in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(offload_terms, "SHARE_CLASSES", share)
            problem = build_problem(graph, mesh, options, ties=state_ties(graph))
            got[share] = problem, solve_problem(problem, options)
    return got


def test_classes_keep_the_optimum_when_offloading_is_faster(tied, monkeypatch):
    _fast_host(monkeypatch, A100.name)
    got = _solved_both_ways(tied)
    assert all(sol.status == "optimal" for _p, sol in got.values())
    assert len(got[True][1].offload) > 0  # the fast host's offload is chosen
    assert got[True][1].objective == pytest.approx(got[False][1].objective, rel=1e-9)


def test_classes_keep_the_optimum_when_only_offloading_fits(limited, monkeypatch):
    got = _solved_both_ways(limited)
    for problem, sol in got.values():
        assert sol.status == "optimal"
        assert problem.memory.peak(sol.choice)[0] <= limited[2].memory_limit
    assert len(got[True][1].offload) > 0  # only offloading fits
    assert got[True][1].objective == pytest.approx(got[False][1].objective, rel=1e-9)


def test_candidates_of_repeated_layers_share_their_classes_exactly(tied, monkeypatch):
    """``OffloadTerms._classes_of`` makes a group's classes and rows once per terms' values: the
    program (every column, row and coefficient) is the one each candidate making its own gives."""
    _p, cached = _model(tied, True, monkeypatch)
    assert 0 < len(cached.offload._classes) < sum(1 for _ in cached.offload.shares())  # repeated layers hit it
    real = offload_terms.OffloadTerms._classes_of

    def forgetful(self, *args):
        self._classes.clear()
        return real(self, *args)

    monkeypatch.setattr(offload_terms.OffloadTerms, "_classes_of", forgetful)
    _p, alone = _model(tied, True, monkeypatch)
    assert cached.milp.n == alone.milp.n
    np.testing.assert_array_equal(cached.milp.cost, alone.milp.cost)
    for a, b in zip(cached.milp.csr(), alone.milp.csr()):
        np.testing.assert_array_equal(a, b)
    assert list(cached.offload.shares()) == list(alone.offload.shares())
