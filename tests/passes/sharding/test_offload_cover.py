"""Cover rows of the offload columns (passes/sharding/offload_terms.py, "Cover rows"): each memory
row whose smallest bytes leave a deficit brings rows that every plan meeting it satisfies, so
they hold for random plans that fit, change no optimum, and raise the LP relaxation's bound. And
probing (passes/sharding/milp.py ``probed``): a binary whose LP at 1 costs more than the start is
fixed at 0, which changes no optimum either."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from graphc.passes.partition import build_problem, solve_problem, state_ties
from graphc.passes.sharding import milp, offload_terms
from graphc.passes.sharding.memrows import MemoryRows, add_lp_rows, smallest_bytes
from graphc.passes.sharding.milp import LpRelaxation, Milp, probed, solve_milp
from tests.passes.sharding.test_memrows import _cases, _solve, offloading_model


@pytest.fixture(scope="module")
def case():
    return _cases()[4]  # the MLP on h100-sxm, dp=2: below its smallest peak without offload, it offloads


def _plan(model, gchoice: list[int], moved: np.ndarray) -> np.ndarray:
    """The columns of the plan choosing ``gchoice`` per group and offloading the candidates and
    stashes whose binary columns are ``moved``."""
    z = model.point(gchoice)
    z[moved] = 1.0
    for g, o, w in model.offload.shares():
        z[w[gchoice[g]]] = z[o]
    if model.offload.u is not None:
        z[model.offload.u] = float(z[model.offload.o].max(initial=0.0))
    return z


def _smallest_at(model, at: int, rng) -> list[int]:
    """Per group, a strategy with the fewest bytes at position ``at`` (a random one where it counts none)."""
    _const, coef = model.memory_expr(at)
    out = [int(rng.integers(g.size)) for g in model.groups]
    for g in {g for g, _s in coef}:
        out[g] = int(np.argmin([coef.get((g, s), 0.0) for s in range(model.groups[g].size)]))
    return out


@pytest.mark.parametrize("offload", [True, "activations"])
def test_a_memory_rows_cover_rows_hold_for_every_plan_that_meets_it(case, offload):
    """Plans with each group at its fewest bytes at a position (so the deficit is exactly what the
    plan's offload takes off there: the cover rows are tight), offloading one to three random
    candidates or stashes, and random plans: a memory row at that position with the plan's own
    bytes as its room brings cover rows exactly when even the fewest bytes exceed the room, and
    the plan meets every one of them."""
    _problem, model = offloading_model(case, offload)
    rows = MemoryRows(model)
    off = np.concatenate([model.offload.o, model.offload.a]).astype(np.int64)
    rng = np.random.default_rng(3)
    brought = 0
    for trial in range(80):
        at = int(rng.integers(rows.size))
        gchoice = _smallest_at(model, at, rng) if trial % 4 else [int(rng.integers(g.size)) for g in model.groups]
        z = _plan(model, gchoice, rng.choice(off, size=1 + trial % 3, replace=False))
        room = float(rows.profile(z)[at])
        before = model.milp.num_rows
        model.add_memory_point(at, room)  # the plan meets the row, exactly
        new = set(range(before, model.milp.num_rows))
        assert not new & set(model.milp.broken_rows(z).tolist())
        const, idx, nb = rows.row(at)
        deficit = smallest_bytes(model, const, idx, nb) - room
        if deficit / 2**20 <= offload_terms.TOLERANCE_MIB:  # no deficit: the memory row alone
            assert len(new) == 1
        brought += len(new) > 1
    assert brought >= 20


@pytest.mark.parametrize("share", [0.45, 0.3])
def test_the_optimum_is_the_same_with_and_without_cover_rows_and_probing(case, share, monkeypatch):
    """Below the smallest peak without offload the solver offloads; with the cover rows and
    probing it finds the optimum it finds without them (within REL_GAP), and the LP relaxation
    with the first memory rows and their cover rows bounds at least as high."""
    graph, mesh, options = case
    free = build_problem(graph, mesh, dataclasses.replace(options, memory_limit=None), ties=state_ties(graph))
    unlimited = free.memory.peak(solve_problem(free, dataclasses.replace(options, memory_limit=None)).choice)[0]
    limited = dataclasses.replace(options, memory_limit=int(share * unlimited))
    solutions, bounds, probes = [], [], []
    original = milp.probed

    def counted(*a, **k):
        probes.append(1)
        return original(*a, **k)

    for on in (False, True):
        monkeypatch.setattr(offload_terms, "COVER", on)
        monkeypatch.setattr(milp, "probed", counted if on else lambda *a, **k: None)
        problem = build_problem(graph, mesh, limited, ties=state_ties(graph))
        solutions.append((problem, _solve(problem, limited, True, monkeypatch)))
        _p, model = offloading_model((graph, mesh, limited), True)
        add_lp_rows(model, limited.memory_limit, 60.0, [])
        x = LpRelaxation(model.milp).solve(60.0)
        assert x is not None
        bounds.append(float(model.milp.cost @ x))
    (_p0, without), (problem, with_both) = solutions
    assert without.offload and with_both.offload and without.status == with_both.status == "optimal"
    assert with_both.objective == pytest.approx(without.objective, rel=2e-4)  # both within REL_GAP
    assert problem.memory.peak(with_both.choice)[0] <= limited.memory_limit
    assert bounds[1] >= bounds[0] - 1e-6
    assert probes  # the offload solves from a start probed their binaries


def _choose_one(costs) -> Milp:
    """min costs . x, x binary, sum x >= 1."""
    m = Milp()
    xs = m.add_vars(costs, integer=True)
    m.add_row(xs, np.ones(len(xs)), 1.0, np.inf)
    m.probe = xs
    return m


def test_probing_fixes_exactly_the_binaries_whose_lp_at_1_costs_more_than_the_start():
    m = _choose_one([3.0, 1.0, 2.0, 10.0])
    start = np.array([0.0, 0.0, 1.0, 0.0])  # cost 2: x1 (1) is cheaper, x0 (3) and x3 (10) are not
    np.testing.assert_array_equal(probed(m, start, 60.0), [0.0, 1.0, 1.0, 0.0])
    assert m.probe_values == pytest.approx({0: 3.0, 1: 1.0, 3: 10.0})  # each probed once, kept
    m.add_row([3], [1.0], -np.inf, 1.0)  # rows only grow: the values stay lower bounds
    # no time to probe: x2 (the first start's) is not fixed, x0 and x3 are by their values
    np.testing.assert_array_equal(probed(m, np.array([0.0, 1.0, 0.0, 0.0]), 0.0), [0.0, 1.0, 1.0, 0.0])
    assert probed(_choose_one([1.0, 1.0]), np.array([1.0, 0.0]), 60.0) is None  # a tie is not fixed
    res = solve_milp(m, start=start)  # the start is not the optimum: the solve still finds it
    assert res.status == "optimal" and res.objective == pytest.approx(1.0)
    np.testing.assert_array_equal(np.round(res.x), [0.0, 1.0, 0.0, 0.0])
