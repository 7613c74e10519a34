"""The plain solve's screen of the optimizer-state offload (passes/sharding/offload_terms.py,
module doc "When"): ``_least_gain`` is a lower bound, over every plan, of what offloading a
candidate adds to the step (and the bound is met by some plan); the screened ILP (only the
candidates that could make the step shorter get columns) has the optimum of the ILP with every
candidate's columns and of the screen it replaced, without a memory limit, on the one-device GPT-3
of test_offload_ilp.py and the tied 3-layer GPT-3 of test_tied_rows.py; and a fast host still
passes it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphc.core.mesh import Mesh
from graphc.core.profiles import HOST_TIERS, get_profile, host_tier
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, shrink, state_ties
from graphc.passes.sharding import ilp
from graphc.passes.sharding.offload_terms import OffloadTerms, _param_bytes, _state_bytes, candidates
from tests.passes.offload_models import OFFLOAD_ONLY, gpt3_bf16_step, gpt3_tied_tp2_step

A100 = get_profile("a100-sxm")
H100 = get_profile("h100-sxm")


def _old_screen(self, cands):
    """The screen as it was: every candidate once one's host side at its cheapest (latency
    included) undercuts its device update at its dearest, strategies mixed."""
    p, host = self.p, host_tier(self.p.mesh.profile)

    def faster(c):
        pb = _param_bytes(p, c)
        state = sum(float(_state_bytes(p, c, i).min()) for i in c.state_items)
        least = host.link.latency_s + float(pb.min()) * (1 / host.link.bandwidth + 3 / host.memory_bandwidth)
        least += 2 * state / host.memory_bandwidth
        return least < sum(float(p.costs.compute_times(i).max()) for i in c.update_items)

    return cands if any(faster(c) for c in cands) else []


SCREENS = {"new": None, "old": _old_screen, "all": lambda self, cands: cands}


@pytest.fixture(scope="module")
def tied():
    """The 3-layer GPT-3 on tp=2 (tests/passes/offload_models.py; a100-sxm: a host tier)."""
    return gpt3_tied_tp2_step(), Mesh({"tp": 2}, profile=A100), PlanOptions(recompute="off")


@pytest.fixture(scope="module")
def one_device():
    """The GPT-3 step of test_offload_ilp.py on one h100-sxm."""
    return gpt3_bf16_step(), Mesh({"dp": 1}, profile=H100), PlanOptions(**OFFLOAD_ONLY)


def _solve(case, screen, monkeypatch):
    graph, mesh, options = case
    if SCREENS[screen] is not None:
        monkeypatch.setattr(OffloadTerms, "_may_be_faster", SCREENS[screen])
    problem = build_problem(graph, mesh, options, ties=state_ties(graph))
    groups, of = shrink(problem)
    kept: list[int] = []
    init = OffloadTerms.__init__

    def counting(self, model, priced=True, every=False):
        init(self, model, priced, every)
        kept.append(len(self.o))

    monkeypatch.setattr(OffloadTerms, "__init__", counting)
    sol = ilp.solve(problem, groups, of, None, 120.0, offload=False)
    monkeypatch.undo()
    return problem, sol, kept[-1]


def _fast_host(monkeypatch, name):
    fast = dataclasses.replace(HOST_TIERS[name], memory_bandwidth=1e18)
    fast = dataclasses.replace(fast, link=dataclasses.replace(fast.link, latency_s=1e-12, bandwidth=1e18))
    monkeypatch.setitem(HOST_TIERS, name, fast)


@pytest.mark.parametrize("case", ["tied", "one_device"])
@pytest.mark.parametrize("fast", [False, True])
def test_the_screen_keeps_the_optimum_of_every_candidates_columns(case, fast, request, monkeypatch):
    c = request.getfixturevalue(case)
    if fast:
        _fast_host(monkeypatch, c[1].profile.name)
    got = {}
    for screen in SCREENS:
        with pytest.MonkeyPatch.context() as mp:
            _p, sol, kept = _solve(c, screen, mp)
        assert sol.status == "optimal"
        got[screen] = (sol.objective, kept, len(sol.offload))
    problem = build_problem(c[0], c[1], c[2], ties=state_ties(c[0]))
    assert got["all"][1] == len(candidates(problem)) > 0
    for screen in ("new", "old"):
        assert got[screen][0] == pytest.approx(got["all"][0], rel=1e-9, abs=1e-15)
    if fast:  # the host is faster: every candidate passes and is offloaded
        assert got["new"][1] == got["new"][2] == len(candidates(problem))
    else:  # on the real host no candidate could be faster: no columns, nothing offloaded
        assert got["new"][1] == got["all"][2] == 0


def test_the_least_gain_bounds_every_plan_and_is_met(tied):
    """Per candidate, what offloading adds under a strategy per group (each item at the strategy
    its group's gives it) is never below ``_least_gain``, and equals it at the best combination."""
    graph, mesh, options = tied
    problem = build_problem(graph, mesh, options, ties=state_ties(graph))
    groups, of = shrink(problem)
    vec, pair, maps = ilp.objective_terms(problem, groups, of)
    model = ilp._Model(problem, groups, of, vec, pair, maps, "highs")
    host = host_tier(mesh.profile)
    dram = host.memory_bandwidth

    def gain(c, strategy):  # strategy: group -> its strategy
        def at(item):
            return int(model.maps[item][strategy.get(model.of[item], 0)])

        out = float(_param_bytes(problem, c)[at(c.state_items[0])]) * (1 / host.link.bandwidth + 3 / dram)
        out += sum(2 * float(_state_bytes(problem, c, i)[at(i)]) / dram for i in c.state_items)
        return out - sum(float(problem.costs.compute_times(i)[at(i)]) for i in c.update_items)

    cands = candidates(problem)
    rng = np.random.default_rng(0)
    for c in cands:
        least = model.offload._least_gain(c)
        touched = sorted({model.of[i] for i in (*c.state_items, *c.update_items) if model.x[model.of[i]] is not None})
        for _ in range(50):  # random plans never beat the bound
            assert gain(c, {g: int(rng.integers(len(model.x[g]))) for g in touched}) >= least - 1e-15
        # what offloading adds is a sum over groups: one sweep of the best strategy per group meets its least
        best = {g: 0 for g in touched}
        for g in touched:
            best[g] = min(range(len(model.x[g])), key=lambda s: gain(c, {**best, g: s}))
        assert gain(c, best) == pytest.approx(least, rel=1e-9, abs=1e-15)
